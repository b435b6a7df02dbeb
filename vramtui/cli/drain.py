"""``vramtui drain GPU``: let a GPU's running work finish and admit nothing new there
(``--off``: admit work on it again)."""

from __future__ import annotations

import argparse

from ..connect import open_client
from ..exits import Exit


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gpu", type=int, metavar="GPU", help="the GPU's index")
    p.add_argument("--off", action="store_true", help="admit work on it again")


def run(args: argparse.Namespace) -> int:
    client = open_client(args)
    draining = client.drain(args.gpu, not args.off)
    if args.json:
        from ..output import print_json

        print_json({"gpu": args.gpu, "draining": list(draining)})
    elif args.off:
        from ..output import drain_ended_text

        yielded = any(g.index == args.gpu and g.yielded_by is not None
                      for g in client.snapshot(data_limit=0, light=True).gpus)
        print(drain_ended_text(args.gpu, yielded)
              + (f" (still draining: {', '.join(f'GPU{g}' for g in draining)})"
                 if draining else ""))
    else:
        print(f"GPU{args.gpu} is draining: its running work finishes, nothing new is "
              f"admitted there (vramtui drain {args.gpu} --off opens it again)")
    return Exit.OK
