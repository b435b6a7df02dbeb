"""``vramtui jobs``: running, queued and recent jobs, newest first, filtered by state and
backend (``--watch``: live); on the simulated GPU a line says their figures are SIMULATED
(``--json``: ``simulated``)."""

from __future__ import annotations

import argparse

from supervisor.jobs import JobState

from ..connect import open_client
from .watch import add_watch_arguments, check_watch, compact, watching

RUNNING = frozenset({JobState.STARTING, JobState.RUNNING})


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", action="append", metavar="STATES",
                   help="only jobs in these states: queued, starting, running, succeeded, "
                   "failed, cancelled, timed_out, or active / finished; a comma-separated "
                   "list (repeatable), as GET /v1/jobs?state= takes")
    p.add_argument("--backend", action="append", metavar="B", help="only this backend's "
                   "jobs (repeatable)")
    p.add_argument("--limit", type=int, metavar="N", help="at most N jobs: running, then "
                   "the queue in the order it runs, then finished ones newest first "
                   "(1 to 1000; default 100)")
    add_watch_arguments(p)


def run(args: argparse.Namespace) -> int:
    check_watch(args)  # bad usage is said before the engine is asked
    client = open_client(args)
    asked = {"state": ",".join(args.state) if args.state else None,
             "backends": tuple(args.backend or ()), "limit": args.limit}

    def show() -> None:
        # which jobs, and what may be asked: the engine's one listing (the API's `jobs`,
        # as GET /v1/jobs), its rules in supervisor.jobs.query
        listed = client.jobs(**{k: v for k, v in asked.items() if v is not None})
        snap = client.snapshot(light=True, data_limit=0)  # simulated or not: the note
        wanted = {"running": tuple(j for j in listed if j.state in RUNNING),
                  "queued": tuple(j for j in listed if j.state is JobState.QUEUED),
                  "recent": tuple(j for j in listed if j.finished)}
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
