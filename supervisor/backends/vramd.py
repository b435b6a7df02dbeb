"""Reading vramd's descriptor format (``version: 2``) as our own.

A vramd backend entry is rewritten into our spelling, keeping each key's line:
``vram_mib`` → ``vram.peak``, ``runtime.command``/``env``/``cwd`` → ``command``/``env``/``cwd``,
``calibrate_request`` → ``calibration.request``, ``gpu_ids`` → ``gpus``. Keys that are ours
too (``priority``, ``description``, ``keep_alive`` …) pass through; vramd-only keys (``adapter``,
``load_keys``, ``shape_keys``, ``calibrate_load_kwargs`` …) are dropped without complaint, since
vramd may grow keys we do not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .schema import TOP_KEYS
from .yamlio import LinedDict

VRAMD_VERSION = 2
_RUNTIME_KEYS = ("command", "env", "cwd")


def _put(target: LinedDict, key: str, value: Any, line: int | None) -> None:
    target[key] = value
    if line is not None:
        target.key_lines[key] = line


def _line(source: Mapping[Any, Any], key: Any) -> int | None:
    return source.key_line(key) if isinstance(source, LinedDict) else None


def from_vramd(entry: Mapping[Any, Any]) -> LinedDict:
    """Our form of one vramd v2 backend entry (a mapping)."""
    out = LinedDict(line=entry.line if isinstance(entry, LinedDict) else None)
    for key, value in entry.items():
        line = _line(entry, key)
        if key == "vram_mib":
            vram = LinedDict(line=line)
            _put(vram, "peak", value, line)
            _put(out, "vram", vram, line)
        elif key == "runtime" and isinstance(value, Mapping):
            for sub in _RUNTIME_KEYS:
                if sub in value:
                    _put(out, sub, value[sub], _line(value, sub))
        elif key == "calibrate_request":
            calibration = LinedDict(line=line)
            _put(calibration, "request", value, line)
            _put(out, "calibration", calibration, line)
        elif key == "gpu_ids":
            _put(out, "gpus", value, line)
        elif key in TOP_KEYS and key not in out:
            _put(out, key, value, line)
    return out
