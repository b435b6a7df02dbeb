"""HTTP's resources: the codec's JSON of a view (:mod:`supervisor.doors.codec`), plus what only
the HTTP door has — a resource's ``object`` kind and its ``links``.

A job's resource never carries its result: the result has a URL of its own
(``/v1/jobs/{id}/result``), so a listing or an event stays small whatever the job returned.
Times come through the codec as the views carry them, epoch seconds: nothing here converts
them.
"""

from __future__ import annotations

from typing import Any

from ..doors.codec import backend_json, chunk_json, event_json, gpu_json, job_json
from ..events import EngineEvent
from ..jobs import JobView

__all__ = ["backend_json", "chunk_json", "engine_event_json", "gpu_json", "job_resource"]


def job_resource(view: JobView, *, history: bool = True) -> dict[str, Any]:
    """A job as HTTP shows it: :func:`~supervisor.doors.codec.job_json` without the result,
    with its kind and links, and its history's entries as objects ``{t, state, note}`` (as
    the HTTP API has always given them; the CLI's ``--json`` keeps ``[t, state, note]``)."""
    out: dict[str, Any] = {"object": "job",
                           **job_json(view, history=history, result=False)}
    if history:
        out["history"] = [{"t": t, "state": state, "note": note}
                          for t, state, note in out["history"]]
    links = {"self": f"/v1/jobs/{view.id}", "events": f"/v1/jobs/{view.id}/events",
             "cancel": f"/v1/jobs/{view.id}/cancel"}
    if view.finished:
        links["result"] = f"/v1/jobs/{view.id}/result"
    out["links"] = links
    return out


def _light_resource(view: JobView) -> dict[str, Any]:
    return job_resource(view, history=False)


def engine_event_json(event: EngineEvent) -> dict[str, Any]:
    """An engine event for ``/v1/events`` (a job event carries the job's light resource)."""
    return event_json(event, _light_resource)
