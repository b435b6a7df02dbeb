"""What the API shows of descriptors and calibration reports (read on the engine's side).

- :func:`describe`: a backend's layers — each file's entry that names it, lowest first, as
  YAML with its file and line — and the descriptor the engine runs with now (``effective``,
  which includes what a calibration overlay set).
- :func:`read_report`: a backend's latest (or a named) calibration report from the state
  directory, as the JSON bytes the engine wrote.

Both read files, so they run off the engine loop; faces get their results through the API
and never open the engine's files themselves (an attached TUI may not be able to).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .backends.schema import HOST_GPU
from .errors import NoReport, VramtuiError
from .paths import MAX_REPORT_BYTES, parse_report_name, read_bounded
from .results import DescriptorInfo, DescriptorLayer, ReportFile
from .units import format_seconds, format_size_mib


def _plain(value: Any) -> Any:
    """YAML-loaded values (line-keeping dicts and lists) as plain ones, for dumping."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _dump(value: Any) -> str:
    import yaml

    return yaml.safe_dump(_plain(value), sort_keys=False, allow_unicode=True,
                          default_flow_style=False, width=100).rstrip()


def spec_document(spec: Any) -> dict[str, Any]:
    """A :class:`BackendSpec` as the keys of a descriptor (sizes in MiB, times in s)."""
    out: dict[str, Any] = {"name": spec.name}
    if spec.description:
        out["description"] = spec.description
    out["command"] = list(spec.command)
    out["cwd"] = str(spec.cwd)
    if spec.env:
        out["env"] = dict(spec.env)
    vram = {k.removesuffix("_mib"): format_size_mib(v) for k, v in
            dataclasses.asdict(spec.vram).items() if v is not None}
    out["vram"] = vram or "unmeasured (runs alone on a GPU until measured)"
    out["safety"] = format_size_mib(spec.safety_mib)
    out["priority"] = spec.priority
    out["gpus"] = ["host" if g == HOST_GPU else g for g in spec.gpus] \
        if spec.gpus is not None else "any"
    out["keep_alive"] = ("forever" if math.isinf(spec.keep_alive_s)
                         else format_seconds(spec.keep_alive_s))
    for key in ("pinned", "stream", "inline_results", "concurrency", "simulated"):
        out[key] = getattr(spec, key)
    t = spec.timeouts
    out["timeouts"] = {"start": format_seconds(t.start_s),
                       "request": "none" if t.request_s is None else format_seconds(t.request_s),
                       "stop_grace": format_seconds(t.stop_grace_s)}
    if getattr(t, "ping_s", None) is not None:
        out["timeouts"]["ping"] = format_seconds(t.ping_s)
    if getattr(spec, "server", False):
        out["timeouts"]["idle"] = "none" if t.idle_s is None else format_seconds(t.idle_s)
    for key in ("on_overuse", "protocol"):
        if hasattr(spec, key):
            out[key] = getattr(spec, key)
    if not getattr(spec, "unload_frees_vram", True):
        out["unload_frees_vram"] = False
    for key in ("preload", "unlisted"):
        if getattr(spec, key, False):
            out[key] = True
    for key in ("api", "aliases"):
        if getattr(spec, key, ()):
            out[key] = list(getattr(spec, key))
    if getattr(spec, "listed_as", None) is not None:
        out["listed_as"] = spec.listed_as
    vramd = getattr(spec, "vramd", None)
    if getattr(spec, "protocol", None) == "vramd" and vramd is not None:
        out["vramd"] = {"load_keys": list(vramd.load_keys),
                        "event_timeout": "none" if vramd.event_timeout_s is None
                        else format_seconds(vramd.event_timeout_s)}
        if vramd.shape_keys is not None:
            out["vramd"]["shape_keys"] = list(vramd.shape_keys)
        if vramd.load_kwargs:
            out["vramd"]["load_kwargs"] = dict(vramd.load_kwargs)
    http = getattr(spec, "http", None)
    if http is not None:
        out["http"] = {"health": http.health or "none", "url": http.url}
        if http.model_name is not None:
            out["http"]["model_name"] = http.model_name
        if http.stop is not None:
            out["http"]["stop"] = list(http.stop)
        if http.ready_timeout_s is not None:
            out["http"]["ready_timeout"] = format_seconds(http.ready_timeout_s)
        for key in ("sleep", "wake"):
            if getattr(http, key, None) is not None:
                out["http"][key] = str(getattr(http, key))
    if spec.reload_cost_s is not None:
        out["reload_cost"] = format_seconds(spec.reload_cost_s)
    if getattr(spec, "wake_cost_s", None) is not None:
        out["wake_cost"] = format_seconds(spec.wake_cost_s)
    if getattr(spec, "target_wait_s", None) is not None:
        out["target_wait"] = format_seconds(spec.target_wait_s)
    sleep = getattr(spec, "sleep", None)
    if sleep is not None and sleep != type(sleep)():
        out["sleep"] = _sleep_view(sleep)
    if spec.calibration_request is not None:
        out["calibration"] = {"request": f"({len(spec.calibration_request)} bytes)"}
    return out


def _sleep_view(sleep: Any) -> Any:
    if not sleep.enabled:
        return False
    view: dict[str, Any] = {"level": sleep.level}
    for key in ("residual", "host"):
        value = getattr(sleep, f"{key}_mib")
        if value is not None:
            view[key] = format_size_mib(value)
    return view


def describe(backend: str, spec: Any, layers: Sequence[Path] | None,
             environ: Any, *, demo: bool = False) -> DescriptorInfo:
    """``backend``'s layers read from the descriptor files now (the demo's too while the engine
    runs on it), and its effective descriptor (``spec``, what the engine runs with)."""
    from .backends.errors import DescriptorError, display_path
    from .backends.loader import load_backends
    from .backends.raw import entries_of, entry_name
    from .backends.yamlio import load_documents

    found: list[DescriptorLayer] = []
    errors: list[str] = []
    if layers is not None:
        loaded = load_backends(layers, environ=environ, demo_fallback=demo)
        for file in loaded.layers:
            try:
                documents = load_documents(file)
            except DescriptorError:
                continue  # reported with the errors below
            for document in documents:
                for item in entries_of(document, file):
                    if isinstance(item, DescriptorError):
                        continue
                    entry, line = item
                    if entry_name(entry, file, line) == backend:
                        found.append(DescriptorLayer(display_path(file), line, _dump(entry)))
        files = {layer.file for layer in found}
        errors = [str(e) for e in loaded.errors if e.backend == backend
                  or (e.file is not None and display_path(e.file) in files)]
    return DescriptorInfo(backend, tuple(found), _dump(spec_document(spec)), tuple(errors))


def report_names(directory: Path, backend: str) -> list[str]:
    """The names of ``backend``'s reports in ``directory``, newest first."""
    found = []
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise VramtuiError(f"cannot list {directory}: {exc.strerror or exc}") from None
    for path in entries:
        parts = parse_report_name(path.name)
        if parts is not None and parts[0] == backend:
            found.append((parts[1], path.name))
    return [name for _stamp, name in sorted(found, reverse=True)]


def read_report(directory: Path, backend: str, name: str | None) -> ReportFile:
    """``backend``'s report ``name`` (a file name in ``directory``), else its latest."""
    names = report_names(directory, backend)
    if name is not None:
        if "/" in name or name not in names:
            raise NoReport(f"{backend} has no calibration report named {name!r}"
                           + (f" (its reports: {', '.join(names[:5])})" if names else ""))
    elif not names:
        raise NoReport(f"{backend} has not been calibrated yet (no report in {directory}); "
                       f"`vramtui calibrate {backend}` measures it")
    chosen = name or names[0]
    path = directory / chosen
    try:
        data = read_bounded(path, MAX_REPORT_BYTES)
    except OSError as exc:
        raise VramtuiError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_REPORT_BYTES:
        raise VramtuiError(f"{path} is over {MAX_REPORT_BYTES >> 20} MiB; open it by hand")
    return ReportFile(backend, chosen, str(path), data, len(names), tuple(names))
