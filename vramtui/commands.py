"""The client subcommands: ``submit``, ``status``, ``queue``, ``jobs``, ``result`` and the rest.

Each attaches to the running engine (never starts one), does one thing, and returns an exit
code from :class:`vramtui.cli.Exit`.  Every error the user can cause is one line on stderr
(``vramtui: error: ...``) and a non-zero exit code, never a traceback; with ``--json`` the
error is also printed on stdout as ``{"error": ..., "type": ...}``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from supervisor import errors as E
from supervisor.control import errors as CE
from supervisor.jobs import JobState
from supervisor.snapshot import BackendView

from .cli import Exit, UsageError
from .connect import open_client

# -- errors and exit codes ------------------------------------------------------------------------


_EXIT_FOR: tuple[tuple[type[BaseException], int], ...] = (
    (E.UnknownBackend, Exit.NOT_FOUND),
    (E.UnknownJob, Exit.NOT_FOUND),
    (E.Refused, Exit.REFUSED),
    (E.QueueFull, Exit.REFUSED),
    (E.BackendFailed, Exit.REFUSED),
    (CE.AccessDenied, Exit.REFUSED),
    (CE.TooManyConnections, Exit.REFUSED),
    (E.EngineStopped, Exit.NO_ENGINE),
    (CE.RequestTooLarge, Exit.USAGE),
    (CE.BadRequest, Exit.USAGE),
    (E.InvalidRequest, Exit.USAGE),
    (CE.ProtocolMismatch, Exit.USAGE),
    (E.JobTimeout, Exit.JOB_FAILED),
)


def exit_code(exc: BaseException) -> int:
    for cls, code in _EXIT_FOR:
        if isinstance(exc, cls):
            return code
    return Exit.JOB_FAILED


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


def cmd_status(args: argparse.Namespace) -> int:
    client = open_client(args)
    snap = client.snapshot(data_limit=0, light=not args.json)
    if args.json:
        from .output import print_json

        print_json(snap)
        return Exit.OK
    from .output import backend_table, gpu_table, mib, out, seconds

    kind = "SIMULATED" if snap.simulated else (snap.source or "GPU")
    head = (f"vramtui engine pid {snap.pid} ({client.info.get('mode', '?')}), up "
            f"{seconds(snap.uptime_s)}, GPU {kind}"
            + (f", driver {snap.driver_version}" if snap.driver_version else "")
            + ("  [bold yellow]stopping[/]" if snap.stopping else ""))
    out.print(head)
    out.print(f"socket {client.path}")
    if snap.notice:
        out.print(f"[yellow]note:[/] {snap.notice}")
    for problem in snap.descriptor_errors:
        out.print(f"[red]descriptor error:[/] {problem}")
    out.print(gpu_table(snap))
    out.print(backend_table(snap))
    free = sum(g.budget_mib for g in snap.gpus)
    out.print(f"jobs: {len(snap.running)} running, {len(snap.queued)} queued; admission "
              f"budget left {mib(free)}")
    return Exit.OK


def cmd_queue(args: argparse.Namespace) -> int:
    snap = open_client(args).snapshot(data_limit=0, light=True)
    if args.json:
        from .output import print_json

        print_json(snap.queued)
        return Exit.OK
    from .output import out, queue_table

    if not snap.queued:
        out.print("the queue is empty")
    else:
        out.print(queue_table(snap.queued))
    return Exit.OK


def cmd_jobs(args: argparse.Namespace) -> int:
    snap = open_client(args).snapshot(data_limit=0)
    if args.json:
        from .output import print_json

        print_json({"running": snap.running, "queued": snap.queued, "recent": snap.recent})
        return Exit.OK
    from .output import jobs_table, out

    jobs = snap.running + snap.queued + snap.recent
    if not jobs:
        out.print("no jobs yet")
    else:
        out.print(jobs_table(jobs))
    return Exit.OK


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
    view = open_client(args).cancel(args.job)
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


SUGGESTED_MARGIN = 1.05  # a suggested peak: the observed p95 plus 5 % ...
SUGGESTED_STEP_MIB = 64  # ... rounded up to this


def suggested_peak_mib(backend: BackendView) -> int | None:
    """For a backend whose observed p95 peak exceeds its declared peak, the peak to declare
    instead (observed p95 + 5 %, rounded up to 64 MiB); None when the declaration holds."""
    if not backend.over_declared or backend.observed_p95_mib is None:
        return None
    wanted = math.ceil(backend.observed_p95_mib * SUGGESTED_MARGIN)
    return -(-wanted // SUGGESTED_STEP_MIB) * SUGGESTED_STEP_MIB


def _size_up(n: int) -> str:
    """A size to declare, never below ``n``: whole MiB, or GiB rounded up to 0.1."""
    if n < 1024:
        return f"{n} MiB"
    return f"{math.ceil(n * 10 / 1024) / 10:.1f} GiB"


def over_declared_line(backend: BackendView) -> str | None:
    """"observed p95 9.8 GiB > declared 9.0 GiB: set vram.peak to 10.3 GiB or run ..."."""
    suggested = suggested_peak_mib(backend)
    if suggested is None:
        return None
    from .output import mib

    return (f"{backend.name}: observed p95 {mib(backend.observed_p95_mib)} > declared "
            f"{mib(backend.declared_peak_mib)}: set vram.peak to {_size_up(suggested)} or run "
            f"`vramtui calibrate {backend.name}`")


def cmd_backends(args: argparse.Namespace) -> int:
    snap = open_client(args).snapshot(data_limit=0, light=True)
    if args.json:
        from .output import jsonable, print_json

        print_json([{**jsonable(b), "over_declared": b.over_declared,
                     "suggested_peak_mib": suggested_peak_mib(b)} for b in snap.backends])
        return Exit.OK
    from rich.markup import escape

    from .output import backend_table, out

    out.print(backend_table(snap, wide=True))
    for backend in snap.backends:
        line = over_declared_line(backend)
        if line is not None:
            out.print(f"[bold red]over peak![/] {escape(line)}")
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
