"""Moving a llama-swap ``config.yaml`` over for good: one descriptor file per model.

``import_llama_swap`` reads the file as the loader does (:mod:`.llama_swap`) and spells each
model's backend in our YAML, ``${env.X}`` kept as our ``${X}`` (read when vramtui loads the
file, so no secret lands in it).  The result is checked the strongest way there is: each file,
loaded back with our own loader, must give the very backend the llama-swap file gives.
Writing is the caller's (:func:`supervisor.atomicfile.write_atomic`, one file per backend).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import DescriptorError, DescriptorWarning, display_path
from .loader import _Collector, working_directory
from .round_trip import check_round_trip
from .schema import anchor_paths
from .vramd import VramdContext


@dataclass(frozen=True)
class ImportedModels:
    """Our descriptors of a llama-swap file: ``files`` maps a file name (``NAME.yaml``) to
    its text; what was not mapped (``warnings``) and the models left out (``errors``)."""

    files: dict[str, str]
    names: tuple[str, ...]
    warnings: tuple[DescriptorWarning, ...]
    errors: tuple[DescriptorError, ...]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def import_llama_swap(path: Path, *,
                      environ: Mapping[str, str] = os.environ) -> ImportedModels:
    """Our spelling of every model of the llama-swap file ``path``."""
    # (its servers run in the working directory, as llama-swap's run in its own)
    collector = _Collector(environ, VramdContext(environ=environ, workdir=working_directory()))
    collector.add_path(path)
    result = collector.finish()
    stamp = time.strftime("%Y-%m-%d %H:%M")
    files: dict[str, str] = {}
    for name in result.backends:
        # What is left relative (the file's folder, when the working directory is gone)
        # resolves where the loader takes it: the folder named, a link's own.
        folder = path.absolute().parent
        data = {"name": name, **anchor_paths(_plain(collector.resolved[name].data),
                                             lambda key, folder=folder: folder, environ)}
        lines = [f"# {name}: converted from llama-swap's {display_path(path)}",
                 f"# by `vramtui import-llama-swap` on {stamp}. ${{VAR}} is read from the",
                 "# environment when vramtui loads this file; ${PORT} is a free port the",
                 "# engine picks. Give 'vram:' (or run `vramtui calibrate " + name + "`) so",
                 "# that it can share a GPU; until then it runs alone."]
        lines += [f"# note: {w.message}" for w in result.warnings if w.backend == name]
        body = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100,
                              default_flow_style=None)
        files[f"{name}.yaml"] = "\n".join(lines) + "\n" + body
    check_round_trip(files, result.backends, environ)
    return ImportedModels(files, tuple(result.backends), result.warnings, result.errors)
