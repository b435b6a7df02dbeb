"""Moving vramd descriptors over for good: a vramd file (or vramd's own layers) in our spelling.

``import_vramd`` reads vramd files as the loader does, except that ``${env:VAR}`` becomes our
``${VAR}`` (read when vramtui loads the result, so no secret lands in the file) instead of its
value; vramd's implicit defaults are written out (the working directory as ``cwd``, vramd's
384 MiB margin, its 300 s load timeout), since our format would default otherwise. The
result is checked the strongest way there is: loaded back with our own loader, it must give
the very backends the vramd file gives. ``vramd_sources`` are the files vramd itself reads.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import DescriptorError, DescriptorWarning, display_path
from .loader import _Collector, folder_files, working_directory
from .round_trip import check_round_trip
from .schema import anchor_paths
from .vramd import VramdContext

BACKENDS_FILE_ENV = "VRAMD_BACKENDS_FILE"
BACKENDS_DIR_ENV = "VRAMD_BACKENDS_DIR"
_KEY_ORDER = ("name", "description", "protocol", "command", "cwd", "env", "vram", "safety",
              "unload_frees_vram", "priority", "gpus", "timeouts", "vramd", "calibration")


@dataclass(frozen=True)
class Imported:
    """Our spelling of vramd backends: ``text`` (YAML) with what went wrong or was dropped."""

    text: str
    names: tuple[str, ...]
    errors: tuple[DescriptorError, ...]
    warnings: tuple[DescriptorWarning, ...]
    files: tuple[Path, ...]


def vramd_sources(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The descriptor files vramd reads, lowest first (its packaged one holds no backend):
    each of ``$VRAMD_BACKENDS_FILE`` (``os.pathsep``-separated), then the ``*.yaml``/``*.yml``
    of ``$VRAMD_BACKENDS_DIR`` (default ``~/.config/vramd/backends.d``) in name order."""
    home = environ.get("HOME") or os.path.expanduser("~")

    def expand(text: str) -> Path:
        return Path(home + text[1:] if text == "~" or text.startswith("~/") else text)

    sources = [expand(p.strip()) for p in environ.get(BACKENDS_FILE_ENV, "").split(os.pathsep)
               if p.strip()]
    raw_dir = environ.get(BACKENDS_DIR_ENV, "").strip()
    folder = expand(raw_dir) if raw_dir else Path(home) / ".config" / "vramd" / "backends.d"
    if folder.is_dir():
        sources += folder_files(folder)
    return sources


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _ordered(name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name}
    for key in _KEY_ORDER[1:]:
        if data.get(key) is not None:
            out[key] = _plain(data[key])
    for key, value in data.items():
        if key not in out and value is not None:
            out[key] = _plain(value)
    return out


def import_vramd(paths: Sequence[str | Path], *, environ: Mapping[str, str] = os.environ,
                 workdir: Path | None = None) -> Imported:
    """Our spelling of the backends of ``paths`` (vramd files, lowest layer first)."""
    workdir = workdir or working_directory()
    collector = _Collector(environ, VramdContext(environ=environ, workdir=workdir,
                                                 keep_env=True))
    for path in paths:
        collector.add_path(path)
    result = collector.finish()
    entries = []
    for name in result.backends:
        raw = collector.resolved[name]
        # Our own keys in a vramd file (script:, python: …) are relative to its folder.
        data = anchor_paths(raw.data, lambda key, raw=raw: raw.origin_of(key).file.parent,
                            environ)
        entries.append(_ordered(name, data))
    shown = ", ".join(display_path(f) for f in result.layers) or "nothing"
    lines = [f"# vramtui backends converted from vramd's {shown}",
             f"# by `vramtui import-vramd` on {time.strftime('%Y-%m-%d %H:%M')}. Relative paths",
             f"# were resolved from {workdir} as vramd resolves them (vramtui's own keys,",
             "# such as script:, from the file's folder); ${VAR} is read from the",
             "# environment when vramtui loads this file."]
    for warning in result.warnings:
        lines.append(f"# warning: {warning}")
    for error in result.errors:
        lines.append(f"# left out: {error}")
    body = yaml.safe_dump({"backends": entries}, sort_keys=False, allow_unicode=True,
                          width=100, default_flow_style=None) if entries else "backends: []\n"
    text = "\n".join(lines) + "\n" + body
    check_round_trip({"imported.yaml": text}, result.backends, environ)
    return Imported(text, tuple(result.backends), result.errors, result.warnings,
                    result.layers)
