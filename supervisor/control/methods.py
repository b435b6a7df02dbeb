"""The control server's methods: each request calls the engine directly, on its loop.

:class:`Methods` turns a REQUEST ``{m, a}`` into a call of the engine's synchronous, loop-only
methods and answers it; ``wait`` (and ``submit`` with ``wait``) is answered later, from the
job's future callback, so the loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worker_sdk.protocol import Message

from ..errors import JobTimeout, UnknownBackend, VramtuiError
from ..jobs import JobState
from ..validate import check_seconds
from . import messages as m
from .codec import job_to_wire, snapshot_to_wire
from .errors import BadRequest
from .logtail import read_log

if TYPE_CHECKING:
    from .connection import Connection
    from .server import ControlServer

log = logging.getLogger("supervisor.control")
_DEFERRED = object()


class Methods:
    """Every method of the control protocol, bound to one server (and so one engine)."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self.engine = server.engine
        self._handlers: dict[str, Callable[[Connection, int, dict[str, Any]], Any]] = {
            name: getattr(self, f"_do_{name}") for name in m.METHODS
        }

    def dispatch(self, conn: Connection, msg: Message) -> None:
        payload = msg.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("m"), str):
            conn.error(msg.id, BadRequest("a request must be a map {m: method, a: {...}}"))
            return
        method = payload["m"]
        handler = self._handlers.get(method)
        if handler is None:
            conn.error(msg.id, BadRequest(f"unknown method {method!r}; known: "
                                          f"{', '.join(sorted(m.METHODS))}"))
            return
        args = payload.get("a") or {}
        if not isinstance(args, dict):
            conn.error(msg.id, BadRequest(f"{method}: arguments must be a map"))
            return
        self.server.counters["requests"] += 1
        try:
            result = handler(conn, msg.id, args)
        except VramtuiError as exc:
            conn.error(msg.id, exc)
            return
        except Exception as exc:  # noqa: BLE001 - one bad request must not hurt the engine
            log.exception("control request %s failed", method)
            conn.error(msg.id, VramtuiError(f"internal error in the engine while doing "
                                            f"{method}: {type(exc).__name__}: {exc}"))
            return
        if result is not _DEFERRED:
            conn.reply(msg.id, result)

    # -- methods (each runs on the engine loop) -----------------------------------------------
    def _do_ping(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return "pong"

    def _do_submit(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        payload = _arg(a, "payload", bytes, b"")
        metadata = a.get("metadata")
        # Over a connection limit: refused before the job is accepted, never after.
        if _arg(a, "wait", bool, False):
            conn.check_wait()
        elif _arg(a, "follow", bool, False):
            conn.check_subscribe()
        # priority, timeout, metadata and stream are checked by the engine (supervisor.validate)
        job = self.engine.submit(
            _arg(a, "backend", str), payload, priority=a.get("priority"),
            timeout=a.get("timeout"), metadata=metadata,
            stream=False if a.get("stream") is None else a.get("stream"))
        if _arg(a, "wait", bool, False):
            return self._wait(conn, msg_id, job.id, _num(a, "wait_timeout"))
        if _arg(a, "follow", bool, False):  # the job's events from now on, on this connection
            return {"id": job.id, "sub": conn.subscribe(frozenset({"job", "chunk"}), job.id)}
        return job.id

    def _do_wait(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return self._wait(conn, msg_id, _arg(a, "job", str), _num(a, "timeout"))

    def _wait(self, conn: Connection, msg_id: int, job_id: str, timeout: float | None) -> Any:
        timeout = check_seconds(timeout, "wait timeout", allow_zero=True)
        fut = self.engine.futures.get(job_id)
        if fut is None:
            return job_to_wire(self.engine.job_view(job_id))
        conn.check_wait()
        Waiter(self.server, conn, msg_id, job_id, fut, timeout)
        return _DEFERRED

    def _do_job(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        view = self.engine.job_view(_arg(a, "job", str))
        if view.state is JobState.QUEUED:
            position = next((i for i, j in enumerate(self.engine.queue, 1) if j.id == view.id),
                            None)
            view = dataclasses.replace(view, position=position)
        return job_to_wire(view)

    def _do_cancel(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return job_to_wire(self.engine.cancel(_arg(a, "job", str)))

    def _do_evict(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        self.engine.evict(_arg(a, "backend", str))

    def _do_respawn(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        self.engine.respawn(_arg(a, "backend", str))

    def _do_preload(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        self.engine.preload(_arg(a, "backend", str))

    def _do_zero(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return self.engine.zero()

    def _do_calibrate(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        job = self.engine.calibrate(  # the values are checked by the engine
            _arg(a, "backend", str), repeats=a.get("repeats", 3),
            request=_arg(a, "request", bytes, None),
            settle_s=1.0 if a.get("settle_s") is None else a.get("settle_s"),
            priority=a.get("priority"))
        return job.id

    def _do_snapshot(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        limit = _arg(a, "data_limit", int, m.SNAPSHOT_JOB_DATA_LIMIT)
        snap = self.engine.snapshot()
        if _arg(a, "light", bool, False):  # no history, recent jobs nor log lines
            snap = dataclasses.replace(
                snap, recent=(), log=(),
                gpus=tuple(dataclasses.replace(g, history=()) for g in snap.gpus))
        return snapshot_to_wire(snap, limit if limit >= 0 else None)

    def _do_subscribe(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        kinds = _arg(a, "kinds", list, None)
        if kinds is not None and not all(isinstance(k, str) for k in kinds):
            raise BadRequest("subscribe: kinds must be a list of strings")
        return {"sub": conn.subscribe(frozenset(kinds) if kinds else None,
                                      _arg(a, "job", str, None))}

    def _do_unsubscribe(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        conn.unsubscribe(_arg(a, "sub", int))

    def _do_logs(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        backend = _arg(a, "backend", str)
        if backend not in self.engine.backends:
            raise UnknownBackend(backend, self.engine.backends)
        path = self.engine.paths.worker_log_path(backend)
        lines = _arg(a, "lines", int, 50)
        offset = _arg(a, "offset", int, None)
        loop = self.server.loop
        assert loop is not None
        fut = loop.run_in_executor(None, read_log, path, lines, offset)

        def done(f: asyncio.Future[dict[str, Any]]) -> None:
            try:
                conn.reply(msg_id, f.result())
            except Exception as exc:  # noqa: BLE001 - reported to the client
                conn.error(msg_id, VramtuiError(f"cannot read {path}: {exc}"))

        fut.add_done_callback(done)
        return _DEFERRED

    def _do_stats(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return self.server.stats()

    def _do_shutdown(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        log.info("stop requested over the control socket by pid %s",
                 conn.peer.pid if conn.peer else "?")
        self.engine.request_stop()


def _arg(args: dict[str, Any], name: str, kind: type, default: Any = ...) -> Any:
    value = args.get(name)
    if value is None:
        if default is ...:
            raise BadRequest(f"missing argument {name!r}")
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadRequest(f"argument {name!r} must be {kind.__name__}, "
                         f"not {type(value).__name__}")
    return value


def _num(args: dict[str, Any], name: str) -> float | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"argument {name!r} must be a number")
    return float(value)


class Waiter:
    """Answers one ``wait`` when the job's future resolves (or its timeout passes)."""

    def __init__(self, server: ControlServer, conn: Connection, msg_id: int, job_id: str,
                 fut: Any, timeout: float | None) -> None:
        self.server, self.conn, self.msg_id, self.job_id = server, conn, msg_id, job_id
        self.timeout = timeout
        self.answered = False
        self.timer: asyncio.TimerHandle | None = None
        loop = server.loop
        assert loop is not None
        self.loop = loop
        self.loop_thread = threading.get_ident()
        if timeout is not None:
            self.timer = loop.call_later(max(0.0, timeout), self._expire)
        conn.waiters.add(self)
        fut.add_done_callback(self._done)

    def _done(self, fut: Any) -> None:
        if threading.get_ident() != self.loop_thread:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._done, fut)
            return
        if self._finish():
            try:
                view = fut.result()
            except BaseException as exc:  # noqa: BLE001 - reported to the client
                self.conn.error(self.msg_id, exc)
                return
            self.conn.reply(self.msg_id, job_to_wire(view))

    def _expire(self) -> None:
        if self._finish():
            self.conn.error(self.msg_id, JobTimeout(
                f"job {self.job_id} has not finished after {self.timeout:g} s "
                "(it goes on; wait again or cancel it)"))

    def _finish(self) -> bool:
        if self.answered:
            return False
        self.answered = True
        if self.timer is not None:
            self.timer.cancel()
        self.conn.waiters.discard(self)
        return not self.conn.closed

    def drop(self) -> None:
        self.answered = True
        if self.timer is not None:
            self.timer.cancel()


