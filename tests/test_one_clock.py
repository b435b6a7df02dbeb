"""The engine's process reads one monotonic clock, ``supervisor.clock.monotonic``.

``time.monotonic`` stops while the machine is suspended and ``CLOCK_BOOTTIME`` does not: a
time read from one, compared with or converted beside a time of the other, is off by every
suspend since boot (hours, on a desktop suspended at night). The whole suite also passed with
``supervisor.clock.monotonic`` moved 10^6 s from ``time.monotonic`` (see the commit that made
it), which a reading of the other clock anywhere it meets the engine's would have failed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from supervisor.clock import MONOTONIC, monotonic

ROOT = Path(__file__).resolve().parent.parent
# The lifeline's watcher runs as a bare script (no package to import): a local deadline.
BARE_SCRIPTS = {"supervisor/workers/lifeline.py"}
OTHER_CLOCK = re.compile(r"\btime\.monotonic\b(?!_ns)")


def test_no_module_of_the_engine_reads_another_monotonic_clock() -> None:
    found = []
    for path in sorted((ROOT / "supervisor").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "supervisor/clock.py" or rel in BARE_SCRIPTS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if OTHER_CLOCK.search(line.split("#", 1)[0]):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "read supervisor.clock.monotonic instead:\n" + "\n".join(found)


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="no CLOCK_BOOTTIME here")
def test_the_engines_clock_counts_a_suspend() -> None:
    """It is CLOCK_BOOTTIME (read between two readings of it), and the views' wall clock
    converts its readings to now."""
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    mine = monotonic()
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert before <= mine <= after
    assert abs(MONOTONIC.now() - time.time()) < 1.0
