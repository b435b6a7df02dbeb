"""The client subcommands: ``submit``, ``status``, ``queue``, ``jobs``, ``result`` and the rest.

Each attaches to the running engine (never starts one), does one thing, and returns an exit
code from :class:`vramtui.exits.Exit`.  Every error the user can cause is one line on stderr
(``vramtui: error: ...``) and a non-zero exit code, never a traceback; with ``--json`` the
error is also printed on stdout as ``{"error": ..., "type": ...}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor import errors as E
from supervisor.jobs import JobState

from .connect import open_client
from .exits import Exit, UsageError, exit_code
from .peaks import over_declared_line, suggested_peak_mib

if TYPE_CHECKING:
    from supervisor.client import Client

# -- errors and exit codes ------------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> int:
    handler = HANDLERS[args.command]
    as_json = bool(getattr(args, "json", False))
    try:
        return handler(args)
    except (UsageError, E.VramtuiError) as exc:
        code = Exit.USAGE if isinstance(exc, UsageError) else exit_code(exc)
        _report(str(exc), type(exc).__name__, as_json)
        return code
    except BrokenPipeError:  # `vramtui jobs | head`: stop quietly
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
        return Exit.OK
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: still one line unless asked for more
        if os.environ.get("VRAMTUI_DEBUG"):
            raise
        _report(f"internal error: {type(exc).__name__}: {exc} (run with VRAMTUI_DEBUG=1 for "
                "the traceback, and please report it)", "InternalError", as_json)
        return Exit.INTERNAL


def _report(text: str, kind: str, as_json: bool) -> None:
    from .output import error

    error(text)
    if as_json:
        import json

        sys.stdout.write(json.dumps({"error": text, "type": kind}) + "\n")


# -- looking ---------------------------------------------------------------------------------


def _watching(args: argparse.Namespace, show: Callable[[], None]) -> int:
    """``show()`` once, or (``--watch``, ``-n``) again every interval until ctrl+c."""
    interval = getattr(args, "interval", None)
    if not getattr(args, "watch", False) and interval is None:
        show()
        return Exit.OK
    interval = 2.0 if interval is None else interval
    if not 0.1 <= interval <= 86400:
        raise UsageError("-n takes between 0.1 and 86400 seconds")
    from . import plain

    try:
        while True:
            if sys.stdout.isatty() and not args.json:
                sys.stdout.write("\x1b[H\x1b[2J")  # clear the screen, cursor home
                plain.show((f"every {interval:g} s · {time.strftime('%H:%M:%S')} · ctrl+c "
                            "stops", "dim"))
            show()
            time.sleep(interval)
    except KeyboardInterrupt:
        return Exit.OK


def cmd_status(args: argparse.Namespace) -> int:
    client = open_client(args)
    if args.history and not args.json:
        raise UsageError("--history goes with --json (the tables never show it)")
    return _watching(args, lambda: _status(client, args))


def _status(client: Client, args: argparse.Namespace) -> None:
    snap = client.snapshot(data_limit=0, light=not args.history)
    if args.json:
        from .output import print_json

        print_json(snap, compact=bool(args.watch or args.interval))
        return
    from supervisor.units import mib_text, seconds_text

    from .output import backend_table, gpu_table, process_table
    from .plain import show

    kind = "SIMULATED" if snap.simulated else (snap.source or "GPU")
    show(f"vramtui engine pid {snap.pid} ({client.info.get('mode', '?')}), up "
         f"{seconds_text(snap.uptime_s)}, GPU {kind}"
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
    free = sum(g.budget_mib for g in snap.gpus if not g.draining)
    show(f"jobs: {len(snap.running)} running, {len(snap.queued)} queued; admission "
         f"budget left {mib_text(free)}")


def cmd_queue(args: argparse.Namespace) -> int:
    client = open_client(args)

    def show() -> None:
        snap = client.snapshot(data_limit=0, light=True)
        if args.json:
            from .output import print_json

            print_json(snap.queued, compact=bool(args.watch or args.interval))
            return
        from .output import queue_table
        from .plain import show

        if not snap.queued:
            show("the queue is empty")
        else:
            show(queue_table(snap.queued))

    return _watching(args, show)


def cmd_jobs(args: argparse.Namespace) -> int:
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
            from .output import print_json

            print_json(wanted, compact=bool(args.watch or args.interval))
            return
        from .output import jobs_table
        from .plain import show

        jobs = wanted["running"] + wanted["queued"] + wanted["recent"]
        if not jobs:
            show("no jobs" + (" like that" if args.state or args.backend else " yet"))
        else:
            show(jobs_table(jobs))

    return _watching(args, show)


def cmd_result(args: argparse.Namespace) -> int:
    client = open_client(args)
    view = client.wait(args.job) if args.wait else client.job(args.job)
    if not view.finished:
        if args.json:
            from .output import print_json

            print_json(view)
        else:
            from .output import error

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


def cmd_cancel(args: argparse.Namespace) -> int:
    client = open_client(args)
    if len(args.jobs) > 1:
        results = client.cancel_many(args.jobs)
        if args.json:
            from .output import print_json

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
    view = client.cancel(args.jobs[0])
    if args.json:
        from .output import print_json

        print_json(view)
    elif view.finished and view.state is not JobState.CANCELLED:
        print(f"job {view.id} had already {view.state.value.replace('_', ' ')}")
    elif view.finished:
        print(f"job {view.id} cancelled")
    else:
        print(f"job {view.id} is being cancelled (it was running)")
    return Exit.OK


def cmd_retry(args: argparse.Namespace) -> int:
    client = open_client(args)
    job_id = client.retry(args.job)
    if args.wait:
        from .submit import finish

        return finish(client.wait(job_id), args, printed=0)
    if args.json:
        from .output import print_json

        print_json({"id": job_id, "retry_of": args.job})
    else:
        print(job_id)
    return Exit.OK


def cmd_priority(args: argparse.Namespace) -> int:
    view = open_client(args).set_priority(args.job, args.priority)
    if args.json:
        from .output import print_json

        print_json(view)
    else:
        where = f", position {view.position} in the queue" if view.position else ""
        print(f"job {view.id}: priority {view.priority}{where}")
    return Exit.OK


def cmd_events(args: argparse.Namespace) -> int:
    client = open_client(args)
    kinds = args.kind or ["log", "job", "worker"]
    sub = client.subscribe(kinds=kinds, maxsize=10_000)
    from .output import event_line, jsonable

    lagged = 0
    try:
        for event in sub:
            if sub.dropped > lagged:
                print(f"vramtui: {sub.dropped - lagged} events dropped (this terminal fell "
                      "behind)", file=sys.stderr)
                lagged = sub.dropped
            if args.json:
                import json

                sys.stdout.write(json.dumps(jsonable(event), default=str) + "\n")
            else:
                sys.stdout.write(event_line(event) + "\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return Exit.OK
    finally:
        sub.close()
    print("vramtui: the engine stopped", file=sys.stderr)
    return Exit.NO_ENGINE


def cmd_drain(args: argparse.Namespace) -> int:
    draining = open_client(args).drain(args.gpu, not args.off)
    if args.json:
        from .output import print_json

        print_json({"gpu": args.gpu, "draining": list(draining)})
    elif args.off:
        print(f"GPU{args.gpu} admits work again"
              + (f" (still draining: {', '.join(f'GPU{g}' for g in draining)})"
                 if draining else ""))
    else:
        print(f"GPU{args.gpu} is draining: its running work finishes, nothing new is "
              f"admitted there (vramtui drain {args.gpu} --off opens it again)")
    return Exit.OK


def cmd_reload(args: argparse.Namespace) -> int:
    result = open_client(args).reload()
    if args.json:
        from .output import print_json

        print_json({**jsonable_result(result), "unchanged": result.unchanged})
        return Exit.FAILED if result.errors else Exit.OK
    from supervisor.engine_commands import reload_summary

    print(f"reloaded {len(result.files)} file(s): {reload_summary(result)}")
    for name in result.added:
        print(f"  + {name}")
    for name in result.removed:
        print(f"  - {name}")
    for change in result.changed:
        print(f"  ~ {change.backend}: {'; '.join(change.changes)}")
        for note in change.notes:
            print(f"      {note}")
    for line in result.kept:
        print(f"  = {line}")
    for line in result.errors:
        print(f"vramtui: descriptor error: {line}", file=sys.stderr)
    return Exit.FAILED if result.errors else Exit.OK


def jsonable_result(value: object) -> dict[str, object]:
    from .output import jsonable

    out = jsonable(value)
    assert isinstance(out, dict)
    return out


def cmd_backends(args: argparse.Namespace) -> int:
    snap = open_client(args).snapshot(data_limit=0, light=True)
    if args.json:
        from .output import jsonable, print_json

        print_json([{**jsonable(b), "over_declared": b.over_declared,
                     "suggested_peak_mib": suggested_peak_mib(b)} for b in snap.backends])
        return Exit.OK
    from .output import backend_table
    from .plain import show

    show(backend_table(snap, wide=True))
    for backend in snap.backends:
        line = over_declared_line(backend)
        if line is not None:
            show(("over peak! ", "bold red"), line)
    return Exit.OK


def _backend_action(verb: str, done: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        getattr(open_client(args), verb)(args.backend)
        if args.json:
            from .output import print_json

            print_json({"backend": args.backend, "action": verb, "ok": True})
        else:
            print(f"{args.backend}: {done}")
        return Exit.OK

    return run


def cmd_zero(args: argparse.Namespace) -> int:
    evicted = open_client(args).zero()
    if args.json:
        from .output import print_json

        print_json({"evicted": evicted})
    elif evicted:
        print("evicting " + ", ".join(evicted))
    else:
        print("nothing to evict (no idle worker)")
    return Exit.OK


def cmd_logs(args: argparse.Namespace) -> int:
    client = open_client(args)
    chunk = client.logs(args.backend, lines=max(0, args.lines))
    if args.json and not args.follow:
        from .output import print_json

        print_json(chunk)
        return Exit.OK
    if chunk.missing and not args.follow:
        print(f"{args.backend} has no log yet ({chunk.path})", file=sys.stderr)
        return Exit.OK
    from .submit import write_out

    write_out(chunk.data)
    offset = chunk.offset
    while args.follow:
        time.sleep(0.25)  # tail -f: poll the file's growth through the engine
        chunk = client.logs(args.backend, offset=offset)
        if chunk.data:
            write_out(chunk.data)
        offset = chunk.offset
    return Exit.OK


def cmd_submit(args: argparse.Namespace) -> int:
    from .submit import cmd_submit as submit

    return submit(args)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .calibrate_cmd import cmd_calibrate as calibrate

    return calibrate(args)


def cmd_recalibrate(args: argparse.Namespace) -> int:
    from .calibrate_cmd import cmd_recalibrate as recalibrate

    return recalibrate(args)


def cmd_import_vramd(args: argparse.Namespace) -> int:
    from .import_vramd import cmd_import_vramd as import_vramd

    return import_vramd(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import run_doctor

    return run_doctor(args)


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "submit": cmd_submit,
    "status": cmd_status,
    "queue": cmd_queue,
    "jobs": cmd_jobs,
    "result": cmd_result,
    "cancel": cmd_cancel,
    "retry": cmd_retry,
    "priority": cmd_priority,
    "events": cmd_events,
    "drain": cmd_drain,
    "reload": cmd_reload,
    "kill": _backend_action("kill", "killed its worker (its jobs fail)"),
    "backends": cmd_backends,
    "evict": _backend_action("evict", "evicting (its worker stops once idle)"),
    "respawn": _backend_action("respawn", "respawning"),
    "preload": _backend_action("preload", "preloading (its worker starts when it fits)"),
    "zero": cmd_zero,
    "logs": cmd_logs,
    "doctor": cmd_doctor,
    "calibrate": cmd_calibrate,
    "recalibrate": cmd_recalibrate,
    "import-vramd": cmd_import_vramd,
}
