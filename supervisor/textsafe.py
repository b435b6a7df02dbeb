"""Text that came from a process we run, made safe to show: one owner for it.

A worker's progress text and error, a model server's log tail: the faces print them to a
terminal (the TUI, the CLI, the engine's own log), where an escape sequence would act (clear
the screen, set the title, write the clipboard with OSC 52) and a line break would forge a log
line.  :func:`visible` writes every control character (C0, DEL, C1) and every bidirectional
override as a ``\\xNN``/``\\uNNNN`` escape, a tab as a space; line breaks are kept only where
the text may span lines.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEPING_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with nothing a terminal would act on (``lines``: line breaks kept)."""
    text = text.replace("\t", " ")
    return (_UNSAFE_KEEPING_LINES if lines else _UNSAFE).sub(_escape, text)
