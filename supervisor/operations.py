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

from .errors import UnknownBackend
from .jobs import JobState, JobView
from .results import LogChunk
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
        position = next((i for i, j in enumerate(engine.queue, 1) if j.id == view.id), None)
        view = dataclasses.replace(view, position=position)
    return view


def cancel(engine: Engine, job_id: str) -> JobView:
    return engine.cancel(job_id)


# -- backends --------------------------------------------------------------------------------


def evict(engine: Engine, backend: str) -> None:
    engine.evict(backend)


def respawn(engine: Engine, backend: str) -> None:
    engine.respawn(backend)


def preload(engine: Engine, backend: str) -> None:
    engine.preload(backend)


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
    if backend not in engine.backends:
        raise UnknownBackend(backend, engine.backends)


def logs(engine: Engine, backend: str, lines: int, offset: int | None) -> Blocking:
    from .control.logtail import read_log

    _known(engine, backend)
    path = engine.paths.worker_log_path(backend)
    return Blocking(lambda: LogChunk(**read_log(path, lines, offset)))
