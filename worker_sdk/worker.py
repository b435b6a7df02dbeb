"""The worker loop: connect, register, initialise, serve requests, report, shut down.

Threads: the main thread reads the data socket and runs ``predict`` (so a model's CUDA work stays
on one thread, as in verda-io); a control thread answers pings, health and status requests,
cancellations and shutdown while ``predict`` runs.  Extensions (explicit streams, cancel,
progress, request envelopes, error status codes, init-failure reports, quiet status) are used
only when the server's acknowledgement advertised them; otherwise the worker behaves exactly
like a verda-io 0.4.4 worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import select
import signal
import threading
import traceback
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import Any

from . import context as ctxmod
from .asyncpredict import iterate_async, run_async
from .connection import Connection, ConnectionLost
from .context import Cancelled, RequestContext
from .protocol import (
    EXTENSIONS,
    DataType,
    EventType,
    Message,
    MessageType,
    Packed,
    ProtocolError,
    event_type,
    features_from_ack,
    registration_payload,
)
from .registry import Registry
from .response import Response

log = logging.getLogger("worker_sdk")


class ExitCode(IntEnum):
    OK = 0
    SCRIPT = 1  # the worker script could not be loaded, or registered something unusable
    USAGE = 2  # bad flags or config
    INIT_FAILED = 3  # an @initialize function raised (reported on the control socket first)
    SERVER_LOST = 4  # the server could not be reached, or was lost for good


_CANCELLED_STATUS = 499
_BYTES_LIKE = (bytes, bytearray, memoryview)
_NUMBER = (int, float)


class _Lost(Exception):
    """A connection to the server broke; the main loop reconnects or gives up."""


class Worker:
    """Serve one registry's functions to a server over a control and a data socket."""

    def __init__(
        self,
        registry: Registry,
        control_socket: str,
        data_socket: str,
        name: str,
        *,
        max_reconnect_count: int = 5,
        connect_timeout: float = 30.0,
        ack_timeout: float = 2.0,
        features: frozenset[str] = EXTENSIONS,
        script: str = "worker script",
    ) -> None:
        self.registry = registry
        self.predict = registry.require_predict(script)
        self.control_path = control_socket
        self.data_path = data_socket
        self.name = name
        self.max_reconnect_count = max_reconnect_count
        self.connect_timeout = connect_timeout
        self.ack_timeout = ack_timeout
        self.offered = features
        self.features: frozenset[str] = frozenset()
        self.state = "initializing"
        self.control: Connection | None = None
        self.data: Connection | None = None
        self._stop = threading.Event()
        self._acked = threading.Event()
        self._lost = threading.Event()
        self._lock = threading.Lock()
        self._current: RequestContext | None = None
        self._early_cancels: deque[int] = deque(maxlen=256)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._control_thread: threading.Thread | None = None
        self._poller: select.poll | None = None
        self._polled: Connection | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def request_stop(self, why: str) -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", why)
        self._stop.set()
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            self.request_stop(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> ExitCode:
        try:
            if not self._connect(self.connect_timeout):
                if self._stop.is_set():
                    return ExitCode.OK
                log.error(
                    "cannot reach the server at %s and %s after %.0f s",
                    self.control_path,
                    self.data_path,
                    self.connect_timeout,
                )
                return ExitCode.SERVER_LOST
            self._set_state("initializing", force=True)
            failure = self._initialize()
            if failure is not None:
                self._report_init_failure(failure)
                return ExitCode.INIT_FAILED
            if self._stop.is_set():
                return self._graceful_exit()
            self._set_state("ready", force=True)
            log.info("worker %r ready", self.name)
            return self._serve()
        finally:
            self._close_connections()
            if self._loop is not None:
                self._loop.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _initialize(self) -> str | None:
        for fn in self.registry.ordered_initializers():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - an init failure of any kind is reported
                if isinstance(exc, KeyboardInterrupt | SystemExit) and self._stop.is_set():
                    return f"{type(exc).__name__}: interrupted during initialize"
                traceback.print_exc()
                return f"{type(exc).__name__}: {exc}"
        return None

    def _report_init_failure(self, error: str) -> None:
        log.error("initialize failed: %s", error)
        if "init-failure" in self.features and self.control is not None:
            with contextlib.suppress(ConnectionLost):
                self.control.send(
                    MessageType.EVENT,
                    DataType.DEFAULT,
                    None,
                    {"event": int(EventType.STATUS), "status": "failed", "error": error},
                )

    def _graceful_exit(self) -> ExitCode:
        for fn in self.registry.unload:
            try:
                fn()
            except Exception:  # noqa: BLE001 - an unload error must not block the exit
                log.exception("@unload function %s failed", getattr(fn, "__name__", fn))
        log.info("worker %r stopped", self.name)
        return ExitCode.OK

    # -- connections --------------------------------------------------------------------------
    def _connect(self, timeout: float, interval: float = 0.05) -> bool:
        """Connect and register both sockets, start the control reader, await the ACK."""
        import time

        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            try:
                self.control = Connection.connect(self.control_path, timeout=5.0)
                try:
                    self.data = Connection.connect(self.data_path, timeout=5.0)
                except OSError:
                    self.control.close()
                    raise
                break
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                self._stop.wait(interval)
                interval = min(interval * 2, 1.0)
        else:
            return False
        assert self.control is not None and self.data is not None
        self._acked.clear()
        self._lost.clear()
        with self._lock:
            # Wire ids are per connection: a new server session may reuse an old cancelled id.
            self._early_cancels.clear()
        reg = registration_payload(self.name, self.offered)
        try:
            self.control.send(MessageType.REGISTRATION, DataType.DEFAULT, None, reg)
            self.data.send(MessageType.REGISTRATION, DataType.DEFAULT, None, reg)
        except ConnectionLost:
            self._close_connections()
            return False
        self._control_thread = threading.Thread(
            target=self._control_loop, args=(self.control,), name="worker-control", daemon=True
        )
        self._control_thread.start()
        if not self._acked.wait(self.ack_timeout):
            log.info("no acknowledgement from the server: plain verda-io protocol")
        return True

    def _close_connections(self) -> None:
        for conn in (self.control, self.data):
            if conn is not None and not conn.closed:
                conn.close()
        thread = self._control_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)

    def _reconnect(self) -> bool:
        self._close_connections()
        backoff = 0.25
        for attempt in range(1, self.max_reconnect_count + 1):
            if self._stop.is_set():
                return False
            log.warning("connection to the server lost; reconnect attempt %d", attempt)
            if self._connect(timeout=0.0):
                self._set_state("ready", force=True)
                log.info("reconnected after %d attempt(s)", attempt)
                return True
            if self._stop.wait(backoff):
                return False
            backoff = min(backoff * 2, 5.0)
        return False

    # -- control socket -----------------------------------------------------------------------
    def _control_loop(self, conn: Connection) -> None:
        while not conn.closed:
            try:
                message = conn.receive()
            except ConnectionLost:
                break
            except ProtocolError as exc:
                log.error("control socket: %s", exc)
                if exc.fatal:
                    conn.close()
                    break
                continue
            try:
                self._handle_control(conn, message)
            except ConnectionLost:
                break
        if not self._stop.is_set():
            self._lost.set()
            self._wake()

    def _handle_control(self, conn: Connection, message: Message) -> None:
        kind = message.type
        if kind == MessageType.ACKNOWLEDGEMENT:
            self.features = self.offered & features_from_ack(message.payload)
            self._acked.set()
        elif kind == MessageType.PING:
            conn.send(MessageType.PONG, DataType.DEFAULT, message.id, {"event": 0})
        elif kind == MessageType.EVENT:
            code = event_type(message.payload)
            if code == EventType.SHUTDOWN:
                self.request_stop("SHUTDOWN from the server")
            elif code == EventType.STATUS:
                self._send_status(self.state)
            elif code == EventType.CANCEL and "cancel" in self.features:
                self._cancel(message.payload.get("request"))
        elif kind == MessageType.REQUEST:
            payload = message.payload if isinstance(message.payload, dict) else {}
            if payload.get("type") == "hardware_health":
                conn.send(MessageType.RESPONSE, DataType.DEFAULT, message.id, self._health())
            else:
                status = {"status": self.state}
                conn.send(MessageType.RESPONSE, DataType.DEFAULT, message.id, status)

    def _health(self) -> Any:
        fn = self.registry.hardware_health
        if fn is None:
            return {"status": "not enabled"}
        try:
            result = fn()
            from .protocol import encode_bytes

            encode_bytes(MessageType.RESPONSE, DataType.DEFAULT, 0, result)  # serialisable?
            return result
        except Exception as exc:  # noqa: BLE001 - a failing health check is reported, not raised
            return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}

    def _cancel(self, wire_id: object) -> None:
        if not isinstance(wire_id, int):
            return
        with self._lock:
            ctx = self._current if (self._current and self._current.wire_id == wire_id) else None
            if ctx is None:
                self._early_cancels.append(wire_id)
        if ctx is not None:
            ctx.cancel()

    def _set_state(self, state: str, *, force: bool = False) -> None:
        self.state = state
        if force or "quiet-status" not in self.features:
            self._send_status(state)

    def _send_status(self, state: str) -> None:
        if self.control is not None:
            with contextlib.suppress(ConnectionLost):
                self.control.send(
                    MessageType.EVENT,
                    DataType.DEFAULT,
                    None,
                    {"event": int(EventType.STATUS), "status": state},
                )

    def _send_progress(self, wire_id: int, fraction: float | None, text: str) -> None:
        if "progress" in self.features and self.control is not None:
            with contextlib.suppress(ConnectionLost):
                self.control.send(
                    MessageType.EVENT,
                    DataType.DEFAULT,
                    None,
                    {
                        "event": int(EventType.NOTIFY),
                        "request": wire_id,
                        "fraction": fraction,
                        "message": text,
                    },
                )

    # -- data socket --------------------------------------------------------------------------
    def _serve(self) -> ExitCode:
        while True:
            try:
                message = self._next_data_message()
                if message is None:  # stop requested
                    return self._graceful_exit()
                self._handle_data(message)
            except _Lost:
                if self._stop.is_set():
                    return self._graceful_exit()
                if not self._reconnect():
                    if self._stop.is_set():
                        return self._graceful_exit()
                    log.error("the server is gone for good after %d reconnect attempts",
                              self.max_reconnect_count)
                    return ExitCode.SERVER_LOST

    def _next_data_message(self) -> Message | None:
        conn = self.data
        assert conn is not None
        if self._poller is None or self._polled is not conn:
            self._poller = select.poll()
            self._poller.register(conn.sock.fileno(), select.POLLIN)
            self._poller.register(self._wake_r, select.POLLIN)
            self._polled = conn
        poller = self._poller
        while True:
            if self._stop.is_set():
                return None
            if self._lost.is_set():
                raise _Lost
            try:
                message = conn.decoder.next()
            except ProtocolError as exc:
                self._on_data_protocol_error(conn, exc)
                continue
            if message is not None:
                return message
            events = poller.poll()
            for fd, _ev in events:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 512)
            if any(fd != self._wake_r for fd, _ev in events):
                with conn.decoder.get_buffer() as view:
                    try:
                        n = conn.sock.recv_into(view)
                    except OSError:
                        n = 0
                if n == 0:
                    raise _Lost
                conn.decoder.buffer_updated(n)

    def _on_data_protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        log.error("data socket: %s", exc)
        if exc.fatal:
            conn.close()
            raise _Lost from exc
        if exc.message_id is not None:
            self._send_error(exc.message_id, f"ProtocolError: {exc}", "bad_request", 400)

    def _handle_data(self, message: Message) -> None:
        kind = message.type
        if kind == MessageType.DATA:
            self._serve_request(message)
        elif kind == MessageType.PING:
            self._send_data(MessageType.PONG, DataType.DEFAULT, message.id, {"event": 0})
        elif kind == MessageType.ACKNOWLEDGEMENT:
            pass
        else:
            log.debug("data socket: ignoring %s", MessageType(kind).name)

    def _send_data(self, msg_type: int, data_type: int, msg_id: int, payload: Any) -> None:
        assert self.data is not None
        try:
            self.data.send(msg_type, data_type, msg_id, payload)
        except ConnectionLost as exc:
            raise _Lost from exc

    def _send_error(self, msg_id: int, error: str, kind: str, status: int) -> None:
        payload: dict[str, Any] = {"error": error, "type": kind}
        if "error-status" in self.features:
            payload["status_code"] = status
        else:
            payload["type"] = "prediction_error"
        self._send_data(MessageType.ERROR, DataType.DEFAULT, msg_id, payload)

    def _serve_request(self, message: Message) -> None:
        payload = message.payload
        request_id = None
        metadata: dict[str, Any] | None = None
        deadline = None
        if isinstance(payload, dict):  # our request envelope
            request_id = payload.get("request_id")
            meta = payload.get("metadata")
            metadata = meta if isinstance(meta, dict) else None
            deadline = payload.get("deadline")
            payload = payload["payload"]
        ctx = RequestContext(
            message.id,
            request_id=str(request_id) if request_id is not None else None,
            metadata=metadata,
            deadline=deadline if isinstance(deadline, _NUMBER) else None,
            progress_sink=self._send_progress,
        )
        with self._lock:
            self._current = ctx
            cancelled_early = message.id in self._early_cancels
        if cancelled_early:
            ctx.cancel()
        self._set_state("busy")
        token = ctxmod.activate(ctx)
        try:
            self._reply(message.id, ctx, payload)
        finally:
            ctxmod.deactivate(token)
            with self._lock:
                self._current = None
            self._set_state("ready")

    def _reply(self, msg_id: int, ctx: RequestContext, payload: bytes) -> None:
        try:
            ctx.check_cancelled()
            args = (payload, ctx) if self.registry.predict_takes_context else (payload,)
            result = self.predict(*args)
            if type(result) is bytes:  # the common case first: skip the inspect checks
                self._send_data(MessageType.DATA, DataType.DEFAULT, msg_id, result)
                return
            if inspect.isawaitable(result):
                result = run_async(self._event_loop(), result, ctx)
            if inspect.isgenerator(result):
                self._stream(msg_id, ctx, result)
            elif inspect.isasyncgen(result):
                self._stream(msg_id, ctx, iterate_async(self._event_loop, result, ctx))
            elif isinstance(result, Response):
                envelope = {
                    "headers": dict(result.headers),
                    "status_code": int(result.status_code),
                    "payload": _as_bytes(result.data),
                }
                self._send_data(MessageType.DATA, DataType.ENVELOPE, msg_id, Packed(envelope))
            elif isinstance(result, _BYTES_LIKE):
                self._send_data(MessageType.DATA, DataType.DEFAULT, msg_id, result)
            else:
                raise TypeError(
                    "predict() must return bytes, worker_sdk.Response or a generator of bytes, "
                    f"got {type(result).__name__}"
                )
        except _Lost:
            raise
        except (Cancelled, asyncio.CancelledError):
            self._send_error(msg_id, f"Cancelled: request {ctx.id} was cancelled", "cancelled",
                             _CANCELLED_STATUS)
        except Exception as exc:  # noqa: BLE001 - any predict failure becomes an error reply
            if log.isEnabledFor(logging.DEBUG):
                log.debug("predict failed", exc_info=True)
            else:
                traceback.print_exc()
            self._send_error(msg_id, f"{type(exc).__name__}: {exc}", "prediction_error", 500)

    def _stream(self, msg_id: int, ctx: RequestContext, chunks: Any) -> None:
        explicit = "stream" in self.features
        dtype = DataType.STREAM if explicit else DataType.DEFAULT
        try:
            for chunk in chunks:
                if ctx.cancelled:
                    raise Cancelled(f"request {ctx.id} was cancelled")
                data = _as_chunk(chunk)
                if not data and not explicit:
                    continue  # a plain verda-io server reads an empty chunk as end of stream
                self._send_data(MessageType.DATA, dtype, msg_id, data)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        self._send_data(MessageType.DATA, dtype, msg_id, None if explicit else b"")

    # -- async predicts -----------------------------------------------------------------------
    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

def _as_bytes(data: Any) -> bytes | bytearray | memoryview:
    if isinstance(data, _BYTES_LIKE):
        return data
    if isinstance(data, str):
        return data.encode()
    raise TypeError(f"Response.data must be bytes, got {type(data).__name__}")


def _as_chunk(chunk: Any) -> bytes | bytearray | memoryview:
    if isinstance(chunk, _BYTES_LIKE):
        return chunk
    return str(chunk).encode("utf-8")


def configure_logging(debug: bool) -> None:
    """Log to stderr, unless the application configured logging itself."""
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(
            level=logging.DEBUG if debug else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    if debug:
        logging.getLogger("worker_sdk").setLevel(logging.DEBUG)


def serve(
    registry: Registry,
    control_socket: str,
    data_socket: str,
    name: str,
    *,
    max_reconnect_count: int = 5,
    script: str = "worker script",
    install_signals: bool = True,
    attach_hook: Callable[[], None] | None = None,
) -> ExitCode:
    """Build a :class:`Worker` and run it until it stops; returns the exit code."""
    worker = Worker(
        registry,
        control_socket,
        data_socket,
        name,
        max_reconnect_count=max_reconnect_count,
        script=script,
    )
    if install_signals and threading.current_thread() is threading.main_thread():
        worker.install_signal_handlers()
    if attach_hook is not None:
        attach_hook()
    return worker.run()
