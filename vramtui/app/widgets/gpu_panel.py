"""`GpuPanel`: one GPU on the dashboard — its title with util/temp/power, the memory bar,
the bar's legend and the history graph.
"""

from __future__ import annotations

from textual.containers import Vertical
from textual.content import Content

from supervisor.snapshot import GpuView

from .history_graph import HistoryGraph
from .line import Line
from .mem_bar import MemBar, legend
from .titles import titles


def gpu_stats(g: GpuView) -> str:
    if g.simulated:
        return "[b yellow on #8b008b] SIMULATED [/] no util/temp/power"
    if g.host:
        return "[b] host memory [/] PSS from /proc · no util/temp/power"
    parts = []
    parts.append(f"util {g.util_pct}%" if g.util_pct is not None else "util n/a")
    parts.append(f"{g.temp_c} °C" if g.temp_c is not None else "temp n/a")
    parts.append(f"{g.power_w:.0f} W" if g.power_w is not None else "power n/a")
    return " · ".join(parts)


class GpuPanel(Vertical):
    """One GPU: title with util/temp/power, the memory bar, its legend, the history graph."""

    def __init__(self, index: int, **kwargs: object) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-panel", **kwargs)  # type: ignore[arg-type]
        self.index = index
        self.bar = MemBar(classes="membar")
        self.legend = Line(classes="legend")
        self.graph = HistoryGraph(classes="graph")
        self._legend_key: object = None

    def compose(self):  # type: ignore[no-untyped-def]
        yield self.bar
        yield self.legend
        yield self.graph

    def show(self, g: GpuView, window_s: float, short: bool) -> None:
        # (the name is the driver's, who yielded it anyone's: text, never markup)
        sim = (" ", (" SIM ", "b yellow on #8b008b")) if g.simulated else ()
        drain = (" ", (" DRAINING ", "b reverse yellow")) if g.draining else ()
        if g.yielded_by is not None:
            drain = (" ", (f" {g.yielded_text.upper()} ", "b reverse yellow"))
        titles(self, Content.assemble(f"{'HOST' if g.host else 'GPU'}{g.index} · ", g.name,
                                      *sim, *drain), gpu_stats(g))
        self.bar.show(g)
        key = (g.ours_mib, g.reserved_mib, g.foreign_mib, g.total_mib, g.budget_mib, short)
        if key != self._legend_key:
            self._legend_key = key
            self.legend.set(legend(g, short=short))
        if self.graph.display:
            self.graph.show(g.history, g.total_mib, g.total_mib - g.reserve_mib, window_s)
