"""The engine's views as JSON values: one codec for HTTP and the CLI's ``--json``.

A view's JSON mirrors the view: each field of the dataclass is a key, a tuple an array,
nested views objects, an enum its value.  Bytes become text when they are UTF-8, else
``{"base64": ...}``; a NaN becomes null; user data (metadata, a worker's headers) is copied
without recursion (:func:`supervisor.plain.rebuild`).  So the same job has the same fields and
values from ``GET /v1/jobs``, ``vramtui jobs --json`` and the control socket's view of it, and
a field added to a view appears at every door.

Times: every view already carries wall-clock epoch seconds (the engine keeps its monotonic
clock inside; its one :class:`supervisor.clock.WallClock` converts at the view boundary).
:func:`epoch` is the one place a time becomes JSON, and it passes the time through: no door
converts a time again.

:mod:`supervisor.control.codec` is the other encoding of the same views, for the msgpack wire
(bytes stay bytes there).  This module imports only the view dataclasses: the CLI loads it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..jobs import JobView
from ..plain import rebuild

if TYPE_CHECKING:
    from ..events import EngineEvent
    from ..results import YieldInfo
    from ..snapshot import BackendView, EngineSnapshot, GpuView

_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobView))
RESULT_FIELDS = frozenset({"data", "headers", "chunks"})  # what the job returned
_TIMES = frozenset({"submitted_at", "started_at", "finished_at"})


def epoch(t: float | None) -> float | None:
    """A time of a view as JSON: epoch seconds, as the view already carries them."""
    return t


def leaf(value: Any) -> Any:
    """One value that is not a container, as JSON."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            import base64

            return {"base64": base64.b64encode(raw).decode()}
    if isinstance(value, float) and value != value:  # NaN
        return None
    if isinstance(value, enum.Enum):
        return value.value
    return value


def plain(value: Any, *, data_limit: int | None = None) -> Any:
    """Any engine view (a snapshot, a result of the API, a list or dict of them) as JSON
    values.  ``data_limit``: a job's data and chunks over this many bytes are left out (null
    and ``[]``), as the control socket's snapshot leaves them out."""
    if isinstance(value, JobView):
        return job_json(value, data_limit=data_limit)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name), data_limit=data_limit)
                for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v, data_limit=data_limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, data_limit=data_limit) for v in value]
    return leaf(value)


def job_json(view: JobView, *, history: bool = True, result: bool = True,
             data_limit: int | None = None) -> dict[str, Any]:
    """A job's view as JSON, field for field.  ``history``: with its history of states;
    ``result``: with what it returned (``data``, ``headers``, ``chunks``); ``data_limit``: as
    :func:`plain`."""
    out: dict[str, Any] = {}
    for name in _JOB_FIELDS:
        if (not result and name in RESULT_FIELDS) or (not history and name == "history"):
            continue
        value = getattr(view, name)
        if name in _TIMES:
            out[name] = epoch(value)
        elif name == "history":
            out[name] = [[epoch(t), state, note] for t, state, note in value]
        elif name in ("metadata", "headers"):  # user and worker data: no recursion
            out[name] = rebuild(value, leaf)
        elif name == "data":
            out[name] = None if value is None or (
                data_limit is not None and len(value) > data_limit) else leaf(value)
        elif name == "chunks":
            out[name] = [] if data_limit is not None and \
                sum(len(c) for c in value) > data_limit else [leaf(c) for c in value]
        else:
            out[name] = leaf(value)
    return out


def chunk_json(data: bytes) -> dict[str, Any]:
    """A streamed chunk in an event: ``{"text": ...}`` when it is UTF-8, else
    ``{"b64": ...}``."""
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        import base64

        return {"b64": base64.b64encode(data).decode("ascii")}


def backend_simulated(snap: EngineSnapshot, b: BackendView) -> bool:
    """Whether a backend's figures are simulated: its own declaration, or the device it runs
    on (not running: whether the engine simulates any device)."""
    kind = memory_kind(snap, b.gpu)
    return b.simulated or (snap.simulated if kind is None else kind == "SIMULATED")


def backend_json(b: BackendView, snap: EngineSnapshot, extra: dict[str, Any]) -> dict[str, Any]:
    """A backend as HTTP shows it: state, memory, keep-alive left, its declared / learned /
    observed peaks (memory figures keep their unit in the name, ``_mib``)."""
    return {
        "name": b.name, "object": "backend", "state": b.state, "description": b.description,
        "pid": b.pid, "gpu": b.gpu, "simulated": backend_simulated(snap, b),
        "memory": {"observed_mib": b.observed_mib, "reserved_mib": b.reserved_mib,
                   "kind": memory_kind(snap, b.gpu)},
        "peaks": {"declared_mib": b.declared_peak_mib, "learned_mib": b.learned_peak_mib,
                  "observed_p95_mib": b.observed_p95_mib, "used_for_admission_mib": b.peak_mib,
                  "over_declared": b.over_declared},
        "keep_alive_left_s": _finite(b.keep_alive_left_s), "pinned": b.pinned,
        "priority": b.priority, "jobs": {"queued": b.queued, "running": b.running,
                                         "served": b.jobs_served},
        "websockets": b.tunnels,
        "last_used": epoch(b.last_used), "last_error": b.last_error,
        "init_failures": b.init_failures, "features": list(b.features), "source": b.source,
        "sleep": {"can_sleep": b.can_sleep, "residual_mib": b.sleep_residual_mib,
                  "wake_cost_s": _finite(b.wake_cost_s), "not_since": b.no_sleep},
        "log": b.log_path,
        **extra,
    }


def memory_kind(snap: EngineSnapshot, gpu: int | None) -> str | None:
    """What a backend's memory figures are, on the device it runs on: ``GPU``, ``SIMULATED``
    or ``host memory`` (None: it runs nowhere now)."""
    view = next((g for g in snap.gpus if g.index == gpu), None)
    return view.kind if view is not None else None


def gpu_json(g: GpuView, uuid: str | None) -> dict[str, Any]:
    """A GPU as HTTP shows it (without its history)."""
    return {
        "index": g.index, "uuid": uuid, "name": g.name, "simulated": g.simulated,
        "kind": g.kind, "source": g.source,
        "total_mib": g.total_mib, "used_mib": g.used_mib, "free_mib": g.free_mib,
        "reserved_mib": g.reserved_mib, "ours_mib": g.ours_mib, "foreign_mib": g.foreign_mib,
        "reserve_mib": g.reserve_mib, "budget_mib": g.budget_mib, "util_pct": g.util_pct,
        "temp_c": g.temp_c, "power_w": g.power_w,
        "yielded": None if g.yielded_by is None else {
            "by": g.yielded_by, "until": g.yielded_until, "rule": g.yielded_rule},
        "others": {"held_back_mib": g.others_mib,
                   "processes": [{"pid": p.pid, "name": p.name, "user": p.user,
                                  "used_mib": p.used_mib} for p in g.strangers]},
    }


def yield_json(y: YieldInfo) -> dict[str, Any]:
    """A yielded GPU (``vramtui yield``) as HTTP shows it."""
    return {"gpu": y.gpu, "by": y.by, "since": y.since, "until": y.until, "now": y.now,
            "rule": y.rule}


def event_json(event: EngineEvent,
               job: Callable[[JobView], dict[str, Any]] | None = None) -> dict[str, Any]:
    """An engine event as HTTP's ``/v1/events`` sends it; a job event carries the job's light
    view, encoded by ``job`` (default: :func:`job_json` without history nor result)."""
    out: dict[str, Any] = {"kind": event.kind, "t": epoch(event.t)}
    if event.kind == "job" and event.job is not None:
        out["job"] = job(event.job) if job is not None else \
            job_json(event.job, history=False, result=False)
    elif event.kind == "chunk":
        out["job_id"] = event.job_id
        out.update(chunk_json(event.data or b""))
    elif event.kind == "worker":
        out["state"] = event.state
    elif event.kind == "log":
        out["level"] = event.level
        out["message"] = event.message
    elif event.kind == "sleep":
        out["state"] = event.state
        out["message"] = event.message
        out["seconds"] = _finite(event.seconds)
    if event.backend is not None:
        out["backend"] = event.backend
    return out


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 3)
