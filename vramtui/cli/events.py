"""``vramtui events``: follow the engine's events as they happen, one line each (``--json``:
one JSON document each, with ``simulated``), until ctrl+c or the engine stops; on the
simulated GPU the first line says its figures are SIMULATED."""

from __future__ import annotations

import argparse
import sys

from ..connect import open_client
from ..exits import Exit


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", action="append", metavar="KIND",
                   choices=("log", "job", "worker", "chunk", "sample", "sleep"),
                   help="only these kinds (repeatable; default: log, job, worker, sleep)")


def run(args: argparse.Namespace) -> int:
    client = open_client(args)
    kinds = args.kind or ["log", "job", "worker", "sleep"]
    sub = client.subscribe(kinds=kinds, maxsize=10_000)
    from ..output import event_line, jsonable, show_simulated_note

    lagged = 0
    try:
        # The engine's devices do not change while it runs: read once whether its figures
        # (the GPU samples, what a sleep kept, ...) are simulated.
        snap = client.snapshot(data_limit=0, light=True)
        if not args.json:
            show_simulated_note(snap)
        for event in sub:
            if sub.dropped > lagged:
                print(f"vramtui: {sub.dropped - lagged} events dropped (this terminal fell "
                      "behind)", file=sys.stderr)
                lagged = sub.dropped
            if args.json:
                import json

                sys.stdout.write(json.dumps({**jsonable(event), "simulated": snap.simulated},
                                            default=str) + "\n")
            else:
                sys.stdout.write(event_line(event) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return Exit.OK
    finally:
        sub.close()
    print("vramtui: the engine stopped", file=sys.stderr)
    return Exit.NO_ENGINE
