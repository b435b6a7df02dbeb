"""``vramtui yield [GPU…] [--for DURATION] [--now]``: hand GPUs over to programs the engine
does not manage (a game, Blender) — nothing of ours starts there, running jobs finish (or
are cancelled with ``--now``), every model there is unloaded, queued jobs wait — until
``vramtui resume [GPU…]`` or the duration ends."""

from __future__ import annotations

import argparse
import getpass

from ..connect import open_client
from ..exits import Exit, UsageError


def _gpu(text: str) -> int:
    raw = text.strip().upper().removeprefix("GPU")
    if not raw.isdigit() or len(raw) > 6:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU: give its index (0, 1, …)")
    return int(raw)


def yield_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gpus", type=_gpu, nargs="*", metavar="GPU",
                   help="the GPUs' indexes (none: every GPU)")
    p.add_argument("--for", dest="duration", metavar="DURATION",
                   help="resume by itself after this long (30m, 1h30m; default: until resumed)")
    p.add_argument("--now", action="store_true",
                   help="cancel the jobs running there rather than let them finish")


def resume_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("gpus", type=_gpu, nargs="*", metavar="GPU",
                   help="the GPUs' indexes (none: every yielded GPU)")


def _who() -> str:
    try:
        return f"{getpass.getuser()} (cli)"
    except (KeyError, OSError):
        return "cli"


def yield_(args: argparse.Namespace) -> int:
    from supervisor.units import parse_duration
    from supervisor.validate import YIELD_MAX_S  # (not the engine's module: all the engine)

    for_s = None
    if args.duration is not None:
        try:
            for_s = parse_duration(args.duration, allow_infinite=True)  # (range: below)
        except ValueError as exc:
            raise UsageError(f"--for: {exc}") from None
        if not 0 < for_s <= YIELD_MAX_S:
            raise UsageError("--for: a yield lasts more than 0 s and at most a year (leave "
                             "--for out to yield until `vramtui resume`)")
    given = open_client(args).yield_gpus(args.gpus, for_s=for_s, now=args.now, by=_who())
    if args.json:
        from supervisor.doors.codec import yield_json

        from ..output import print_json

        print_json({"yielded": [yield_json(y) for y in given]})
        return Exit.OK
    for y in given:
        print(f"{y.text}: nothing of ours starts there; "
              + ("its jobs are cancelled" if args.now else "running jobs finish")
              + f", its models are unloaded (vramtui resume {y.gpu} takes it back)")
    return Exit.OK


def resume(args: argparse.Namespace) -> int:
    from supervisor.errors import NothingToDo

    try:
        back = open_client(args).resume_gpus(args.gpus)
    except NothingToDo as exc:  # not yielded: said as evict says a backend not loaded
        from ..output import nothing_to_do

        return nothing_to_do(str(exc), args.json, resumed=[])
    if args.json:
        from ..output import print_json

        print_json({"resumed": list(back)})
    else:
        print(", ".join(f"GPU{g}" for g in back) + " resumed: jobs run there again")
    return Exit.OK
