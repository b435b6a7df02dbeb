"""`EngineHeader`: the one-line header of every screen (engine mode, GPU source with
SIMULATED unmissable, uptime, queue depth, the clock).
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from supervisor.snapshot import EngineSnapshot

from .. import fmt
from ..fmt import Clocks


class EngineHeader(Widget):
    """One line: engine mode, GPU source (SIMULATED unmissable), uptime, queue depth, clock."""

    def __init__(self, mode: str, clocks: Clocks, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.mode = mode
        self.clocks = clocks
        self.snap: EngineSnapshot | None = None
        self.gone: str | None = None
        self.readonly = False

    def show(self, snap: EngineSnapshot | None, gone: str | None, readonly: bool) -> None:
        self.snap, self.gone, self.readonly = snap, gone, readonly
        text = self._text()
        if self._shown is None or text.plain != self._shown.plain or text.spans != \
                self._shown.spans:
            self._shown = text
            self.refresh()

    _shown: Text | None = None

    def render(self) -> Text:
        if self._shown is None:
            self._shown = self._text()
        return self._shown

    def on_resize(self) -> None:
        self._shown = self._text()

    def _text(self) -> Text:
        width = self.size.width
        snap = self.snap
        short = 0 < width < 100  # 80 columns: the same facts, in fewer cells
        if 0 < width < 60:
            return self._tiny(snap, width)
        t = Text(no_wrap=True, overflow="ellipsis")
        sep = (" │ " if short else "  │  ", "dim")
        t.append(" vramtui ", style="bold reverse")
        t.append("  ")
        t.append("embedded" if self.mode == "embedded" else "attached", style="bold")
        if snap is not None:  # from each snapshot: an engine that restarted has a new pid
            t.append(f" pid {snap.pid}", style="dim")
        if self.readonly:
            t.append("  ")
            t.append(" READ-ONLY ", style="bold reverse blue")
        t.append(*sep)
        if snap is None:
            t.append("connecting…", style="dim")
        elif snap.simulated:
            t.append(" SIM GPU " if short else " SIMULATED GPU ", style=fmt.SIM_BADGE)
        else:
            drv = f" driver {snap.driver_version}" if snap.driver_version else ""
            kinds = [("HOST MEMORY" if k == "host" else k.upper())
                     for k in (snap.source or "GPU").split("+")]
            t.append(" + ".join(kinds) + drv, style="bold green")
        if self.gone is not None:
            t.append("  ")
            t.append(f" ENGINE GONE: {self.gone} ", style="bold reverse red")
        if snap is not None:
            t.append(*sep)
            t.append(f"{'' if short else 'up '}{fmt.dur(snap.uptime_s)}", style="")
            yielded = [g.index for g in snap.gpus if g.yielded_by is not None]
            if yielded:
                t.append("  ")
                t.append(" YIELDED " + ",".join(f"GPU{i}" for i in yielded) + " ",
                         style="bold reverse yellow")
            draining = [g.index for g in snap.gpus if g.draining]
            if draining:
                t.append("  ")
                t.append(" DRAINING " + ",".join(f"GPU{i}" for i in draining) + " ",
                         style="bold reverse yellow")
            running = len(snap.running)
            t.append("  queue " if not short else "  queued ", style="dim")
            t.append(str(len(snap.queued)), style="bold yellow" if snap.queued else "bold")
            t.append("  running " if not short else " running ", style="dim")
            t.append(str(running), style="bold cyan" if running else "bold")
            if snap.descriptor_errors:
                n = len(snap.descriptor_errors)
                t.append(f"  ⚠ {n}" + ("" if short else
                                       f" descriptor error{'s' if n > 1 else ''}"),
                         style="bold red")
            if snap.stopping:
                t.append("  stopping…", style="bold #c678dd")
        clock = self.clocks.hms(self.clocks.wall())
        pad = width - t.cell_len - len(clock) - 1
        if pad > 0:
            t.append(" " * pad)
            t.append(clock + " ", style="dim")
        return t

    def _tiny(self, snap: EngineSnapshot | None, width: int) -> Text:
        """Under 60 columns, only what must never be cut: a simulated device, an engine
        gone, the read-only mode (the full line put them past the edge at 20x6); in 36 or less,
        in their short words."""
        long = width >= 37
        t = Text(no_wrap=True, overflow="ellipsis")
        badges = []
        if snap is not None and snap.simulated:
            badges.append((" SIMULATED " if long else " SIM ", fmt.SIM_BADGE))
        if self.gone is not None:
            badges.append((" ENGINE GONE " if long else " GONE ", "bold reverse red"))
        if self.readonly:
            badges.append((" READ-ONLY " if long else " RO ", "bold reverse blue"))
        for text, style in badges:
            t.append(text, style=style)
            t.append(" ")
        if snap is not None:
            t.append(f"q {len(snap.queued)} r {len(snap.running)}", style="dim")
        return t
