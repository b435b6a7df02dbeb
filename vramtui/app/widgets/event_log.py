"""`EventLog`: the engine's log on the dashboard, with a mark for what each entry says
happened (`log_text`).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from supervisor.snapshot import LogLine

from .. import fmt
from ..fmt import Clocks
from .rewrap_log import RewrapLog

# The story of the queue at a glance: a mark for what each note says happened.
_MARKS = (("admitted", "▶ ", "green"), ("starting", "↑ ", "cyan"), ("evicting", "↓ ", "#c678dd"),
          ("finished", "✓ ", "green"), ("succeeded", "✓ ", "green"), ("calibrat", "◆ ", "cyan"),
          ("retrying", "↻ ", "cyan"), ("descriptors reloaded", "↻ ", "cyan"))


def log_text(line: LogLine, clocks: Clocks) -> Text:
    t = Text(no_wrap=False)
    t.append(clocks.hms(line.t) + " ", style="dim")
    marker = {"error": "✖ ", "warning": "▲ "}.get(line.level)
    if marker is None:
        head = line.text[:40].lower()
        found = next(((m, st) for word, m, st in _MARKS if word in head), None)
        if found is not None:
            t.append(found[0], style=found[1])
            t.append(line.text, style=fmt.LEVEL_STYLE.get(line.level, ""))
            return t
        marker = "· "
    style = fmt.LEVEL_STYLE.get(line.level, "")
    t.append(marker, style=style or "dim")
    t.append(line.text, style=style)
    return t


class EventLog(RewrapLog):
    """The engine's log (admissions, evictions, crashes, refusals), appended as it grows;
    a long entry wraps under its text, never under its time."""

    HANG = 11  # "HH:MM:SS · "

    def __init__(self, clocks: Clocks, **kwargs: object) -> None:
        super().__init__(max_lines=500, **kwargs)
        self.clocks = clocks
        self._last: tuple[float, str] | None = None
        self._query = ""

    def show(self, lines: Sequence[LogLine], query: str, wrap: bool = True) -> None:
        if query != self._query or wrap != self.wrap:
            self._query = query
            self.wrap = wrap
            self._last = None
            self.reset()
        start = 0
        if self._last is not None:
            for i in range(len(lines) - 1, -1, -1):
                if (lines[i].t, lines[i].text) == self._last:
                    start = i + 1
                    break
            else:
                start = next((i for i, x in enumerate(lines) if x.t > self._last[0]),
                             len(lines))
        for line in lines[start:]:
            if fmt.matches(query, line.text, line.backend, line.level):
                self.add(log_text(line, self.clocks))
        if lines:
            self._last = (lines[-1].t, lines[-1].text)
