"""``vramtui logs BACKEND``: the end of a backend's worker log (``-f``: and what follows)."""

from __future__ import annotations

import argparse
import sys
import time

from ..connect import open_client
from ..exits import Exit, UsageError


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("backend", help="the backend whose worker log to show (`vramtui backends` "
                                   "lists them)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("-n", "--lines", type=int, default=50, help="lines to show (default 50)")


def run(args: argparse.Namespace) -> int:
    from supervisor.control.logtail import MAX_LINES

    if not 0 <= args.lines <= MAX_LINES:
        raise UsageError(f"-n takes a number of lines between 0 and {MAX_LINES}, got "
                         f"{args.lines}")
    client = open_client(args)
    chunk = client.logs(args.backend, lines=args.lines)
    if args.json and not args.follow:
        from ..output import print_json

        print_json(chunk)
        return Exit.OK
    if chunk.missing and not args.follow:
        print(f"{args.backend} has no log yet ({chunk.path})", file=sys.stderr)
        return Exit.OK
    from .submit import write_out

    try:
        write_out(chunk.data)
        offset = chunk.offset
        while args.follow:
            time.sleep(0.25)  # tail -f: poll the file's growth through the engine
            chunk = client.logs(args.backend, offset=offset)
            if chunk.data:
                write_out(chunk.data)
            offset = chunk.offset
    except KeyboardInterrupt:
        if not args.follow:
            raise
        return Exit.OK  # how a follow ends, as events' and status --watch's do
    return Exit.OK
