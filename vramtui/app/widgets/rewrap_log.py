"""`RewrapLog`: a log box that wraps its lines again when its width changes (the worker
logs of the detail screens; the base of the event log).  It wraps between words but never
between a number and its unit (``10240 MiB``), and a line that comes while it is hidden
waits to be wrapped at the width it has when shown.
"""

from __future__ import annotations

import re
from collections import deque

from rich.text import Text
from textual.widgets import RichLog

# A number and the unit after it stay on one line: while wrapping, the space between them is
# this character (not a space to the wrapper; same width), and a space again after.
_GLUE = "\ue000"
_UNIT = re.compile(r"(?<=\d) (?=(?:[KMGT]i?B|ms|s|min|h|%|GPUs?|jobs?|steps?)\b)")


def _glued(text: Text) -> Text:
    plain = text.plain
    joined = _UNIT.sub(_GLUE, plain)
    if joined == plain:
        return text
    out = text.copy()
    out.plain = joined  # the same length: the styles stay where they were
    return out


def _unglued(text: Text) -> Text:
    if _GLUE in text.plain:
        text.plain = text.plain.replace(_GLUE, " ")
    return text


class RewrapLog(RichLog):
    """A RichLog that keeps what it was given and wraps it again when its width changes
    (a RichLog wraps each line once, at the width it had when the line came)."""

    def __init__(self, max_lines: int = 1000, **kwargs: object) -> None:
        super().__init__(wrap=True, markup=False, highlight=False, max_lines=max_lines,
                         min_width=20, **kwargs)  # type: ignore[arg-type]
        self._source: deque[Text] = deque(maxlen=max_lines)
        self._wrapped_at = 0
        self._pending = False  # lines came while it had no width (hidden): wrap when shown

    def add(self, text: Text) -> None:
        self._source.append(text)
        self._write(text)

    HANG = 0  # cells of hanging indent for the lines a long entry wraps onto

    def _write(self, text: Text) -> None:
        width = self.scrollable_content_region.width
        if self.wrap and (not self.display or not self._size_known or width <= 0):
            self._pending = True  # no width to wrap at yet: the rewrap when shown writes it
            return
        if self.wrap:
            hang = self.HANG if self.HANG and text.cell_len > width > self.HANG + 10 else 0
            head, rest = text[:hang], _glued(text[hang:])
            lines = rest.wrap(self.app.console, width - hang)
            out = Text()
            for i, line in enumerate(lines):
                out.append_text(head if i == 0 else Text(" " * hang))
                out.append_text(_unglued(line))
                if i + 1 < len(lines):
                    out.append("\n")
            self.write(out, width=width)
        else:
            self.write(text)

    def reset(self) -> None:
        self._source.clear()
        self.clear()

    def on_resize(self) -> None:
        self.call_after_refresh(self._rewrap)

    def rewrap(self) -> None:
        """Wrap everything again at the width it has now (after it was hidden)."""
        self.call_after_refresh(self._rewrap)

    def _rewrap(self) -> None:
        width = self.scrollable_content_region.width
        if width and (width != self._wrapped_at or self._pending):
            self._wrapped_at = width
            self._pending = False
            self.clear()
            for text in self._source:
                self._write(text)
