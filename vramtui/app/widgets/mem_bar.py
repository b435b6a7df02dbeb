"""`MemBar`: a GPU's memory as one bar (ours, reserved but unused, over, others, free);
`bar_segments` cuts a GPU view into those parts and `legend` names them.
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from supervisor.snapshot import GpuView

from .. import fmt


def bar_segments(g: GpuView) -> list[tuple[str, str, int, str]]:
    """The memory bar's parts: (label, char, MiB, style), in the order they are drawn."""
    ours = g.ours_mib
    reserved = g.reserved_mib
    foreign = g.foreign_mib or 0
    parts = [
        ("ours", "█", min(ours, reserved) if reserved else ours, fmt.SEG_OURS),
        ("reserved", "▒", max(0, reserved - ours), fmt.SEG_RESERVED),
        ("over", "▓", max(0, ours - reserved) if reserved else 0, fmt.SEG_OVER),
        ("others", "▞", foreign, fmt.SEG_FOREIGN),
    ]
    used = sum(p[2] for p in parts)
    parts.append(("free", "░", max(0, g.total_mib - used), fmt.SEG_FREE))
    return parts


class MemBar(Widget):
    """A bar of the GPU's total memory: ours, reserved-but-unused, over, others, free."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.gpu: GpuView | None = None

    def show(self, gpu: GpuView) -> None:
        old = self.gpu
        self.gpu = gpu
        if old is None or (old.ours_mib, old.reserved_mib, old.foreign_mib, old.total_mib,
                           old.used_mib) != (gpu.ours_mib, gpu.reserved_mib, gpu.foreign_mib,
                                             gpu.total_mib, gpu.used_mib):
            self.refresh()

    def render(self) -> Text:
        g = self.gpu
        if g is None:
            return Text("")
        used = g.used_mib if g.used_mib is not None else g.ours_mib + (g.foreign_mib or 0)
        label = f" {fmt.mib(used)} / {fmt.mib(g.total_mib)}"
        width = max(1, self.size.width - len(label))
        text = Text(no_wrap=True)
        cum = 0
        pos = 0
        total = max(1, g.total_mib)
        for _name, char, value, style in bar_segments(g):
            cum += value
            end = min(width, round(cum / total * width))
            if end > pos:
                text.append(char * (end - pos), style=style)
                pos = end
        if pos < width:
            text.append("░" * (width - pos), style=fmt.SEG_FREE)
        text.append(label, style="bold")
        return text


def legend(g: GpuView, *, short: bool = False) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    for name, char, value, style in bar_segments(g):
        if name == "over" and value == 0:
            continue
        if name == "others" and g.foreign_mib is None:
            t.append(f"{char} others n/a  ", style="dim")
            continue
        t.append(char, style=style)
        t.append(f" {name} ", style="dim")
        t.append(fmt.mib(value, compact=short), style="bold")
        if name == "others" and value and not short and g.strangers:
            t.append(" (" + ", ".join(f"{p.name or '?'} {p.pid}" for p in g.strangers[:2])
                     + ")", style="dim")
        t.append("  ")
    t.append("budget " if short else "budget left ", style="dim")
    t.append(fmt.mib(g.budget_mib, compact=short), style="bold yellow")
    return t
