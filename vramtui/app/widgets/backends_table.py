"""`BackendsTable`: the dashboard's backends, one row each (state, worker, memory, peak,
keep-alive, and a note: the peak to declare, or the last error).
"""

from __future__ import annotations

from rich.text import Text

from supervisor.snapshot import BackendView, EngineSnapshot
from vramtui.peaks import size_to_declare, suggested_peak_mib

from .. import fmt
from ..fmt import Clocks
from .cells import trim
from .row_table import Col, RowTable


def over_declared_note(b: BackendView, narrow: bool) -> Text:
    """(``narrow``: the short form, for a Note column under 40 cells.)"""
    """For a backend whose jobs use more than its declared peak: the peak to declare (observed
    p95 + 5 %, rounded up to 64 MiB, as ``vramtui backends`` suggests); else empty."""
    suggested = suggested_peak_mib(b)
    if suggested is None:
        return Text("")
    new = size_to_declare(suggested).replace(" GiB", "G").replace(" MiB", "M")
    if narrow:
        return Text(f"peak→{new}", style="bold yellow")
    return Text(f"p95 {fmt.mib(b.observed_p95_mib, compact=True)} > declared "
                f"{fmt.mib(b.declared_peak_mib, compact=True)}: set peak {new}",
                style="bold yellow")


class BackendsTable(RowTable):
    # A backend a reload removed is never replaced by its neighbour under the cursor: e, r, X
    # with --no-confirm would act on a backend nobody picked.
    LOSES_SELECTION = True
    COLUMNS = (
        Col("name", "Backend", 14, narrow_width=12),
        Col("state", "State", 13, narrow_width=12),
        Col("pid", "PID", 7, narrow_width=6),
        Col("gpu", "GPU", 3),
        Col("res", "Resident", 12, narrow_width=7),
        Col("peak", "Peak", 8, narrow_width=8),
        Col("prio", "Pri", 3, narrow=False),
        Col("jobs", "Served", 9, narrow=False),  # finished; ▸ running, +q queued: the state
        Col("last", "Last use", 9, narrow=False),
        Col("keep", "Keep", 6),
        Col("error", "Note", None),
    )

    def rows_for(self, snap: EngineSnapshot, query: str, clocks: Clocks
                 ) -> list[tuple[str, dict[str, object]]]:
        rows = []
        now = fmt.engine_now(snap, clocks)
        simulated = {g.index for g in snap.gpus if g.simulated}
        err_w = self.last_width()
        for b in snap.backends:
            # a simulated figure is always marked so, and only one (``--gpus sim:…,host``)
            mem_style = fmt.SIM_FIGURE if snap.simulated or b.gpu in simulated else ""
            if not fmt.matches(query, b.name, b.state, b.description):
                continue
            last = fmt.ago(now - b.last_used) if b.last_used is not None else "never"
            sig = (b, last, mem_style, err_w, self.narrow)
            rows.append((b.name, self.memo(b.name, sig, lambda b=b, last=last, style=mem_style:
                                             self._row(b, last, style, err_w))))
        return rows

    def _row(self, b: BackendView, last: str, mem_style: str, err_w: int
             ) -> dict[str, object]:
        name = Text(b.name)
        state = fmt.state_text(b.state, fmt.BACKEND_STATE_STYLE)
        room = self.column_width("state")
        for extra, style in ((f" ▸{b.running}" if b.running else "", "cyan"),
                             (f" +{b.queued}q" if b.queued else "", "yellow")):
            if extra and state.cell_len + len(extra) <= room:  # the state is never cut
                state.append(extra, style=style)
        peak = b.peak_mib
        peak_t = Text(fmt.mib(peak, compact=True), style=mem_style)
        if b.declared_peak_mib is None and b.learned_peak_mib is not None:
            peak_t.append("~", style="dim")  # learned, not declared
        if b.over_declared:
            peak_t = Text(fmt.mib(b.observed_p95_mib, compact=True) + "!", style="bold red")
        note = over_declared_note(b, self.narrow or err_w < 40)
        if b.last_error:
            if note.plain:
                note.append(" · ")
            note.append(trim(b.last_error, max(4, err_w - note.cell_len)), style="red")
        jobs = Text(str(b.jobs_served))
        keep = "pinned" if b.pinned else b.held or (
            fmt.dur(b.keep_alive_left_s) if b.keep_alive_left_s is not None else "")
        return {
            "name": name,
            "state": state,
            "pid": str(b.pid) if b.pid else "",
            "gpu": str(b.gpu) if b.gpu is not None else "",
            "res": Text(fmt.mib(b.observed_mib, compact=True)
                        if b.observed_mib is not None else "", style=mem_style),
            "peak": peak_t,
            "prio": str(b.priority),
            "jobs": jobs,
            "last": last,
            "keep": keep,
            "error": note,
        }
