"""How the CLI prints: plain aligned tables for people, JSON for scripts, one-line errors.

The tables are :mod:`vramtui.plain` (fast to import: ``vramtui status`` must start in well
under 100 ms); rich is imported only by the commands that print rich reports, through
``out`` and ``err`` (created on first use).  ``jsonable`` turns any engine view into JSON
values: it is :func:`supervisor.doors.codec.plain`, the one codec HTTP uses too (bytes become
text when they are UTF-8, else ``{"base64": ...}``; times are epoch seconds, as views carry
them).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any

from supervisor.jobs import JobState, JobView
from supervisor.snapshot import EngineSnapshot
from supervisor.units import mib_text, seconds_text

from .plain import Cell, Table

STATE_STYLE = {
    JobState.QUEUED: "yellow", JobState.STARTING: "cyan", JobState.RUNNING: "bold cyan",
    JobState.SUCCEEDED: "green", JobState.FAILED: "bold red", JobState.CANCELLED: "magenta",
    JobState.TIMED_OUT: "red",
}
WORKER_STYLE = {"ready": "green", "busy": "bold cyan", "starting": "cyan", "stopping": "yellow",
                "failed": "bold red", "cold": "dim", "crashed": "bold red",
                "initializing": "cyan", "asleep": "blue"}


def __getattr__(name: str) -> Any:
    """``out`` / ``err``: rich consoles for the rich reports, made on first use."""
    if name in ("out", "err"):
        from rich.console import Console

        if name == "out":
            # Piped output is not cut to 80 columns: up to 160.
            value = Console(highlight=False, soft_wrap=False,
                            width=None if sys.stdout.isatty() else 160)
        else:
            value = Console(stderr=True, highlight=False)
        globals()[name] = value
        return value
    raise AttributeError(name)


def jsonable(value: Any) -> Any:
    """``value`` as JSON values: :func:`supervisor.doors.codec.plain` (imported on first use:
    the tables never need it)."""
    from supervisor.doors.codec import plain

    return plain(value)


def print_json(value: Any, *, compact: bool = False) -> None:
    """``value`` as JSON on stdout (``compact``: one line, for a stream of documents).
    Times are epoch seconds (wall clock), like the snapshot's ``taken_at``."""
    import json

    text = json.dumps(jsonable(value), indent=None if compact else 2, default=str,
                      separators=(",", ":") if compact else None)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def nothing_to_do(why: str, as_json: bool, **fields: Any) -> int:
    """A command that had nothing to do (the job ended already, the backend not loaded, the
    GPU not yielded): ``why`` on stdout, no error (``--json``: ``fields`` with
    ``nothing_to_do`` and ``message``), and its exit code, 7."""
    from .exits import Exit

    if as_json:
        print_json({**fields, "nothing_to_do": True, "message": why})
    else:
        print(why)
    return Exit.NOTHING_TO_DO


def error(text: str) -> None:
    """One line on stderr, ``vramtui: error: ...``."""
    first = " ".join(str(text).split("\n")[0].split())
    sys.stderr.write(f"vramtui: error: {first}\n")
    sys.stderr.flush()


def ignored(flags: Iterable[str], why: str) -> None:
    """One line on stderr, ``vramtui: warning: --a, --b ignored: WHY``: options given to a
    command that does nothing with them (:func:`vramtui.cli.parser._recorded` notes them)."""
    sys.stderr.write(f"vramtui: warning: {', '.join(flags)} ignored: {why}\n")
    sys.stderr.flush()


def state_text(state: JobState) -> Cell:
    return (state.value, STATE_STYLE.get(state, ""))


def job_duration(job: JobView) -> float | None:
    """How long its (last) run took; None until it has ended."""
    return job.ran_s


def clock(t: float) -> str:
    """A wall-clock time for a person: local ``HH:MM:SS``."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def event_line(event: Any) -> str:
    """One engine event as one line of text (``vramtui events``)."""
    head = f"{clock(event.t)} {event.kind:<6}"
    if event.kind == "log":
        mark = {"error": "error: ", "warning": "warning: "}.get(event.level, "")
        return f"{head} {mark}{event.message}"
    if event.kind == "job" and event.job is not None:
        j = event.job
        text = f"{head} {j.id} {j.backend} {j.state.value}"
        if j.state.finished:
            took = j.ran_s
            if took is not None:
                text += f" in {seconds_text(took)}"
            if j.error:
                text += f": {j.error}"
        elif j.progress is not None:
            text += f" {j.progress * 100:.0f} % {j.progress_text}".rstrip()
        elif j.waiting:
            text += f": {j.waiting}"
        return text
    if event.kind == "chunk":
        return f"{head} {event.job_id} {len(event.data or b'')} bytes"
    if event.kind == "sleep":  # asleep, awake (in the measured time), or stopped instead
        return f"{head} {event.backend} {event.state}: {event.message}"
    return f"{head} {event.backend or ''} {event.state or ''}".rstrip()


def drain_ended_text(gpu: int, yielded: bool) -> str:
    """What a GPU's drain turned off means: it admits work again, unless it is yielded."""
    return (f"GPU{gpu} no longer drains; it stays yielded (vramtui resume {gpu} admits work "
            "there again)" if yielded else f"GPU{gpu} admits work again")


# -- tables -------------------------------------------------------------------------------------

def devices_kind(snap: EngineSnapshot) -> str:
    """What measures the devices: ``SIMULATED``, ``nvml``, ``host memory``, or several."""
    kinds = dict.fromkeys(g.kind if g.kind != "GPU" else (snap.source.split("+")[0] or "GPU")
                          for g in snap.gpus)
    return " + ".join(kinds) or ("SIMULATED" if snap.simulated else snap.source or "GPU")


def simulated_note(snap: EngineSnapshot, backends: Iterable[str] | None = None) -> str | None:
    """The line that says which memory figures are SIMULATED, for the commands that show
    figures without the devices beside them (``jobs``, ``backends``, ``events``): every
    figure (the engine simulates its GPUs), those of some GPUs, or those of backends that
    declare themselves simulated (of ``backends`` only, when given); None: all are real.
    The one place that words it (the TUI's dashboard says the same)."""
    if snap.simulated:
        return "memory figures are SIMULATED (the engine runs on a simulated GPU)"
    where = [f"GPU{g.index}" for g in snap.gpus if g.simulated]
    shown = None if backends is None else set(backends)
    names = [b.name for b in snap.backends
             if b.simulated and (shown is None or b.name in shown)]
    parts = ([f"on {', '.join(where)}"] if where else []) + \
        ([f"of {', '.join(names)}"] if names else [])
    return f"memory figures {' and '.join(parts)} are SIMULATED" if parts else None


def show_simulated_note(snap: EngineSnapshot, backends: Iterable[str] | None = None) -> None:
    """:func:`simulated_note` on its own line, when there is one."""
    note = simulated_note(snap, backends)
    if note is not None:
        from .plain import show

        show((note, "bold magenta"))


def gpu_table(snap: EngineSnapshot) -> Table:
    table = Table("GPUs", [(c, "l" if c == "name" else "r") for c in (
        "GPU", "name", "used / total", "reserved", "ours", "others", "budget", "util",
        "temp")])
    for g in snap.gpus:
        used = f"{mib_text(g.used_mib)} / {mib_text(g.total_mib)}"
        name: Cell = g.name
        if g.yielded_by is not None:
            name = (f"{g.name} ({g.yielded_text})", "bold yellow")
        elif g.draining:
            name = (f"{g.name} (draining)", "bold yellow")
        others = mib_text(g.foreign_mib)
        if g.others_mib and g.others_mib != g.foreign_mib:
            others += f" ({mib_text(g.others_mib)} held back)"
        table.add_row(str(g.index), name, used,
                      mib_text(g.reserved_mib), mib_text(g.ours_mib), others,
                      mib_text(g.budget_mib),
                      "–" if g.util_pct is None else f"{g.util_pct} %",
                      "–" if g.temp_c is None else f"{g.temp_c} °C")
    return table


def process_table(snap: EngineSnapshot) -> Table | None:
    """Each GPU's processes: ours by backend, the others by name (None: there are none)."""
    table = Table("Processes on the GPUs", [("GPU", "r"), ("pid", "r"), ("user", "l"),
                                             ("memory", "r"), ("backend", "l")])
    for g in snap.gpus:
        for p in g.processes:
            table.add_row(str(g.index), str(p.pid), p.user, mib_text(p.used_mib),
                          p.backend if p.backend else (f"others: {p.name or '?'}", "magenta"))
    return table if table.rows else None


def backend_table(snap: EngineSnapshot, *, wide: bool = False) -> Table:
    cols = ["backend", "state", "pid", "GPU", "peak", "observed", "queued", "running",
            "served"]
    if wide:
        cols += ["p95", "priority", "keep-alive", "description"]
    table = Table("Backends", [(c, "l" if c in ("backend", "state", "description") else "r")
                               for c in cols])
    hosts = {g.index for g in snap.gpus if g.host}
    for b in snap.backends:
        learned = b.declared_peak_mib is None and b.peak_mib is not None
        peak = mib_text(b.peak_mib) + (" (learned)" if learned else "")
        state: Cell = (b.state + (" over peak!" if b.over_declared else ""),
                       "bold red" if b.over_declared else WORKER_STYLE.get(b.state, ""))
        row: list[Cell] = [b.name, state, str(b.pid or "–"),
                           "–" if b.gpu is None else str(b.gpu), peak,
                           mib_text(b.observed_mib)
                           + (" host memory" if b.gpu in hosts and b.observed_mib is not None
                              else ""),
                           str(b.queued), str(b.running), str(b.jobs_served)]
        if wide:
            keep = "pinned" if b.pinned else b.held or seconds_text(b.keep_alive_left_s)
            row += [mib_text(b.observed_p95_mib), str(b.priority), keep, b.description]
        table.add_row(*row)
    return table


def queue_table(jobs: tuple[JobView, ...], now: float) -> Table:
    """``now``: the snapshot's ``taken_at`` (the jobs' times are the engine's clock's)."""
    table = Table("Queue", [(c, "r" if c in ("#", "priority", "passed", "age") else "l")
                            for c in ("#", "job", "backend", "priority", "waiting", "passed",
                                      "age")])
    for j in jobs:
        table.add_row(str(j.position or "–"), j.id, j.backend, str(j.priority),
                      j.waiting or "–", str(j.passed),
                      seconds_text(max(0.0, now - j.submitted_at)))
    return table


def jobs_table(jobs: tuple[JobView, ...], title: str = "Jobs") -> Table:
    table = Table(title, [(c, "r" if c in ("GPU", "peak", "took") else "l")
                          for c in ("job", "backend", "state", "progress", "GPU", "peak",
                                    "took", "note")])
    for j in jobs:
        if j.finished:  # its last progress text is history, not its state
            progress = "–"
            note = j.error or ""
        else:
            progress = "–" if j.progress is None else f"{j.progress * 100:.0f} %"
            note = j.progress_text or j.waiting or ""
        if j.kind != "job":  # a calibration: it holds its GPU as a job does
            note = f"{j.kind}: {note}" if note else j.kind
        table.add_row(j.id, j.backend, state_text(j.state), progress,
                      "–" if j.gpu is None else str(j.gpu), mib_text(j.peak_mib),
                      seconds_text(job_duration(j)), note)
    return table
