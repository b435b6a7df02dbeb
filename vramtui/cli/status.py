"""``vramtui status``: the engine, its GPUs and backends at a glance (``--watch``: again and
again)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..connect import open_client
from ..exits import UsageError
from .watch import add_watch_arguments, check_watch, compact, watching

if TYPE_CHECKING:
    from supervisor.client import Client


def arguments(p: argparse.ArgumentParser) -> None:
    add_watch_arguments(p)
    p.add_argument("--history", action="store_true",
                   help="with --json: also the GPUs' memory history, the recent jobs and "
                        "the event log (left out by default: they are large)")


def run(args: argparse.Namespace) -> int:
    check_watch(args)  # bad usage is said before the engine is asked
    client = open_client(args)
    if args.history and not args.json:
        raise UsageError("--history goes with --json (the tables never show it)")
    return watching(args, lambda: _status(client, args))


def _status(client: Client, args: argparse.Namespace) -> None:
    snap = client.snapshot(data_limit=0, light=not args.history)
    if args.json:
        from ..output import print_json

        print_json(snap, compact=compact(args))
        return
    from supervisor.units import mib_text, seconds_text

    from ..output import backend_table, devices_kind, gpu_table, process_table
    from ..plain import show

    kind = devices_kind(snap)
    show(f"vramtui engine pid {snap.pid} ({client.info.get('mode', '?')}), up "
         f"{seconds_text(snap.uptime_s)}, " + (kind if "host" in kind else f"GPU {kind}")
         + (f", driver {snap.driver_version}" if snap.driver_version else ""),
         ("  stopping" if snap.stopping else "", "bold yellow"))
    show(f"socket {client.path}")
    if snap.notice:
        show(("note: ", "yellow"), snap.notice)
    for problem in snap.descriptor_errors:
        show(("descriptor error: ", "red"), problem)
    show(gpu_table(snap))
    show(backend_table(snap))
    procs = process_table(snap)
    if procs is not None:
        show(procs)
    free = sum(g.budget_mib for g in snap.gpus)
    show(f"jobs: {len(snap.running)} running, {len(snap.queued)} queued; admission "
         f"budget left {mib_text(free)}")
