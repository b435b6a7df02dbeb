"""JSON that stays on one line, whatever splits the lines: one owner for it.

NDJSON, an SSE ``data:`` line and a JSONL command are framed by line breaks, and the readers
that split them do not all agree on what one is: Python's ``str.splitlines`` and httpx's
``iter_lines`` (the ``ollama`` client's) also break at U+2028, U+2029 and U+0085, which
``json.dumps(..., ensure_ascii=False)`` leaves raw inside strings; a token that is one of them
cut a streamed answer in two. :func:`dumps_line` writes them escaped (the same JSON value), and
everything else as UTF-8 text.
"""

from __future__ import annotations

import json
from typing import Any

_SEPARATORS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}
_TABLE = str.maketrans(_SEPARATORS)


def dumps_line(value: Any) -> str:
    """``value`` as compact JSON text on one line for every line splitter (raises as
    :func:`json.dumps` does)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.translate(_TABLE) if any(c in text for c in _SEPARATORS) else text
