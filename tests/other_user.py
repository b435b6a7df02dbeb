"""Another local user, for the attacks a second account on the same machine can make.

The attacker is a real process running as uid 65534 (``nobody``), started with ``setpriv``
(needs root; tests that use it are skipped with the reason otherwise).  Its program is a
string of Python run by the system's interpreter with the standard library only, so nothing
of this checkout need be readable by that user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

OTHER_UID = 65534
SYSTEM_PYTHON = next((p for p in ("/usr/bin/python3", sys.executable) if Path(p).exists()),
                     sys.executable)

needs_other_user = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another local user")


def other_user_argv(code: str, *args: object) -> list[str]:
    return ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups",
            "--", SYSTEM_PYTHON, "-I", "-c", code, *map(str, args)]


def run_as_other_user(code: str, *args: object, timeout: float = 60
                      ) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as the other user to its end; its output as text."""
    return subprocess.run(other_user_argv(code, *args), capture_output=True, text=True,
                          timeout=timeout, cwd="/", stdin=subprocess.DEVNULL)


def start_as_other_user(code: str, *args: object) -> subprocess.Popen[str]:
    """Start ``code`` as the other user; it reads its stdin (the test closes it to end the
    attack) and writes lines to its stdout."""
    return subprocess.Popen(other_user_argv(code, *args), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd="/", start_new_session=True)
