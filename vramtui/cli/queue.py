"""``vramtui queue``: the jobs waiting, in the order they will run (``--watch``: live); on the
simulated GPU a line says their figures are SIMULATED (``--json``: each job's ``simulated``)."""

from __future__ import annotations

import argparse

from ..connect import open_client
from .watch import add_watch_arguments, check_watch, compact, watching


def arguments(p: argparse.ArgumentParser) -> None:
    add_watch_arguments(p)


def run(args: argparse.Namespace) -> int:
    check_watch(args)  # bad usage is said before the engine is asked
    client = open_client(args)

    def show() -> None:
        snap = client.snapshot(data_limit=0, light=True)
        if args.json:
            from supervisor.doors.codec import backend_simulated

            from ..output import jsonable, print_json

            # each job labelled by its backend's figures, as backends --json labels each
            # backend (one codec: its declaration, or the device it runs on)
            backends = {b.name: b for b in snap.backends}
            print_json([{**jsonable(j), "simulated": backend_simulated(snap, b)
                         if (b := backends.get(j.backend)) is not None else snap.simulated}
                        for j in snap.queued], compact=compact(args))
            return
        from ..output import queue_table, show_simulated_note
        from ..plain import show

        if not snap.queued:
            show("the queue is empty")
        else:
            show_simulated_note(snap, {j.backend for j in snap.queued})  # the notes' figures
            show(queue_table(snap.queued, snap.taken_at))

    return watching(args, show)
