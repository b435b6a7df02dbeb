"""``vramtui submit``: read the request, submit it, and (with --wait/--stream) follow the job.

While it waits, a status line on stderr (only when stderr is a terminal) shows the job's
queue position, then the worker's progress; ``--stream`` prints chunks to stdout as they come,
in order, and the status line never mixes into them.  Without a terminal, ``--wait`` submits
and then waits (the job's id known, so that ctrl-c can name it).  Ctrl-C leaves the job
running and says how to cancel it or fetch its result.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from typing import Any

from supervisor.client import Client, RemoteSubscription
from supervisor.jobs import JobState, JobView

from ..connect import open_client
from ..exits import Exit, UsageError


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("backend", help="the backend that runs the job (`vramtui backends` lists "
                                   "them)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--data", metavar="JSON", help="the request, as JSON text")
    source.add_argument("--data-file", metavar="FILE", help="the request, read from FILE")
    source.add_argument("-", dest="stdin", action="store_true", help="read the request from stdin")
    p.add_argument("--priority", type=int, help="higher runs first (default: the backend's)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="time the job out after it has run S seconds (from its dispatch)")
    p.add_argument("--wait", action="store_true", help="wait for the result, with progress")
    p.add_argument("--stream", action="store_true", help="print streamed chunks as they come")
    p.add_argument("--metadata", metavar="JSON", help="metadata passed to the worker (JSON)")


def read_request(text: str | None, file: str | None, flag: str) -> bytes | None:
    """A request given as JSON text (``--FLAG``) or read from a file (``--FLAG-file``)."""
    if text is not None:
        try:
            json.loads(text)
        except ValueError as exc:
            raise UsageError(f"bad JSON in --{flag}: {exc}") from None
        except RecursionError:
            raise UsageError(f"--{flag} nests too deep to read; flatten it") from None
        return text.encode()
    if file is not None:
        from supervisor.paths import read_bounded

        limit = max_request()
        try:
            data = read_bounded(file, limit)
        except OSError as exc:
            raise UsageError(f"cannot read --{flag}-file {file}: "
                             f"{exc.strerror or exc}") from None
        return _within(data, limit, f"--{flag}-file {file}")
    return None


def max_request() -> int:
    """The most the control socket takes in one request (``VRAMTUI_MAX_REQUEST``): no
    request read from a file or stdin is read past it."""
    from supervisor.limits import DEFAULT_MAX_REQUEST, BadLimit, Limits

    try:
        return Limits.from_env().max_request
    except BadLimit:
        return DEFAULT_MAX_REQUEST  # (the engine says what is wrong with it, if it is asked)


def _within(data: bytes, limit: int, what: str) -> bytes:
    if len(data) > limit:
        raise UsageError(f"request too large: {what} is over {limit >> 20} MiB, the most the "
                         "engine takes in one request (VRAMTUI_MAX_REQUEST); put large inputs "
                         "where the worker can read them and send their path")
    return data


def _read_payload(args: argparse.Namespace) -> bytes:
    given = read_request(args.data, args.data_file, "data")
    if given is not None:
        return given
    if args.stdin:
        limit = max_request()
        return _within(sys.stdin.buffer.read(limit + 1), limit, "the request on stdin")
    return b""


def _metadata(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.metadata is None:
        return None
    try:
        value = json.loads(args.metadata)
    except ValueError as exc:
        raise UsageError(f"bad JSON in --metadata: {exc}") from None
    except RecursionError:
        raise UsageError("--metadata nests too deep to read; flatten it") from None
    if not isinstance(value, dict):
        raise UsageError("--metadata must be a JSON object, like '{\"user\": \"me\"}'")
    return value


def run(args: argparse.Namespace) -> int:
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
            from ..output import print_json

            print_json({"id": job_id})
        else:
            print(job_id)
        return Exit.OK
    if not args.stream and (args.json or not sys.stderr.isatty()):
        # Nobody to show progress to: submit, then wait (the job's id known here, so that
        # ctrl+c can still say which job goes on).
        job_id = client.submit(args.backend, payload, **kw)
        try:
            view = client.wait(job_id)
        except KeyboardInterrupt:
            return _goes_on(job_id)
        return finish(view, args, printed=0)
    job_id, sub = client.submit_follow(args.backend, payload, **kw)
    try:
        printed = _follow(client, job_id, sub, args)
    except KeyboardInterrupt:
        return _goes_on(job_id)
    finally:
        sub.close()
    return finish(client.wait(job_id), args, printed)


def _goes_on(job_id: str) -> int:
    """Ctrl+c while waiting: the job goes on; say how to reach it."""
    sys.stderr.write(f"\nvramtui: job {job_id} goes on (vramtui cancel {job_id} to stop "
                     f"it; vramtui result {job_id} --wait for its result)\n")
    return Exit.INTERRUPTED


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
                    if args.json:
                        chunk_line(job_id, printed, event.data)
                    else:
                        progress.write(event.data)
                    printed += 1
            elif event.kind == "job" and event.job is not None and event.job.id == job_id:
                view = event.job
                progress.update(view)
    return printed


class _ProgressView:
    """One status line on stderr, fed by the job's events — only when stderr is a terminal.

    Data goes to stdout untouched.  When stdout is the same terminal, the status line is
    wiped before each chunk is written and drawn again after it (only when the output ends a
    line, so it never lands in the middle of one): the output holds no trace of it.
    """

    BAR = 20

    def __init__(self, job_id: str, enabled: bool) -> None:
        self.job_id = job_id
        self.enabled = enabled
        self.shared = enabled and sys.stdout.isatty()  # stdout is the same terminal
        self.started = time.monotonic()
        self.text = "submitted"
        self.fraction: float | None = None
        self.drawn = False
        self.at_line_start = True  # the output so far ends a line (or is empty)

    def __enter__(self) -> _ProgressView:
        self._draw()
        return self

    def update(self, view: JobView) -> None:
        if view.state is JobState.QUEUED:
            where = f" (position {view.position})" if view.position else ""
            self.text = f"queued{where}" + (f": {view.waiting}" if view.waiting else "")
        elif view.state is JobState.STARTING:
            self.text = f"starting {view.backend}"
        else:
            self.text = view.progress_text or view.state.value
        self.fraction = view.progress
        self._draw()

    def write(self, data: bytes) -> None:
        """Write output data to stdout, keeping the status line out of it."""
        if not data:
            return
        if self.shared:
            self._wipe()
        write_out(data)
        self.at_line_start = data.endswith(b"\n")
        self._draw()

    def _line(self) -> str:
        width = shutil.get_terminal_size((80, 24)).columns
        if self.fraction is None:
            bar = ""
        else:
            f = min(1.0, max(0.0, self.fraction))
            full = round(f * self.BAR)
            bar = "█" * full + "░" * (self.BAR - full) + f" {f * 100:3.0f}% "
        elapsed = f" {time.monotonic() - self.started:.1f}s"
        line = f"{self.job_id} {bar}{self.text}"
        room = max(10, width - len(elapsed) - 1)
        if len(line) > room:
            line = line[: room - 1] + "…"
        return line + elapsed

    def _draw(self) -> None:
        if not self.enabled or (self.shared and not self.at_line_start):
            return
        sys.stderr.write("\r\x1b[2K" + self._line())
        sys.stderr.flush()
        self.drawn = True

    def _wipe(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self.drawn = False

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._wipe()


def write_out(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def chunk_line(job_id: str, index: int, data: bytes) -> None:
    """``--stream --json``: one JSON line for one chunk (text as text, else base64)."""
    from ..output import print_json

    print_json({"job_id": job_id, "chunk": index, "data": data}, compact=True)


def finish(view: JobView, args: argparse.Namespace, printed: int) -> int:
    """Print a finished job's result (the chunks not printed yet when streamed); its exit code.

    The data goes to stdout as it is; on a terminal, a result that does not end its last
    line gets a newline, so that the prompt comes back on a line of its own.
    """
    if args.json and getattr(args, "stream", False):
        from ..output import print_json

        for index, chunk in enumerate(view.chunks[printed:], start=printed):
            chunk_line(view.id, index, chunk)
        print_json(view, compact=True)  # the last line: the job as it ended
    elif args.json:
        from ..output import print_json

        print_json(view)
    elif view.state is JobState.SUCCEEDED:
        last = b""
        if getattr(args, "stream", False) or (view.data is None and view.chunks):
            for chunk in view.chunks[printed:]:
                write_out(chunk)
            last = next((c for c in reversed(view.chunks) if c), b"")
        elif view.data:
            write_out(view.data)
            last = view.data
        if last and not last.endswith(b"\n") and sys.stdout.isatty():
            write_out(b"\n")
    if view.state is JobState.SUCCEEDED:
        return Exit.OK
    if not args.json:
        from ..output import error

        error(f"job {view.id} {view.state.value.replace('_', ' ')}: {view.error or 'no reason'}")
    return Exit.JOB_FAILED
