"""The control server's methods: each request calls the engine directly, on its loop.

:class:`Methods` answers every wire method of :mod:`supervisor.apispec` and no other: a
request ``{m, a}`` is validated by its entry there (:meth:`Method.from_wire`), then handled by
its function in :mod:`supervisor.operations` (shared with the in-process facade) and the result
encoded for the wire; the few methods the wire handles itself (``submit`` with ``wait`` or
``follow``, ``wait``, ``snapshot``'s data limit, subscriptions, ``stats``, ``shutdown``) have a
``_do_<name>`` here.  ``wait`` is answered later, when :mod:`supervisor.doors.watch` says the
job has ended, so the loop never blocks; an operation that reads files runs in the loop's
executor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worker_sdk.protocol import Message

from .. import operations
from ..apispec import METHODS, WIRE_METHODS
from ..doors import watch
from ..errors import VramtuiError
from ..validate import check_seconds
from . import messages as m
from .codec import job_to_wire, snapshot_to_wire, to_wire
from .errors import BadRequest

if TYPE_CHECKING:
    from .connection import Connection
    from .server import ControlServer

log = logging.getLogger("supervisor.control")
_DEFERRED = object()
Handler = Callable[["Connection", int, dict[str, Any]], Any]


def handler_names(cls: type) -> dict[str, str]:
    """For each wire method, how ``cls`` answers it: ``_do_<name>`` or ``operations``.

    Raises ``TypeError`` when the two disagree with the spec (a handler for a method that is
    not listed, or a listed method with neither), so a drift fails at once.
    """
    own = {name[4:] for name in vars(cls) if name.startswith("_do_")}
    stray = own - WIRE_METHODS
    if stray:
        raise TypeError(f"handlers for methods the API does not list: {sorted(stray)}")
    found = {}
    for name in WIRE_METHODS:
        if name in own:
            found[name] = f"_do_{name}"
        elif callable(getattr(operations, name, None)):
            found[name] = "operations"
        else:
            raise TypeError(f"the API lists {name!r} but nothing answers it")
    return found


class Methods:
    """Every method of the control protocol, bound to one server (and so one engine)."""

    def __init__(self, server: ControlServer) -> None:
        self.server = server
        self.engine = server.engine
        self._handlers: dict[str, Handler] = {}
        for name, how in handler_names(type(self)).items():
            self._handlers[name] = getattr(self, how) if how != "operations" else \
                self._operation(name)

    def dispatch(self, conn: Connection, msg: Message) -> None:
        payload = msg.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("m"), str):
            conn.error(msg.id, BadRequest("a request must be a map {m: method, a: {...}}"))
            return
        method = payload["m"]
        handler = self._handlers.get(method)
        if handler is None:
            conn.error(msg.id, BadRequest(f"unknown method {method!r}; known: "
                                          f"{', '.join(sorted(self._handlers))}"))
            return
        args = payload.get("a") or {}
        if not isinstance(args, dict):
            conn.error(msg.id, BadRequest(f"{method}: arguments must be a map"))
            return
        self.server.counters["requests"] += 1
        try:
            result = handler(conn, msg.id, METHODS[method].from_wire(args))
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

    # -- the shared operations ----------------------------------------------------------------
    def _operation(self, name: str) -> Handler:
        fn = getattr(operations, name)

        def handle(conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
            result = fn(self.engine, **a)
            if isinstance(result, operations.Blocking):
                return self._blocking(conn, msg_id, name, result)
            return to_wire(result)

        return handle

    def _blocking(self, conn: Connection, msg_id: int, name: str,
                  job: operations.Blocking) -> Any:
        """Run ``job.work`` in the loop's executor and answer when it is done."""
        loop = self.server.loop
        assert loop is not None
        fut = loop.run_in_executor(None, job.work)

        def done(f: asyncio.Future[Any]) -> None:
            try:
                value = f.result()
                if job.then is not None:
                    value = job.then(value)
                conn.reply(msg_id, to_wire(value))
            except VramtuiError as exc:
                conn.error(msg_id, exc)
            except Exception as exc:  # noqa: BLE001 - reported to the client
                log.exception("control request %s failed", name)
                conn.error(msg_id, VramtuiError(f"{name} failed in the engine: "
                                                f"{type(exc).__name__}: {exc}"))

        fut.add_done_callback(done)
        return _DEFERRED

    # -- what the wire does itself (each runs on the engine loop) ------------------------------
    def _do_ping(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return "pong"

    def _do_submit(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        wait, wait_timeout, follow = a.pop("wait"), a.pop("wait_timeout"), a.pop("follow")
        # Over a connection limit: refused before the job is accepted, never after.
        if wait:
            conn.check_wait()
        elif follow:
            conn.check_subscribe()
        job_id = operations.submit(self.engine, **a)  # its values: supervisor.validate too
        if wait:
            answer = self._wait(conn, msg_id, job_id, wait_timeout)
            watch.hurry(self.engine)  # a hot worker has the request before the loop turns
            return answer
        if follow:  # the job's events from now on, on this connection
            return {"id": job_id, "sub": conn.subscribe(frozenset({"job", "chunk"}), job_id)}
        return job_id

    def _do_wait(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return self._wait(conn, msg_id, a["job_id"], a["timeout"])

    def _wait(self, conn: Connection, msg_id: int, job_id: str, timeout: float | None) -> Any:
        timeout = check_seconds(timeout, "wait timeout", allow_zero=True)
        end = watch.JobEnd.of(self.engine, job_id)
        if end is None:
            return job_to_wire(watch.job_view(self.engine, job_id))
        conn.check_wait()
        Waiter(conn, msg_id, end, timeout)
        return _DEFERRED

    def _do_snapshot(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        limit = a["data_limit"]
        if limit is None:
            limit = m.SNAPSHOT_JOB_DATA_LIMIT
        snap = operations.snapshot(self.engine, a["light"])
        return snapshot_to_wire(snap, limit if limit >= 0 else None)

    def _do_subscribe(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        kinds = a["kinds"]
        return {"sub": conn.subscribe(frozenset(kinds) if kinds else None, a["job_id"])}

    def _do_unsubscribe(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        conn.unsubscribe(a["sub"])

    def _do_stats(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        return self.server.stats()

    def _do_shutdown(self, conn: Connection, msg_id: int, a: dict[str, Any]) -> Any:
        log.info("stop%s requested over the control socket by pid %s",
                 " now" if a["now"] else "", conn.peer.pid if conn.peer else "?")
        return self.engine.request_stop(now=a["now"])


class Waiter:
    """Answers one ``wait`` when the job ends (or its timeout passes), unless its connection
    closed first."""

    __slots__ = ("conn", "msg_id", "watching")

    def __init__(self, conn: Connection, msg_id: int, end: watch.JobEnd,
                 timeout: float | None) -> None:
        self.conn, self.msg_id = conn, msg_id
        conn.waiters.add(self)
        self.watching = end.when_done(self._answer, timeout)

    def _answer(self, outcome: watch.Outcome) -> None:
        self.conn.waiters.discard(self)
        if self.conn.closed:
            return
        if isinstance(outcome, BaseException):  # EngineStopped, JobTimeout
            self.conn.error(self.msg_id, outcome)
        else:
            self.conn.reply(self.msg_id, job_to_wire(outcome))

    def drop(self) -> None:
        self.watching.cancel()
