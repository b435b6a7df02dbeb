"""Writing a one-backend overlay file (e.g. calibrated VRAM figures), atomically.

The file holds ``name:``, ``overlay: true`` and the given fields in descriptor spelling; put it
in a layer after the backend's own file (``backends.d/``) and it overrides just those keys.
Being an overlay, it never defines a backend on its own (see ``loader``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..atomicfile import write_atomic
from .errors import unknown_key_message
from .schema import NAME_RE, TOP_KEYS


def _plain(value: Any) -> Any:
    """Something ``yaml.safe_dump`` can write: tuples to lists, paths to strings."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, float) and math.isinf(value) and value > 0:
        return "never"
    return value


def write_overlay(
    path: str | Path,
    name: str,
    fields: Mapping[str, Any],
    *,
    comment: str | None = None,
) -> Path:
    """Write ``{name: <name>, **fields}`` to ``path`` atomically (temp file, then rename).

    ``fields`` use the descriptor spelling (``vram: {peak: 8GiB}``, ``keep_alive: 10m`` …);
    unknown keys raise ``ValueError``. ``comment`` lines go at the top as ``# …``.
    An existing file's permissions are kept; a new one gets 0644.
    """
    return write_atomic(Path(path), overlay_text(name, fields, comment=comment), sync_dir=True)


def overlay_text(name: str, fields: Mapping[str, Any], *, comment: str | None = None) -> str:
    """The YAML of a one-backend overlay (what ``write_overlay`` writes); ``ValueError`` for a
    bad name or an unknown key."""
    if not NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a backend name")
    for key in fields:
        if key not in TOP_KEYS or key == "name":
            raise ValueError(unknown_key_message(key, TOP_KEYS - {"name"}))
    document = {"name": name, "overlay": True, **_plain(dict(fields))}
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False)
    if comment:
        text = "".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines()) + text
    return text
