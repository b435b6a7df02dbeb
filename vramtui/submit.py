"""``vramtui submit``: read the request, submit it, and (with --wait/--stream) follow the job.

While it waits, a progress bar on stderr (when stderr is a terminal) shows the job's queue
position, then the worker's progress events; ``--stream`` prints chunks to stdout as they come,
in order.  Without a terminal, ``--wait`` is one round trip (``submit_wait``).  Ctrl-C leaves
the job running and says how to cancel it or fetch its result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from supervisor.client import Client, RemoteSubscription
from supervisor.jobs import JobState, JobView

from .cli import Exit, UsageError
from .connect import open_client


def read_request(text: str | None, file: str | None, flag: str) -> bytes | None:
    """A request given as JSON text (``--FLAG``) or read from a file (``--FLAG-file``)."""
    if text is not None:
        try:
            json.loads(text)
        except ValueError as exc:
            raise UsageError(f"bad JSON in --{flag}: {exc}") from None
        return text.encode()
    if file is not None:
        try:
            return Path(file).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read --{flag}-file {file}: "
                             f"{exc.strerror or exc}") from None
    return None


def _read_payload(args: argparse.Namespace) -> bytes:
    given = read_request(args.data, args.data_file, "data")
    if given is not None:
        return given
    if args.stdin:
        return sys.stdin.buffer.read()
    return b""


def _metadata(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.metadata is None:
        return None
    try:
        value = json.loads(args.metadata)
    except ValueError as exc:
        raise UsageError(f"bad JSON in --metadata: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("--metadata must be a JSON object, like '{\"user\": \"me\"}'")
    return value


def cmd_submit(args: argparse.Namespace) -> int:
    payload = _read_payload(args)
    metadata = _metadata(args)
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    client = open_client(args)
    kw: dict[str, Any] = {"priority": args.priority, "timeout": args.timeout,
                          "metadata": metadata, "stream": args.stream}
    if not (args.wait or args.stream):
        job_id = client.submit(args.backend, payload, **kw)
        if args.json:
            from .output import print_json

            print_json({"id": job_id})
        else:
            print(job_id)
        return Exit.OK
    if not args.stream and (args.json or not sys.stderr.isatty()):
        # Nobody to show progress to: one round trip.
        return finish(client.submit_wait(args.backend, payload, **kw), args, printed=0)
    job_id, sub = client.submit_follow(args.backend, payload, **kw)
    try:
        printed = _follow(client, job_id, sub, args)
    except KeyboardInterrupt:
        sys.stderr.write(f"\nvramtui: job {job_id} goes on (vramtui cancel {job_id} to stop "
                         f"it; vramtui result {job_id} --wait for its result)\n")
        return Exit.INTERRUPTED
    finally:
        sub.close()
    return finish(client.wait(job_id), args, printed)


def _follow(client: Client, job_id: str, sub: RemoteSubscription,
            args: argparse.Namespace) -> int:
    """Show the job's progress (and its chunks with --stream) until it ends; chunks printed."""
    progress = _ProgressView(job_id, enabled=not args.json and sys.stderr.isatty())
    printed = 0
    view: JobView | None = None
    next_poll = 0.0
    with progress:
        while view is None or not view.finished:
            now = time.monotonic()
            if now >= next_poll and (view is None or view.state in (JobState.QUEUED,
                                                                     JobState.STARTING)):
                view = client.job(job_id)  # the queue position is only known here
                progress.update(view)
                next_poll = now + 0.5
                if view.finished:
                    break
            event = sub.get(timeout=0.5)
            if event is None:
                continue
            if event.kind == "closed":
                break
            if event.kind == "chunk" and event.job_id == job_id:
                if args.stream and not sub.lagged and event.data is not None:
                    write_out(event.data)
                    printed += 1
            elif event.kind == "job" and event.job is not None and event.job.id == job_id:
                view = event.job
                progress.update(view)
    return printed


class _ProgressView:
    """A rich progress bar on stderr fed by the job's events (nothing when not a terminal)."""

    def __init__(self, job_id: str, enabled: bool) -> None:
        self.job_id = job_id
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _ProgressView:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]{task.fields[job]}"), BarColumn(),
                                      TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("submitted", total=None, job=self.job_id)
        return self

    def update(self, view: JobView) -> None:
        if self._progress is None:
            return
        if view.state is JobState.QUEUED:
            where = f" (position {view.position})" if view.position else ""
            text = f"queued{where}" + (f": {view.waiting}" if view.waiting else "")
        elif view.state is JobState.STARTING:
            text = f"starting {view.backend}"
        else:
            text = view.progress_text or view.state.value
        total = 1.0 if view.progress is not None else None
        self._progress.update(self._task, description=text, total=total,
                              completed=view.progress or 0.0)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)


def write_out(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def finish(view: JobView, args: argparse.Namespace, printed: int) -> int:
    """Print a finished job's result; its exit code."""
    if args.json:
        from .output import print_json

        print_json(view)
    elif view.state is JobState.SUCCEEDED:
        if getattr(args, "stream", False) or (view.data is None and view.chunks):
            for chunk in view.chunks[printed:]:
                write_out(chunk)
        elif view.data:
            write_out(view.data)
            if sys.stdout.isatty() and not view.data.endswith(b"\n"):
                write_out(b"\n")
    if view.state is JobState.SUCCEEDED:
        return Exit.OK
    if not args.json:
        from .output import error

        error(f"job {view.id} {view.state.value.replace('_', ' ')}: {view.error or 'no reason'}")
    return Exit.JOB_FAILED
