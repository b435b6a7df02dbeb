"""`RewrapLog`: a log box that wraps its lines again when its width changes (the worker
logs of the detail screens; the base of the event log).
"""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widgets import RichLog


class RewrapLog(RichLog):
    """A RichLog that keeps what it was given and wraps it again when its width changes
    (a RichLog wraps each line once, at the width it had when the line came)."""

    def __init__(self, max_lines: int = 1000, **kwargs: object) -> None:
        super().__init__(wrap=True, markup=False, highlight=False, max_lines=max_lines,
                         min_width=20, **kwargs)  # type: ignore[arg-type]
        self._source: deque[Text] = deque(maxlen=max_lines)
        self._wrapped_at = 0

    def add(self, text: Text) -> None:
        self._source.append(text)
        self._write(text)

    HANG = 0  # cells of hanging indent for the lines a long entry wraps onto

    def _write(self, text: Text) -> None:
        width = self.scrollable_content_region.width
        if self.wrap and self._size_known and width > 0:
            if self.HANG and text.cell_len > width > self.HANG + 10:
                head, rest = text[: self.HANG], text[self.HANG:]
                lines = rest.wrap(self.app.console, width - self.HANG)
                out = Text()
                for i, line in enumerate(lines):
                    out.append_text(head if i == 0 else Text(" " * self.HANG))
                    out.append_text(line)
                    if i + 1 < len(lines):
                        out.append("\n")
                self.write(out, width=width)
            else:
                self.write(text, width=width)
        else:
            self.write(text)

    def reset(self) -> None:
        self._source.clear()
        self.clear()

    def on_resize(self) -> None:
        self.call_after_refresh(self._rewrap)

    def _rewrap(self) -> None:
        width = self.scrollable_content_region.width
        if width and width != self._wrapped_at:
            self._wrapped_at = width
            self.clear()
            for text in self._source:
                self._write(text)
