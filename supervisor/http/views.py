"""The engine's frozen views as JSON-ready dicts for the HTTP routes.

Times leave as wall-clock seconds since the epoch (the engine keeps monotonic times; the offset
is taken once from the engine).  A job's view never carries its result: the result has a URL
of its own (``/v1/jobs/{id}/result``), so a listing or an event stays small whatever the job
returned.  Memory figures keep their unit in the name (``_mib``), as elsewhere in the API.
"""

from __future__ import annotations

import base64
import math
from typing import Any

from ..events import EngineEvent
from ..jobs import JobView
from ..plain import rebuild
from ..snapshot import BackendView, EngineSnapshot, GpuView


class Clock:
    """Monotonic engine times to wall-clock times."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def wall(self, t: float | None) -> float | None:
        return None if t is None else round(t + self.offset, 6)


def job_json(view: JobView, clock: Clock, *, history: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": view.id, "object": "job", "backend": view.backend, "state": view.state.value,
        "kind": view.kind, "priority": view.priority,
        "submitted_at": clock.wall(view.submitted_at), "started_at": clock.wall(view.started_at),
        "finished_at": clock.wall(view.finished_at),
        "progress": view.progress, "progress_text": view.progress_text, "gpu": view.gpu,
        "position": view.position, "waiting": view.waiting or None, "passed": view.passed,
        "error": view.error, "status_code": view.status_code, "peak_mib": view.peak_mib,
        "metadata": _plain(view.metadata),
        "links": {"self": f"/v1/jobs/{view.id}", "events": f"/v1/jobs/{view.id}/events",
                  "cancel": f"/v1/jobs/{view.id}/cancel"},
    }
    if view.finished:
        out["links"]["result"] = f"/v1/jobs/{view.id}/result"
    if history:
        out["history"] = [{"t": clock.wall(t), "state": state, "note": note}
                          for t, state, note in view.history]
    return out


def chunk_json(data: bytes) -> dict[str, Any]:
    """A streamed chunk: as text when it is UTF-8, else base64."""
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(data).decode("ascii")}


def backend_json(b: BackendView, snap: EngineSnapshot, extra: dict[str, Any]) -> dict[str, Any]:
    """A backend: state, memory, keep-alive left, its declared / learned / observed peaks."""
    return {
        "name": b.name, "object": "backend", "state": b.state, "description": b.description,
        "pid": b.pid, "gpu": b.gpu, "simulated": b.simulated or snap.simulated,
        "memory": {"observed_mib": b.observed_mib, "reserved_mib": b.reserved_mib},
        "peaks": {"declared_mib": b.declared_peak_mib, "learned_mib": b.learned_peak_mib,
                  "observed_p95_mib": b.observed_p95_mib, "used_for_admission_mib": b.peak_mib,
                  "over_declared": b.over_declared},
        "keep_alive_left_s": _finite(b.keep_alive_left_s), "pinned": b.pinned,
        "priority": b.priority, "jobs": {"queued": b.queued, "running": b.running,
                                         "served": b.jobs_served},
        "last_used": b.last_used, "last_error": b.last_error, "init_failures": b.init_failures,
        "features": list(b.features), "source": b.source, "log": b.log_path,
        **extra,
    }


def gpu_json(g: GpuView, uuid: str | None) -> dict[str, Any]:
    return {
        "index": g.index, "uuid": uuid, "name": g.name, "simulated": g.simulated,
        "total_mib": g.total_mib, "used_mib": g.used_mib, "free_mib": g.free_mib,
        "reserved_mib": g.reserved_mib, "ours_mib": g.ours_mib, "foreign_mib": g.foreign_mib,
        "reserve_mib": g.reserve_mib, "budget_mib": g.budget_mib, "util_pct": g.util_pct,
        "temp_c": g.temp_c, "power_w": g.power_w,
    }


def event_json(event: EngineEvent, clock: Clock) -> dict[str, Any]:
    """An engine event for /v1/events (a job event carries the job's light view)."""
    out: dict[str, Any] = {"kind": event.kind, "t": round(event.t, 6)}
    if event.kind == "job" and event.job is not None:
        out["job"] = job_json(event.job, clock, history=False)
    elif event.kind == "chunk":
        out["job_id"] = event.job_id
        out.update(chunk_json(event.data or b""))
    elif event.kind == "worker":
        out["state"] = event.state
    elif event.kind == "log":
        out["level"] = event.level
        out["message"] = event.message
    if event.backend is not None:
        out["backend"] = event.backend
    return out


def _finite(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 3)


def _plain(value: Any) -> Any:
    """Metadata as JSON (without recursion: it is user data): bytes become base64 text."""
    return rebuild(value, _leaf)


def _leaf(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    return value
