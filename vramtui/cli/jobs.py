"""``vramtui jobs``: running, queued and recent jobs, newest first, filtered by state and
backend (``--watch``: live); on the simulated GPU a line says their figures are SIMULATED
(``--json``: ``simulated``)."""

from __future__ import annotations

import argparse

from ..connect import open_client
from ..exits import UsageError
from .watch import add_watch_arguments, check_watch, compact, watching

STATES = ("queued", "starting", "running", "succeeded", "failed", "cancelled", "timed_out")


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", action="append", metavar="STATE", choices=STATES,
                   help="only jobs in this state (repeatable)")
    p.add_argument("--backend", action="append", metavar="B", help="only this backend's "
                   "jobs (repeatable)")
    p.add_argument("--limit", type=int, metavar="N", help="at most N jobs")
    add_watch_arguments(p)


def run(args: argparse.Namespace) -> int:
    check_watch(args)  # bad usage is said before the engine is asked
    client = open_client(args)
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit takes a number of jobs, 1 or more")

    def show() -> None:
        snap = client.snapshot(data_limit=0)
        wanted = {"running": snap.running, "queued": snap.queued, "recent": snap.recent}
        if args.state or args.backend:
            for key, jobs in wanted.items():
                wanted[key] = tuple(j for j in jobs
                                    if (not args.state or j.state.value in args.state)
                                    and (not args.backend or j.backend in args.backend))
        if args.limit is not None:
            left = args.limit
            for key, jobs in wanted.items():
                wanted[key] = jobs[:left]
                left -= len(wanted[key])
        if args.json:
            from ..output import print_json

            # simulated: whether the figures (peak) are, as status --json says it
            print_json({"simulated": snap.simulated, **wanted}, compact=compact(args))
            return
        from ..output import jobs_table, show_simulated_note
        from ..plain import show

        jobs = wanted["running"] + wanted["queued"] + wanted["recent"]
        if not jobs:
            show("no jobs" + (" like that" if args.state or args.backend else " yet"))
        else:
            show_simulated_note(snap, {j.backend for j in jobs})
            show(jobs_table(jobs))

    return watching(args, show)
