"""`JobsTable`: the dashboard's jobs (running, queued, recent), marks for acting on several;
`job_time` says how long a job ran, runs or has waited.
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

    def rows_for(self, snap: EngineSnapshot, query: str, clocks: Clocks, recent: int
                 ) -> list[tuple[str, dict[str, object]]]:
        now = clocks.wall()
        rows = []
        bar_w = 5 if self.narrow else 8
        note_w = self.last_width()
        jobs = [*snap.running, *snap.queued, *snap.recent[:recent]]
        for j in jobs:
            if not fmt.matches(query, j.id, j.backend, j.state.value):
                continue
            t = job_time(j, now)
            sig = (j.state, j.progress, j.progress_text, j.position, j.passed, j.gpu,
                   j.waiting, j.error, j.status_code, j.priority, t, bar_w, note_w)
            rows.append((j.id, self.memo(j.id, sig, lambda j=j, t=t: self._row(
                j, t, bar_w, note_w))))
        return rows

    def _row(self, j: JobView, t: str, bar_w: int, note_w: int) -> dict[str, object]:
        state = fmt.state_text(j.state.value, fmt.JOB_STATE_STYLE)
        if j.state is JobState.QUEUED and j.position is not None:
            state.append(f" #{j.position}", style="yellow")
        if j.state in (JobState.RUNNING, JobState.STARTING):
            progress = fmt.progress_bar(j.progress, bar_w)
            note = Text(trim(j.progress_text, note_w))
        elif j.state is JobState.QUEUED:
            progress = Text("")
            note = Text(trim(compact_sizes(j.waiting), note_w), style="dim")
        else:  # finished: its last progress text is history (the job screen keeps it)
            progress = Text(f"HTTP {j.status_code}" if j.status_code else "",
                            style="green" if j.state is JobState.SUCCEEDED else "red")
            note = Text(trim(j.error, note_w), style="red") if j.error else Text("")
        return {
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
