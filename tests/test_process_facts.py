"""What the engine says of a process it does not own: a process names itself, so its name is
made safe to print (the status table, the TUI and the event log show it to a terminal)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from waiting import wait_until

from supervisor.engine.process_facts import process_name

# A process that names itself "ESC[2J ESC]0;pwn BEL X" (clear the screen, set the window
# title), as any local user's may, then waits.
NAMER = r"""
import ctypes, sys, time
ctypes.CDLL(None).prctl(15, b"\x1b[2J\x1b]0;pwn\x07X", 0, 0, 0)  # PR_SET_NAME
print("named", flush=True)
time.sleep(60)
"""


@pytest.mark.process
def test_a_process_name_with_escape_sequences_is_shown_escaped() -> None:
    proc = subprocess.Popen([sys.executable, "-c", NAMER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "named\n"
        with open(f"/proc/{proc.pid}/comm", "rb") as f:
            assert f.read().startswith(b"\x1b[2J")  # the kernel's truth: it is named so
        name = wait_until(lambda: process_name(proc.pid), 5, "its name")
        assert name == "\\x1b[2J\\x1b]0;pwn\\x07X"
    finally:
        proc.kill()
        proc.wait(5)
