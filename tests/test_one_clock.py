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
from fake_worker import Script, fake_engine

from supervisor.clock import MONOTONIC, monotonic
from supervisor.jobs import JobState

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


def test_views_events_and_the_log_tell_one_time_whatever_the_system_clock_does() -> None:
    """Every time the engine tells comes from its clock (``WallClock``): a job's times, its
    backend's ``last_used``, the log's lines, each event and the snapshot's ``taken_at``.
    Here the system clock steps back an hour under a running engine (as a correction of it
    would; the engine's clock is monotonic and does not): a time read from ``time.time()``
    would be told an hour before the job that it follows."""
    skew = [0.0]
    script = Script(weights_mib=256, activation_mib=64, job_s=0.01)
    desc = {"vram": {"weights": "256MiB", "activation": "64MiB"}, "safety": "0MiB"}
    with fake_engine({"a": desc}, scripts={"a": script},
                     clock=lambda: monotonic() + skew[0]) as fe:
        skew[0] = 3600.0
        events = fe.sup.subscribe(kinds=("job", "log"))
        try:
            view = fe.sup.wait(fe.sup.submit("a", b"{}"), 10)
            assert view.state is JobState.SUCCEEDED and view.finished_at is not None
            snap = fe.sup.snapshot()
            told = []
            while (event := events.get(timeout=0)) is not None:
                told.append(event.t)
        finally:
            events.close()
    assert told and all(abs(t - view.finished_at) < 5.0 for t in told), (told, view)
    line = next(x for x in snap.log if view.id in x.text)
    assert abs(line.t - view.finished_at) < 1.0, (line, view.finished_at)
    last_used = snap.backend("a").last_used
    assert last_used is not None and abs(last_used - view.finished_at) < 1.0
    assert 0.0 <= snap.taken_at - view.finished_at < 5.0
