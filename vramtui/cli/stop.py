"""``vramtui stop [--now]``: stop the engine this command attaches to, and wait until it is gone.

Running jobs finish first, each within its backend's stop grace (``--now``: they are
interrupted, and journaled ones run again when the engine starts); it prints what it waits
for, and exits once the engine's process has exited.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..connect import open_client
from ..exits import Exit

POLL_S = 0.1


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--now", action="store_true",
                   help="do not wait for running jobs: they are interrupted (journaled ones "
                        "run again when the engine starts)")


def run(args: argparse.Namespace) -> int:
    client = open_client(args)
    client.ping()  # the engine's hello names its pid
    pid = client.info.get("pid")
    waits = client.shutdown_engine(now=args.now)
    client.close()
    if args.json:
        from ..output import print_json

        print_json({"pid": pid, "now": args.now, "waiting_for": list(waits)}, compact=True)
    elif args.now:
        print(f"stopping the engine (pid {pid}) now: running jobs are interrupted")
    elif waits:
        print(f"stopping the engine (pid {pid}): waiting for {len(waits)} running job(s) to "
              f"finish ({', '.join(waits)}), each within its backend's stop grace "
              "(vramtui stop --now stops at once)")
    else:
        print(f"stopping the engine (pid {pid}): no job is running")
    try:
        _wait_gone(pid if isinstance(pid, int) else None, args)
    except KeyboardInterrupt:
        print("\nvramtui: the engine goes on stopping", file=sys.stderr)
        return Exit.INTERRUPTED
    if not args.json:
        print("the engine stopped")
    return Exit.OK


def _exited(pid: int) -> bool:
    """A process that has exited but that its parent has not reaped yet (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _wait_gone(pid: int | None, args: argparse.Namespace) -> None:
    """Until the engine's process has exited (or, with no pid to watch, stops answering)."""
    from supervisor.errors import VramtuiError

    while True:
        if pid is not None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            except PermissionError:
                pid = None  # another user's engine (shared with --allow-group): ask instead
            else:
                if _exited(pid):
                    return
        if pid is None:
            try:
                open_client(args).ping()
            except VramtuiError:
                return
        time.sleep(POLL_S)
