"""The engine side of the API: one function per method of :mod:`supervisor.apispec`.

Both the in-process facade (:class:`supervisor.facade.Supervisor`) and the control server
(:mod:`supervisor.control.methods`) call these, with arguments already validated by the
method's entry in the spec, so an embedded and an attached caller get the same answers and
the same errors.  Each runs on the engine loop.  One that must read files returns a
:class:`Blocking`: its ``work`` runs off the loop (in the caller's thread, or the server's
executor), then ``then`` (if any) runs on the loop with what ``work`` returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import Refused
from .jobs import JobState, JobView
from .results import CancelResult, JobRequest, LogChunk, YieldInfo
from .snapshot import EngineSnapshot

if TYPE_CHECKING:
    from .engine import Engine


@dataclass(frozen=True, slots=True)
class Blocking:
    """Work to do off the engine loop (reading files), and what to do with it back on it."""

    work: Callable[[], Any]
    then: Callable[[Any], Any] | None = None


# -- jobs ------------------------------------------------------------------------------------


def submit(engine: Engine, backend: str, payload: bytes, priority: int | None,
           timeout: float | None, metadata: dict[str, Any] | None, stream: bool) -> str:
    return engine.submit(backend, payload, priority=priority, timeout=timeout,
                         metadata=metadata, stream=stream).id


def job(engine: Engine, job_id: str) -> JobView:
    view = engine.job_view(job_id)
    if view.state is JobState.QUEUED:
        job = engine.jobs.get(job_id)
        if job is not None:
            view = dataclasses.replace(view, position=engine.jobs.position(job))
    return view


def jobs(engine: Engine, state: str | None, backends: tuple[str, ...],
         limit: int) -> tuple[JobView, ...]:
    """The jobs held, in the listing's order (its rules: :mod:`supervisor.jobs.query`); a
    listing carries no results: each job's data and chunks are left out (``job`` has them)."""
    from .jobs.query import check_backends, list_jobs, parse_states

    check_backends(engine, backends)
    views = list_jobs(engine, states=parse_states(state), backends=backends, limit=limit)
    return tuple(dataclasses.replace(v, data=None, chunks=())
                 for v in views)


def job_request(engine: Engine, job_id: str, limit: int) -> JobRequest:
    return engine.job_request(job_id, limit)


def cancel(engine: Engine, job_id: str) -> JobView:
    return engine.cancel(job_id)


def cancel_many(engine: Engine, job_ids: tuple[str, ...]) -> tuple[CancelResult, ...]:
    return engine.cancel_many(job_ids)


def retry(engine: Engine, job_id: str) -> str:
    return engine.retry(job_id).id


def set_priority(engine: Engine, job_id: str, priority: int) -> JobView:
    return engine.set_priority(job_id, priority)


# -- backends --------------------------------------------------------------------------------


def evict(engine: Engine, backend: str) -> None:
    engine.evict(backend)


def respawn(engine: Engine, backend: str) -> None:
    engine.respawn(backend)


def preload(engine: Engine, backend: str) -> None:
    engine.preload(backend)


def kill(engine: Engine, backend: str) -> None:
    engine.kill(backend)


def sleep(engine: Engine, backend: str) -> None:
    engine.sleep(backend)


def wake(engine: Engine, backend: str) -> None:
    engine.wake(backend)


def drain(engine: Engine, gpu: int, on: bool) -> tuple[int, ...]:
    engine.drain(gpu, on)
    return tuple(sorted(engine.planner.draining))


def yield_gpus(engine: Engine, gpus: tuple[int, ...], for_s: float | None, now: bool,
               by: str) -> tuple[YieldInfo, ...]:
    return engine.yield_gpus(gpus, for_s=for_s, now=now, by=by or _user())


def resume_gpus(engine: Engine, gpus: tuple[int, ...]) -> tuple[int, ...]:
    return engine.resume_gpus(gpus)


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "asked"


def reload(engine: Engine) -> Blocking:
    from .backends.loader import load_backends

    layers, environ = engine.descriptors.layers, engine.descriptors.environ
    if layers is None:
        raise Refused("this engine was not started from descriptor files: nothing to reload")
    # Only the demo that runs can stay (a broken first file keeps it); a reload never brings
    # it in, e.g. when the last file is deleted.
    demo = engine.descriptors.demo
    return Blocking(lambda: load_backends(layers, environ=environ, demo_fallback=demo,
                                          keep_demo=demo),
                    engine.apply_descriptors)


def zero(engine: Engine) -> tuple[str, ...]:
    return tuple(engine.zero())


def calibrate(engine: Engine, backend: str, repeats: int, request: bytes | None,
              settle_s: float) -> str:
    return engine.calibrate(backend, repeats=repeats, request=request, settle_s=settle_s).id


# -- looking ---------------------------------------------------------------------------------


def snapshot(engine: Engine, light: bool) -> EngineSnapshot:
    snap = engine.snapshot()
    if light:  # no history, recent jobs nor log lines: a quick look (`vramtui status`)
        snap = dataclasses.replace(
            snap, recent=(), log=(),
            gpus=tuple(dataclasses.replace(g, history=()) for g in snap.gpus))
    return snap


def _known(engine: Engine, backend: str) -> None:
    engine.spec(backend)  # UnknownBackend if there is none


def logs(engine: Engine, backend: str, lines: int, offset: int | None) -> Blocking:
    from .control.logtail import read_log

    _known(engine, backend)
    path = engine.paths.worker_log_path(backend)
    return Blocking(lambda: LogChunk(**read_log(path, lines, offset)))


def descriptor(engine: Engine, backend: str) -> Blocking:
    from .descriptors import describe

    _known(engine, backend)
    spec, d = engine.spec(backend), engine.descriptors
    layers, environ = d.layers, d.environ
    return Blocking(lambda: describe(backend, spec, layers, environ, demo=d.demo))


def calibration_report(engine: Engine, backend: str, name: str | None) -> Blocking:
    from .descriptors import read_report

    _known(engine, backend)
    directory = engine.paths.calibration_dir
    return Blocking(lambda: read_report(directory, backend, name))
