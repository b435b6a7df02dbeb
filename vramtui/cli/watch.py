"""``--watch`` / ``-n``: show a table once, or again every few seconds until ctrl+c.

Shared by ``status``, ``queue``, ``gpus`` and ``jobs``: the two options (``-n`` alone implies
``--watch``, as ``watch -n`` does; :func:`check_watch`), and the loop that clears the screen
(on a terminal, without ``--json``) and shows the table again.
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
                   help="seconds between refreshes (default 2; alone, implies --watch)")


def check_watch(args: argparse.Namespace) -> None:
    """UsageError for an ``-n`` out of range; ``-n`` alone turns ``--watch`` on. Where the
    command lists items (``jobs``: ``--limit``), ``-n 3`` reads like "three of them": a line
    on stderr says what it does instead. Each command calls it before it reaches the engine;
    :func:`watching` again."""
    interval = getattr(args, "interval", None)
    if interval is None:
        return
    if not 0.1 <= interval <= 86400:
        raise UsageError("-n takes between 0.1 and 86400 seconds")
    if not getattr(args, "watch", False):
        args.watch = True
        if hasattr(args, "limit"):
            sys.stderr.write(f"vramtui: note: -n {interval:g} refreshes every {interval:g} s "
                             "(ctrl+c stops); `--limit N` shows N\n")


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
