"""``--watch`` / ``-n``: show a table once, or again every few seconds until ctrl+c.

Shared by ``status``, ``queue``, ``gpus`` and ``jobs``: the two options (``-n`` only with
``--watch``: :func:`check_watch`), and the loop that clears the screen (on a terminal,
without ``--json``) and shows the table again.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from ..exits import Exit, UsageError


def add_watch_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--watch", "-w", action="store_true",
                   help="keep showing it, refreshed every -n seconds (ctrl+c stops)")
    p.add_argument("-n", "--interval", type=float, metavar="SECONDS", default=None,
                   help="with --watch: seconds between refreshes (default 2)")


def check_watch(args: argparse.Namespace) -> None:
    """UsageError for ``-n`` without ``--watch`` (it is no count: a user who writes ``jobs -n
    3`` wants three jobs, and would get a screen refreshed every 3 s) or out of range.  Each
    command calls it before it reaches the engine; :func:`watching` again."""
    interval = getattr(args, "interval", None)
    if interval is None:
        return
    if not getattr(args, "watch", False):
        count = "; `--limit N` caps how many are shown" if hasattr(args, "limit") else ""
        raise UsageError(f"-n is the refresh interval of --watch (`--watch -n {interval:g}`)"
                         f"{count}")
    if not 0.1 <= interval <= 86400:
        raise UsageError("-n takes between 0.1 and 86400 seconds")


def compact(args: argparse.Namespace) -> bool:
    """JSON on one line per refresh while watching (one document per line)."""
    return bool(args.watch)


def watching(args: argparse.Namespace, show: Callable[[], None]) -> int:
    """``show()`` once, or (``--watch``, its ``-n``) again every interval until ctrl+c."""
    check_watch(args)
    if not getattr(args, "watch", False):
        show()
        return Exit.OK
    interval = getattr(args, "interval", None)
    interval = 2.0 if interval is None else interval
    from .. import plain

    try:
        while True:
            if sys.stdout.isatty() and not args.json:
                sys.stdout.write("\x1b[H\x1b[2J")  # clear the screen, cursor home
                plain.show((f"every {interval:g} s · {time.strftime('%H:%M:%S')} · ctrl+c "
                            "stops", "dim"))
            show()
            time.sleep(interval)
    except KeyboardInterrupt:
        return Exit.OK
