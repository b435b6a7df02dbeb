"""``procmem.tree_anon_mib``: what a process tree took (anonymous memory), from the kernel's
counters; not the file pages it maps, whose proportional share moves when another process
maps or unmaps the same file (the sleeper reads it before and after a sleep)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.gpu.procmem import process_memory, tree_anon_mib

# Maps a 64 MiB file and touches it, then (with "take") takes 48 MiB of its own; waits.
MAPPER = r"""
import mmap, sys, time
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
total = sum(m[i] for i in range(0, len(m), 4096))
if sys.argv[2] == "take":
    keep = bytearray(b"\1" * (48 << 20))
print("ready", flush=True)
time.sleep(60)
"""


def _start(path: Path, take: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", MAPPER, str(path), take],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.process
def test_a_tree_counts_what_it_took_not_the_file_pages_it_shares(tmp_path: Path) -> None:
    shared = tmp_path / "weights.bin"
    shared.write_bytes(b"\2" * (64 << 20))
    worker = _start(shared, "take")
    other = _start(shared, "none")
    try:
        anon_before = tree_anon_mib(worker.pid)
        pss_before = process_memory(worker.pid)
        other.kill()
        other.wait(5)
        anon_after = tree_anon_mib(worker.pid)
        pss_after = process_memory(worker.pid)
        assert anon_before is not None and anon_after is not None
        assert pss_before is not None and pss_after is not None
        assert anon_before >= 48  # what it took is counted
        assert pss_after.mib - pss_before.mib > 20  # its PSS moved by the file's share…
        assert abs(anon_after - anon_before) < 4  # …what it took did not
    finally:
        for proc in (worker, other):
            proc.kill()
            proc.wait(5)
    assert tree_anon_mib(worker.pid) is None  # gone
