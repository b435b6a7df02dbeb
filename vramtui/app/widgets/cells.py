"""Text for table cells that must fit: `trim` to a width (at a word boundary), and
`compact_sizes` (``13056 MiB`` -> ``12.8G``).
"""

from __future__ import annotations

import re

from .. import fmt

_MIB = re.compile(r"\b(\d{4,}) MiB\b")


def compact_sizes(text: str) -> str:
    """``needs 13056 MiB`` -> ``needs 12.8G`` (a number and its unit are never cut apart)."""
    return _MIB.sub(lambda m: fmt.mib(int(m.group(1)), compact=True), text)


def trim(text: str | None, n: int) -> str:
    """``text`` in ``n`` cells: cut at a word boundary when it can be, with an ellipsis."""
    if not text:
        return ""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    cut = text[: n - 1]
    space = cut.rfind(" ")
    if space >= n // 2:
        cut = cut[:space].rstrip(" ;,:")
    return cut + "…"
