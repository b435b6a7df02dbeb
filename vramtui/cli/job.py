"""One job's commands: ``result``, ``cancel``, ``retry`` and ``priority``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from supervisor.jobs import JobState

from ..connect import open_client
from ..exits import Exit, UsageError


def result_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job's id (j-…; `vramtui jobs` lists them)")
    p.add_argument("--wait", action="store_true", help="wait for it to finish")
    p.add_argument("--output", "-o", metavar="FILE", help="write the result data to FILE")


def result(args: argparse.Namespace) -> int:
    client = open_client(args)
    view = client.wait(args.job) if args.wait else client.job(args.job)
    if not view.finished:
        if args.json:
            from ..output import print_json

            print_json(view)
        else:
            from ..output import error

            where = f" (position {view.position} in the queue)" if view.position else ""
            error(f"job {view.id} is {view.state.value}{where}; add --wait to wait for it")
        return Exit.NOT_FINISHED
    if args.output and view.state is JobState.SUCCEEDED:
        data = view.data if view.data is not None else b"".join(view.chunks)
        try:
            Path(args.output).write_bytes(data)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror or exc}") from None
        if not args.json:
            print(f"wrote {len(data)} bytes to {args.output}", file=sys.stderr)
            return Exit.OK
    from .submit import finish

    return finish(view, args, printed=0)


def cancel_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("jobs", nargs="+", metavar="JOB",
                   help="the jobs' ids (j-…; `vramtui jobs` lists them)")


def cancel(args: argparse.Namespace) -> int:
    client = open_client(args)
    if len(args.jobs) > 1:
        results = client.cancel_many(args.jobs)
        if args.json:
            from ..output import print_json

            print_json(results)
        else:
            for r in results:
                if r.error is not None:
                    print(f"job {r.job_id}: {r.error}", file=sys.stderr)
                elif r.state == JobState.CANCELLED.value:
                    print(f"job {r.job_id} cancelled")
                elif r.state in (JobState.RUNNING.value, JobState.STARTING.value):
                    print(f"job {r.job_id} is being cancelled (it was running)")
                else:
                    print(f"job {r.job_id} had already {r.state.replace('_', ' ')}")
        return Exit.NOT_FOUND if any(r.error for r in results) else Exit.OK
    before = client.job(args.jobs[0])
    if before.finished:  # nothing to cancel: say what it already was
        if args.json:
            from ..output import print_json

            print_json(before)
        else:
            print(f"job {before.id} had already {before.state.value.replace('_', ' ')}: "
                  "nothing to cancel")
        return Exit.NOTHING_TO_DO
    view = client.cancel(args.jobs[0])
    if args.json:
        from ..output import print_json

        print_json(view)
    elif view.finished and view.state is not JobState.CANCELLED:
        print(f"job {view.id} had already {view.state.value.replace('_', ' ')}")
        return Exit.NOTHING_TO_DO
    elif view.finished:
        print(f"job {view.id} cancelled")
    else:
        print(f"job {view.id} is being cancelled (it was running)")
    return Exit.OK


def retry_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job's id (j-…; `vramtui jobs` lists them)")
    p.add_argument("--wait", action="store_true", help="wait for the new job's result")


def retry(args: argparse.Namespace) -> int:
    client = open_client(args)
    job_id = client.retry(args.job)
    if args.wait:
        from .submit import finish

        return finish(client.wait(job_id), args, printed=0)
    if args.json:
        from ..output import print_json

        print_json({"id": job_id, "retry_of": args.job})
    else:
        print(job_id)
    return Exit.OK


def priority_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job's id (j-…; `vramtui jobs` lists them)")
    p.add_argument("priority", type=int,
                   help="the new priority (higher runs first)")


def priority(args: argparse.Namespace) -> int:
    view = open_client(args).set_priority(args.job, args.priority)
    if args.json:
        from ..output import print_json

        print_json(view)
    else:
        where = f", position {view.position} in the queue" if view.position else ""
        print(f"job {view.id}: priority {view.priority}{where}")
    return Exit.OK
