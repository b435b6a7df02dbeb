"""`DetailScreen`: what the job and backend screens share — the back key and a worker's
log tail, read through the API (`LogTail`) and followed as it grows; `kv` lays out
their key-value boxes.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import work
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.widgets import RichLog

from supervisor.textsafe import visible

from .. import fmt
from ..widgets.rewrap_log import RewrapLog
from ..widgets.titles import titles
from .snapshot_screen import SnapshotScreen


class LogTail:
    """The tail of a backend's worker log, read incrementally through the API (``logs``):
    the engine reads its own file, so an attached TUI needs no access to it.  Call from a
    thread."""

    FIRST_LINES = 300

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.path = f"{backend}.log"
        self.offset: int | None = None
        self._partial = b""
        # Two reads may overlap (a worker thread per snapshot; an "exclusive" worker's thread
        # is not stopped): one at a time, or both would hand over the same lines.
        self._lock = threading.Lock()

    def read(self, api: Any) -> tuple[list[str], str | None]:
        """New complete lines since the last call, and a note when there is no log (yet)."""
        with self._lock:
            return self._read(api)

    def _read(self, api: Any) -> tuple[list[str], str | None]:
        try:
            if self.offset is None:
                chunk = api.logs(self.backend, lines=self.FIRST_LINES)
            else:
                chunk = api.logs(self.backend, offset=self.offset)
        except Exception as exc:  # noqa: BLE001 - shown in the log box
            return [], f"(cannot read the log: {exc})"
        self.path = chunk.path or self.path
        if chunk.missing:
            return [], f"(no log yet: {fmt.short_path(chunk.path)})"
        first = self.offset is None or chunk.offset < (self.offset or 0)
        if first:
            self._partial = b""
        self.offset = chunk.offset
        lines = (self._partial + chunk.data).split(b"\n")
        self._partial = lines.pop()
        return [shown_line(ln) for ln in lines], None


_SGR = re.compile(r"\x1b\[[0-9;:]*m")


def shown_line(raw: bytes) -> str:
    """A line of a worker's log as the log box shows it: whatever the model's code printed
    (colours, a progress bar's carriage returns, a title or clipboard sequence) must not
    reach the terminal, where an escape sequence would act.  Colours are dropped, a line
    redrawn with ``\\r`` shows its last state (as a terminal would), and every other control
    character is written out (``supervisor.textsafe.visible``)."""
    text = _SGR.sub("", raw.decode(errors="replace")).rstrip("\r")
    return visible(text.rsplit("\r", 1)[-1])


def kv(rows: Iterable[tuple[str, Any]]) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, v if isinstance(v, Text) else Text(str(v)))
    return table


class DetailScreen(SnapshotScreen):
    """Shared parts of the job and backend screens: header, back key, a followed log tail."""

    BINDINGS = [
        Binding("escape,backspace", "back", "Back", id="back", tooltip="Back to the dashboard"),
        Binding("f", "follow", "Follow log", id="follow",
                tooltip="Keep the log at its end as it grows (toggle)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.tail: LogTail | None = None
        self.follow = True
        self.logs_read = False  # the first answer about the log has come

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_follow(self) -> None:
        self.follow = not self.follow
        log = self.query_one("#worker-log", RichLog)
        log.auto_scroll = self.follow
        if self.follow:
            log.scroll_end(animate=False)
        self._log_title()
        self.notify("following the log" if self.follow else "log paused at this point")

    def _log_title(self) -> None:
        log = self.query_one("#worker-log", RichLog)
        name = Path(self.tail.path).name if self.tail else "?"
        titles(log, f"Worker log · {name}",
               "following (f)" if self.follow else "paused (f to follow)")

    def read_log(self, backend: str) -> None:
        if self.tail is None or self.tail.backend != backend:
            self.tail = LogTail(backend)
            self.query_one("#worker-log", RewrapLog).reset()
            self._log_title()
        if self.follow or self.tail.offset is None:
            self._read_tail(self.tail)

    @work(thread=True, exclusive=True, group="tail")
    def _read_tail(self, tail: LogTail) -> None:
        lines, note = tail.read(self.vapp.api)
        self.vapp.ui(self._append_log, lines, note, tail)

    def _append_log(self, lines: list[str], note: str | None, tail: LogTail) -> None:
        if not self.is_mounted:
            return
        try:  # the screen may be on its way out (popped while the read was under way)
            self._log_title()
            log = self.query_one("#worker-log", RewrapLog)
        except NoMatches:
            return
        self.logs_read = True
        if note is not None:
            if not getattr(self, "_noted", False):
                log.add(Text(note, style="dim"))
                self._noted = True
            return
        for line in lines:
            log.add(Text(line))
