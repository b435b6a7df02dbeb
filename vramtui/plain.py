"""Plain, fast text for the CLI's tables and lines: aligned columns and a few ANSI styles.

Importing rich costs ``vramtui status`` more than everything else it does (its console alone
is ~25 ms of a ~100 ms budget), so the commands that print tables use this instead; rich
stays for the richer reports (doctor, calibrate), imported only there.  Colour only on a
terminal, and never with ``NO_COLOR`` set or ``TERM=dumb``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO

Cell = str | tuple[str, str]  # text, or (text, style) with style like "bold red"

_SGR = {"bold": "1", "dim": "2", "italic": "3", "underline": "4", "reverse": "7",
        "red": "31", "green": "32", "yellow": "33", "blue": "34", "magenta": "35",
        "cyan": "36", "white": "37"}


def color_enabled(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    if "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def terminal_width(stream: TextIO | None = None) -> int | None:
    """The terminal's width when ``stream`` is one (else None: lines are never cut)."""
    stream = stream or sys.stdout
    try:
        if not stream.isatty():
            return None
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return None


def paint(text: str, style: str, color: bool) -> str:
    if not color or not style or not text:
        return text
    codes = [_SGR[w] for w in style.split() if w in _SGR]
    return f"\x1b[{';'.join(codes)}m{text}\x1b[0m" if codes else text


def _text(cell: Cell) -> tuple[str, str]:
    return (cell, "") if isinstance(cell, str) else cell


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


class Table:
    """A titled table; ``columns`` are (name, "l" or "r")."""

    def __init__(self, title: str, columns: Sequence[tuple[str, str]]) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows: list[list[tuple[str, str]]] = []

    def add_row(self, *cells: Cell) -> None:
        row = [_text(c) for c in cells]
        row += [("", "")] * (len(self.columns) - len(row))
        self.rows.append(row)

    def render(self, *, color: bool = False, width: int | None = None) -> str:
        widths = [len(name) for name, _ in self.columns]
        for row in self.rows:
            for i, (text, _style) in enumerate(row):
                widths[i] = max(widths[i], len(text))
        gap = 2
        if width is not None:  # too wide for the terminal: narrow the left-aligned ones
            over = sum(widths) + gap * (len(widths) - 1) - width
            for i in sorted(range(len(widths)), key=lambda i: -widths[i]):
                if over <= 0:
                    break
                if self.columns[i][1] == "l" and widths[i] > 8:
                    take = min(over, widths[i] - 8)
                    widths[i] -= take
                    over -= take
        lines = [paint(self.title, "bold", color)] if self.title else []

        def line(cells: Sequence[tuple[str, str]], header: bool = False) -> str:
            out = []
            for (text, style), w, (_name, align) in zip(cells, widths, self.columns,
                                                        strict=False):
                text = _cut(text, w)
                padded = text.rjust(w) if align == "r" else text.ljust(w)
                out.append(paint(padded, "bold" if header else style, color))
            return (" " * gap).join(out).rstrip()

        lines.append(line([(name, "") for name, _ in self.columns], header=True))
        lines.append(paint((" " * gap).join("─" * w for w in widths), "dim", color))
        lines.extend(line(row) for row in self.rows)
        return "\n".join(lines)


def show(*items: Table | Cell, stream: TextIO | None = None, end: str = "\n") -> None:
    """Print tables and (styled) text on one line each run: ``show("a", ("b", "red"))``."""
    stream = stream or sys.stdout
    color = color_enabled(stream)
    width = terminal_width(stream)
    parts = []
    for item in items:
        if isinstance(item, Table):
            if parts:
                stream.write("".join(parts) + "\n")
                parts = []
            stream.write(item.render(color=color, width=width) + "\n")
        else:
            text, style = _text(item)
            parts.append(paint(text, style, color))
    if parts:
        stream.write("".join(parts) + end)
    stream.flush()
