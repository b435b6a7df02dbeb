"""`JobsTable`: the dashboard's jobs (running, queued, recent), marks for acting on several;
`job_time` says how long a job ran, runs or has waited.  A note (why a job waits, its progress
text, its error) too long for its column is cut there; `cut_note` gives it whole, for the line
the dashboard shows under the table.  The rows are bounded: the running jobs, the first
`QUEUED_SHOWN` queued ones that match the filter (the filter finds any other) and the last
finished ones, so a queue of thousands costs what a few hundred do.
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding

from supervisor.jobs import JobState, JobView
from supervisor.snapshot import EngineSnapshot

from .. import fmt
from ..fmt import Clocks
from .cells import compact_sizes, trim
from .row_table import Col, RowTable


def job_time(j: JobView, now: float) -> str:
    """How long it ran (finished: its last run only), runs or has waited; ``now`` is wall
    clock, like every time a view carries."""
    if j.state.finished:
        ran = j.ran_s
        return fmt.dur(ran) if ran is not None else "–"
    if j.state is JobState.RUNNING and j.started_at is not None:
        return fmt.dur(now - j.started_at)
    return fmt.dur(now - j.submitted_at)


class JobsTable(RowTable):
    QUEUED_SHOWN = 200  # queued rows at most (a queue of 5,000 took 0.5 s a refresh)
    MARKS = True
    LOSES_SELECTION = True  # a job that left the table is never replaced by another
    BINDINGS = [Binding("space", "toggle_mark", "Mark", show=False, id="mark",
                        tooltip="Mark the job (c then cancels every marked one)")]
    COLUMNS = (
        Col("id", "Job", 12),
        Col("backend", "Backend", 12, narrow_width=11),
        Col("state", "State", 10),
        Col("progress", "Progress", 13, narrow_width=10),
        Col("time", "Time", 6, narrow_width=5),
        Col("prio", "Pri", 3, narrow=False),
        Col("pos", "Pos", 3, narrow=False),
        Col("passed", "Pass", 4, narrow=False),
        Col("gpu", "GPU", 3, narrow=False),
        Col("note", "Note", None),
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._notes: dict[str, Text] = {}  # job id -> its whole note, where the column cuts it
        self.queued_hidden = 0  # queued jobs that match but are past QUEUED_SHOWN

    def cut_note(self, key: str | None) -> Text | None:
        """The whole note of job ``key`` when its column shows only a part of it."""
        return self._notes.get(key) if key is not None else None

    def rows_for(self, snap: EngineSnapshot, query: str, clocks: Clocks, recent: int
                 ) -> list[tuple[str, dict[str, object]]]:
        now = fmt.engine_now(snap, clocks)
        rows = []
        self._notes = {}
        bar_w = 5 if self.narrow else 8
        note_w = self.last_width()
        queued = [j for j in snap.queued if fmt.matches(query, j.id, j.backend, j.state.value)]
        self.queued_hidden = max(0, len(queued) - self.QUEUED_SHOWN)
        jobs = [*(j for j in snap.running if fmt.matches(query, j.id, j.backend, j.state.value)),
                *queued[:self.QUEUED_SHOWN],
                *(j for j in snap.recent[:recent]
                  if fmt.matches(query, j.id, j.backend, j.state.value))]
        for j in jobs:
            t = job_time(j, now)
            sig = (j.state, j.progress, j.progress_text, j.position, j.passed, j.gpu,
                   j.waiting, j.error, j.status_code, j.priority, t, bar_w, note_w)
            row = self.memo(j.id, sig, lambda j=j, t=t: self._row(j, t, bar_w, note_w))
            if row["whole"] is not None:
                self._notes[j.id] = row["whole"]  # type: ignore[assignment]
            rows.append((j.id, row))
        return rows

    def _row(self, j: JobView, t: str, bar_w: int, note_w: int) -> dict[str, object]:
        state = fmt.state_text(j.state.value, fmt.JOB_STATE_STYLE)
        if j.state is JobState.QUEUED and j.position is not None:
            state.append(f" #{j.position}", style="yellow")
        if j.state in (JobState.RUNNING, JobState.STARTING):
            progress = fmt.progress_bar(j.progress, bar_w)
            whole, short, style = j.progress_text, j.progress_text, ""
        elif j.state is JobState.QUEUED:
            progress = Text("")
            whole, short, style = j.waiting, compact_sizes(j.waiting), "dim"
        else:  # finished: its last progress text is history (the job screen keeps it)
            progress = Text(f"HTTP {j.status_code}" if j.status_code else "",
                            style="green" if j.state is JobState.SUCCEEDED else "red")
            whole, short, style = j.error, j.error, "red"
        shown = trim(short, note_w)
        note = Text(shown, style=style if shown else "")
        cut = bool(shown) and shown != " ".join((short or "").split())
        return {
            "whole": Text(" ".join((whole or "").split()),
                          style="red" if style == "red" else "") if cut else None,
            "id": j.id,
            "backend": j.backend,
            "state": state,
            "progress": progress,
            "time": t,
            "prio": str(j.priority),
            "pos": str(j.position) if j.position is not None else "",
            "passed": str(j.passed) if j.passed else "",
            "gpu": str(j.gpu) if j.gpu is not None else "",
            "note": note,
        }
