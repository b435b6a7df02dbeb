"""A model server command that starts a helper in a session of its own (``setsid``), out of
reach of a signal to the server's process group, and that helper found in /proc: for the
checks that nothing a worker started outlives it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path


class Escaper:
    """``command`` runs ``server`` (a shell command line) after starting the helper with
    ``launcher`` (``setsid -f``: it forks, so the helper is out of the server's tree too)."""

    def __init__(self, server: str, launcher: str = "setsid") -> None:
        self.mark = f"vt-escaped-{os.getpid()}-{time.monotonic_ns()}"
        helper = f"{sys.executable} -c 'import time; time.sleep(600)' {self.mark}"
        self.command = ["bash", "-c", f"{launcher} {helper} & exec {server}"]

    def pids(self) -> set[int]:
        """The helper's live processes (a zombie is gone), once it runs (its launcher, an
        ``env -i`` that has not exec'd it yet, still has the environment it clears)."""
        found = set()
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if argv[0] != sys.executable.encode() or self.mark.encode() not in argv:
                    continue  # (not the helper yet: its launcher, which execs it)
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            if stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X"):
                found.add(int(entry))
        return found

    def kill_left(self) -> None:
        """Kill whatever of the helper is left (a failed check leaves nothing behind)."""
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
