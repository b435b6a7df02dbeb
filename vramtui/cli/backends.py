"""The backends' commands: ``backends`` (the table, and which declare too little), the
worker actions ``evict``, ``respawn``, ``preload``, ``kill``, ``sleep`` and ``wake``, and
``zero``."""

from __future__ import annotations

import argparse

from ..connect import open_client
from ..exits import Exit
from ..peaks import over_declared_line, suggested_peak_mib


def run(args: argparse.Namespace) -> int:
    snap = open_client(args).snapshot(data_limit=0, light=True)
    if args.json:
        from supervisor.doors.codec import backend_simulated, memory_kind

        from ..output import jsonable, print_json

        # simulated and memory_kind: as HTTP says them (one codec)
        print_json([{**jsonable(b), "simulated": backend_simulated(snap, b),
                     "over_declared": b.over_declared,
                     "suggested_peak_mib": suggested_peak_mib(b),
                     "memory_kind": memory_kind(snap, b.gpu)} for b in snap.backends])
        return Exit.OK
    from ..output import backend_table, show_simulated_note
    from ..plain import show

    show_simulated_note(snap)
    show(backend_table(snap, wide=True))
    for backend in snap.backends:
        line = over_declared_line(backend)
        if line is not None:
            show(("over peak! ", "bold red"), line)
    return Exit.OK


def backend_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("backend", help="the backend's name (`vramtui backends` lists them)")


def _act(args: argparse.Namespace, verb: str, done: str) -> int:
    from supervisor.errors import NothingToDo

    client = open_client(args)
    if verb in ("sleep", "wake"):  # so already: the engine leaves it as it is; said here
        view = next((b for b in client.snapshot(data_limit=0, light=True).backends
                     if b.name == args.backend), None)
        if view is not None and view.pid is not None and (view.state == "asleep") == (
                verb == "sleep"):
            return _nothing_to_do(args, verb, f"{args.backend} is asleep already: nothing "
                                  "to put to sleep" if verb == "sleep" else f"{args.backend} is "
                                  f"not asleep (it is {view.state}): nothing to wake")
    try:
        getattr(client, verb)(args.backend)
    except NothingToDo as exc:  # not loaded: said as evict says it
        return _nothing_to_do(args, verb, str(exc))
    if args.json:
        from ..output import print_json

        print_json({"backend": args.backend, "action": verb, "ok": True})
    else:
        print(f"{args.backend}: {done}")
    return Exit.OK


def evict(args: argparse.Namespace) -> int:
    client = open_client(args)
    snap = client.snapshot(data_limit=0, light=True)
    view = next((b for b in snap.backends if b.name == args.backend), None)
    if view is not None and view.pid is None and view.state in ("cold", "failed"):
        return _nothing_to_do(args, "evict", f"{args.backend} is not loaded: nothing to evict")
    return _act(args, "evict", "evicting (its worker stops once idle)")


def _nothing_to_do(args: argparse.Namespace, verb: str, why: str) -> int:
    from ..output import nothing_to_do

    return nothing_to_do(why, args.json, backend=args.backend, action=verb, ok=True)


def respawn(args: argparse.Namespace) -> int:
    return _act(args, "respawn", "respawning")


def preload(args: argparse.Namespace) -> int:
    return _act(args, "preload", "preloading (its worker starts when it fits)")


def kill(args: argparse.Namespace) -> int:
    return _act(args, "kill", "killed its worker (its jobs fail)")


def sleep(args: argparse.Namespace) -> int:
    return _act(args, "sleep", "going to sleep (its GPU memory is given back; `vramtui wake "
                f"{args.backend}` or its next job wakes it)")


def wake(args: argparse.Namespace) -> int:
    return _act(args, "wake", "waking (once what it takes fits)")


def zero(args: argparse.Namespace) -> int:
    evicted = open_client(args).zero()
    if args.json:
        from ..output import print_json

        print_json({"evicted": evicted})
    elif evicted:
        print("evicting " + ", ".join(evicted))
    else:
        print("nothing to evict (no idle worker)")
    return Exit.OK


