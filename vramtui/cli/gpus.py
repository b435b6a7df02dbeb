"""``vramtui gpus``: the devices — each GPU, simulated GPU or the host device (host memory) —
with their memory and admission budget, and the processes on them (``--json``: as HTTP's
``/v1/gpus`` shows each, its ``kind`` saying which it is)."""

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
            from supervisor.doors.codec import gpu_json

            from ..output import print_json

            print_json([gpu_json(g, None) for g in snap.gpus], compact=compact(args))
            return
        from ..output import devices_kind, gpu_table, process_table
        from ..plain import show

        show(f"devices: {devices_kind(snap)}")
        show(gpu_table(snap))
        procs = process_table(snap)
        if procs is not None:
            show(procs)

    return watching(args, show)
