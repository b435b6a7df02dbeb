"""The worker loop: connect, register, initialise, serve requests, report, shut down.

Threads: the main thread reads the data socket and runs ``predict`` (so a model's CUDA work stays
on one thread, as in verda-io), and ``@sleep``/``@wake`` when the server asks (they come on the
data socket, in order with the requests); a control thread answers pings, health and status
requests, cancellations and shutdown while ``predict`` runs.  Extensions (explicit streams, cancel,
progress, request envelopes, error status codes, init-failure reports, quiet status) are used
only when the server's acknowledgement advertised them; otherwise the worker behaves exactly
like a verda-io 0.4.4 worker.

What frames mean is :mod:`worker_sdk.conversation`'s; this module does the I/O and runs the
author's functions.  The data loop blocks in ``recv`` (no poll): a stop request or a lost
control socket wakes it by shutting the data socket's read side (only while it waits there),
so the plain request path is one receive, one decode, predict, one encode and one send.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import socket
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from . import context as ctxmod
from .asyncpredict import iterate_async, run_async
from .connection import (
    Connection,
    ConnectionLost,
    UntrustedServer,
    connect_unix,
    trusted_uids,
)
from .context import Cancelled, RequestContext
from .conversation import Channel, LocalProtocolError, WorkerConversation
from .events import (
    Acknowledgement,
    Cancel,
    Chunk,
    EndOfStream,
    EnvelopeReply,
    ErrorReply,
    Event,
    HealthReply,
    HealthRequest,
    Notice,
    Ping,
    Pong,
    Progress,
    Reply,
    Request,
    ServerError,
    Shutdown,
    SleepReply,
    SleepRequest,
    Status,
    StatusQuery,
    StatusReply,
    StatusRequest,
    WakeReply,
    WakeRequest,
)
from .protocol import EXTENSIONS, SMALL_BIN, EventType, ProtocolError, encode_small_bin
from .registry import Registry
from .response import Response
from .sleeping import run_sleep_hook

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("worker_sdk")
_activate, _deactivate = ctxmod.activate, ctxmod.deactivate


class ExitCode(IntEnum):
    OK = 0
    SCRIPT = 1  # the worker script could not be loaded, or registered something unusable
    USAGE = 2  # bad flags or config
    INIT_FAILED = 3  # an @initialize function raised (reported on the control socket first)
    SERVER_LOST = 4  # the server could not be reached, or was lost for good


_CANCELLED_STATUS = 499
_BYTES_LIKE = (bytes, bytearray, memoryview)


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
        registry.check_sleep(script)
        self.control_path = control_socket
        self.data_path = data_socket
        self.name = name
        self.max_reconnect_count = max_reconnect_count
        self.connect_timeout = connect_timeout
        self.ack_timeout = ack_timeout
        # The capability to sleep is offered only by a worker that has both hooks.
        self.offered = features | {"sleep"} if registry.can_sleep else features
        self.features: frozenset[str] = frozenset()
        self.state = "initializing"
        self.control: Connection | None = None
        self.data: Connection | None = None
        self._stop = threading.Event()
        self._acked = threading.Event()
        self._lost = threading.Event()
        self._current: RequestContext | None = None
        self._early_cancels: deque[int] = deque(maxlen=256)
        # True while the main thread waits for the data socket (or is about to): then a stop
        # or a lost control socket wakes it by shutting the data socket's read side.
        self._idle = False
        self._halt = False  # stop requested or control lost: the data loop must look up
        self._loud = True  # busy/ready status around each request (no "quiet-status")
        self._predict_takes_context = registry.predict_takes_context
        self._progress_sink = self._send_progress  # (one bound method, not one per request)
        self._data_sendall: Callable[[bytes], None] = _not_connected
        self._loop: asyncio.AbstractEventLoop | None = None
        self._control_thread: threading.Thread | None = None
        self._main_ident = 0  # the thread that runs predict and alone sends on the data socket

    # -- lifecycle ----------------------------------------------------------------------------
    def request_stop(self, why: str) -> None:
        if not self._stop.is_set():
            log.info("stopping: %s", why)
        self._stop.set()
        self._halt = True
        self._wake()

    def _wake(self) -> None:
        """Wake the main thread if it waits on the data socket (it reads EOF, then looks)."""
        data = self.data
        if self._idle and data is not None:
            with contextlib.suppress(OSError):
                data.sock.shutdown(socket.SHUT_RD)

    def install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: object) -> None:
            self.request_stop(f"signal {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self) -> ExitCode:
        self._main_ident = threading.get_ident()
        try:
            try:
                connected = self._connect(self.connect_timeout)
            except UntrustedServer as exc:
                log.error("%s", exc)
                return ExitCode.SERVER_LOST
            if not connected:
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
                self.control.send(Status(self.control.next_id(), "failed", error))

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
        trusted = trusted_uids()  # (UntrustedServer: another user's server; nothing sent)
        while not self._stop.is_set():
            try:
                control_sock = connect_unix(self.control_path, timeout=5.0, trusted=trusted)
                try:
                    data_sock = connect_unix(self.data_path, timeout=5.0, trusted=trusted)
                except BaseException:
                    control_sock.close()
                    raise
                break
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                self._stop.wait(interval)
                interval = min(interval * 2, 1.0)
        else:
            return False
        self.features = frozenset()
        self._loud = True
        control = Connection(control_sock, WorkerConversation(Channel.CONTROL,
                                                              offered=self.offered))
        # Only the main thread sends on the data socket.
        data = Connection(data_sock, WorkerConversation(Channel.DATA, offered=self.offered),
                          one_sender=True)
        self.control, self.data = control, data
        self._data_sendall = data_sock.sendall  # (only the main thread sends there)
        self._acked.clear()
        self._lost.clear()
        self._halt = self._stop.is_set()
        # Wire ids are per connection: a new server session may reuse an old cancelled id.
        self._early_cancels.clear()
        try:
            control.send(control.conversation.registration(self.name))
            data.send(data.conversation.registration(self.name))
        except ConnectionLost:
            self._close_connections()
            return False
        self._control_thread = threading.Thread(
            target=self._control_loop, args=(control,), name="worker-control", daemon=True
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
            try:
                connected = self._connect(timeout=0.0)
            except UntrustedServer as exc:  # another user's server took the socket's place
                log.error("%s", exc)
                return False
            if connected:
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
                event = conn.receive()
            except ConnectionLost:
                break
            except ProtocolError as exc:
                log.error("control socket: %s", exc)
                if exc.fatal:
                    conn.close()
                    break
                continue
            try:
                self._handle_control(conn, event)
            except ConnectionLost:
                break
        if not self._stop.is_set():
            self._lost.set()
            self._halt = True
            self._wake()

    def _handle_control(self, conn: Connection, event: Event) -> None:
        cls = type(event)
        if cls is Ping:
            conn.send(Pong(event.id))
        elif cls is StatusRequest:
            conn.send(StatusReply(event.id, self.state))
        elif cls is StatusQuery:
            self._send_status(self.state)
        elif cls is Shutdown:
            self.request_stop("SHUTDOWN from the server")
        elif cls is Cancel:
            self._cancel(event.request)  # type: ignore[attr-defined]
        elif cls is HealthRequest:
            self._send_health(conn, event.id)
        elif cls is Acknowledgement:
            features = conn.conversation.features
            if self.data is not None:
                self.data.conversation.adopt(features)
            self.features = features
            self._loud = "quiet-status" not in features
            self._acked.set()
        elif cls is Notice:
            log.info("event %s from the server", EventType(event.code).name)  # type: ignore

    def _send_health(self, conn: Connection, msg_id: int) -> None:
        fn = self.registry.hardware_health
        if fn is None:
            conn.send(HealthReply(msg_id, {"status": "not enabled"}))
            return
        try:
            result = fn()
            conn.send(HealthReply(msg_id, result))
        except ConnectionLost:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing (or unencodable) check is reported
            conn.send(HealthReply(msg_id, {"status": "error",
                                           "error": f"{type(exc).__name__}: {exc}"}))

    def _cancel(self, wire_id: int) -> None:
        # No lock, and no request missed: the main thread sets _current, then looks at the
        # early cancels; this thread adds to them, then looks at _current.  (Under the GIL one
        # of the two sees the other's write; cancelling twice is harmless.)
        self._early_cancels.append(wire_id)
        ctx = self._current
        if ctx is not None and ctx.wire_id == wire_id:
            ctx.cancel()

    def _set_state(self, state: str, *, force: bool = False) -> None:
        self.state = state
        if force or self._loud:
            self._send_status(state)

    def _send_status(self, state: str) -> None:
        control = self.control
        if control is not None:
            with contextlib.suppress(ConnectionLost):
                control.send(Status(control.next_id(), state))

    def _send_progress(self, wire_id: int, fraction: float | None, text: str) -> None:
        # On the data socket where the server reads it there (``data-progress``), so that it
        # arrives in order with the chunks — but only from the main thread, its one sender.
        conn = self.data if "data-progress" in self.features and \
            threading.get_ident() == self._main_ident else self.control
        if "progress" in self.features and conn is not None:
            with contextlib.suppress(ConnectionLost):
                conn.send(Progress(conn.next_id(), wire_id, fraction, text))

    # -- data socket --------------------------------------------------------------------------
    def _serve(self) -> ExitCode:
        while True:
            try:
                self._serve_data()  # returns once a stop was requested
                return self._graceful_exit()
            except _Lost:
                if self._stop.is_set():
                    return self._graceful_exit()
                if not self._reconnect():
                    if self._stop.is_set():
                        return self._graceful_exit()
                    log.error("the server is gone for good after %d reconnect attempts",
                              self.max_reconnect_count)
                    return ExitCode.SERVER_LOST

    def _serve_data(self) -> None:
        """The hot loop: one blocking receive, decode, predict, encode, one send."""
        conn = self.data
        assert conn is not None
        conv = conn.conversation
        next_event, get_buffer, updated = conv.next_event, conv.get_buffer, conv.buffer_updated
        recv_into = conn.sock.recv_into
        while True:
            try:
                event = next_event()
            except ProtocolError as exc:
                self._on_data_protocol_error(conn, exc)
                continue
            if event is None:
                self._idle = True  # before looking at the flag: see _wake
                if self._halt:
                    self._idle = False
                    if self._stop.is_set():
                        return
                    raise _Lost
                try:
                    n = recv_into(get_buffer())
                except OSError:
                    n = 0
                self._idle = False
                if n == 0:
                    if self._stop.is_set():
                        return
                    raise _Lost
                updated(n)
            elif type(event) is Request:
                if self.state == "asleep":
                    self._send_data(ErrorReply(event.id, "Asleep: the worker is asleep; wake "
                                               "it before sending requests", "asleep", 409))
                else:
                    self._serve_request(event)
            elif type(event) is SleepRequest or type(event) is WakeRequest:
                self._sleep_or_wake(event)
            elif type(event) is Ping:
                self._send_data(Pong(event.id))
            elif type(event) is ServerError:
                log.error("ERROR from the server: %s", event.error)  # type: ignore[attr-defined]

    def _sleep_or_wake(self, event: Event) -> None:
        """Run ``@sleep`` or ``@wake`` on this (the main) thread and answer the server."""
        asleep = type(event) is SleepRequest
        if asleep == (self.state == "asleep"):  # already there: nothing to do, say so
            self._send_data(SleepReply(event.id, "asleep") if asleep
                            else WakeReply(event.id, "awake"))
            return
        registry = self.registry
        if asleep:
            level = event.level  # type: ignore[attr-defined]
            hook = registry.sleep
            args: tuple[Any, ...] = (level,) if registry.sleep_takes_level else ()
        else:
            hook, args = registry.wake, ()
        assert hook is not None  # "sleep" is offered only with both hooks
        outcome = run_sleep_hook(hook, args, self._event_loop, measure_host=asleep)
        if outcome.error is not None:
            log.error("@%s failed: %s", "sleep" if asleep else "wake", outcome.error)
            reply: Event = (SleepReply(event.id, "error", outcome.error) if asleep
                            else WakeReply(event.id, "error", outcome.error))
        elif asleep:
            self.state = "asleep"
            reply = SleepReply(event.id, "asleep", None, outcome.kept_mib, outcome.host_mib)
        else:
            self.state = "ready"
            reply = WakeReply(event.id, "awake")
        self._send_data(reply)

    def _on_data_protocol_error(self, conn: Connection, exc: ProtocolError) -> None:
        log.error("data socket: %s", exc)
        if exc.fatal:
            conn.close()
            raise _Lost from exc
        if exc.message_id is not None:
            self._send_data(ErrorReply(exc.message_id, f"ProtocolError: {exc}", "bad_request",
                                       400))

    def _send_data(self, event: Event) -> None:
        try:
            self.data.send(event)  # type: ignore[union-attr]
        except ConnectionLost as exc:
            raise _Lost from exc

    def _serve_request(self, request: Request) -> None:
        """Run predict for one request and send its reply (the hot path: keep it lean)."""
        msg_id = request.id
        ctx = RequestContext(msg_id, request_id=request.request_id, metadata=request.metadata,
                             deadline=request.deadline, progress_sink=self._progress_sink)
        self._current = ctx  # (then the early cancels: see _cancel)
        if self._early_cancels and msg_id in self._early_cancels:
            ctx.cancel()
        self.state = "busy"
        if self._loud:
            self._send_status("busy")
        token = _activate(ctx)
        try:
            if ctx.cancelled:
                raise Cancelled(f"request {ctx.id} was cancelled")
            if self._predict_takes_context:
                result = self.predict(request.payload, ctx)
            else:
                result = self.predict(request.payload)
            if type(result) is bytes and len(result) < SMALL_BIN:  # the common case, first
                try:
                    self._data_sendall(encode_small_bin(7, 0, msg_id, result))
                except OSError as exc:
                    raise _Lost from exc
            else:
                self._reply(msg_id, ctx, result)
        except _Lost:
            raise
        except Cancelled:
            self._send_cancelled(msg_id, ctx)
        except Exception as exc:  # noqa: BLE001 - any predict failure becomes an error reply
            if log.isEnabledFor(logging.DEBUG):
                log.debug("predict failed", exc_info=True)
            elif not isinstance(exc, LocalProtocolError):
                traceback.print_exc()
            name = "ValueError" if isinstance(exc, LocalProtocolError) else type(exc).__name__
            self._send_data(ErrorReply(msg_id, f"{name}: {exc}", "prediction_error", 500))
        except BaseException as exc:
            if not _async_cancel(exc):
                raise
            self._send_cancelled(msg_id, ctx)
        finally:
            _deactivate(token)
            self._current = None
            self.state = "ready"
            if self._loud:
                self._send_status("ready")

    def _send_cancelled(self, msg_id: int, ctx: RequestContext) -> None:
        self._send_data(ErrorReply(msg_id, f"Cancelled: request {ctx.id} was cancelled",
                                   "cancelled", _CANCELLED_STATUS))

    def _reply(self, msg_id: int, ctx: RequestContext, result: Any) -> None:
        """Send what predict returned, whatever it is (the rarer kinds)."""
        if inspect.isawaitable(result):
            result = run_async(self._event_loop(), result, ctx)
        if inspect.isgenerator(result):
            self._stream(msg_id, ctx, result)
        elif inspect.isasyncgen(result):
            self._stream(msg_id, ctx, iterate_async(self._event_loop, result, ctx))
        elif isinstance(result, Response):
            self._send_data(EnvelopeReply(msg_id, _as_bytes(result.data),
                                          dict(result.headers), result.status_code))
        elif isinstance(result, _BYTES_LIKE):
            self._send_data(Reply(msg_id, result))
        else:
            raise TypeError(
                "predict() must return bytes, worker_sdk.Response or a generator of bytes, "
                f"got {type(result).__name__}"
            )

    def _stream(self, msg_id: int, ctx: RequestContext, chunks: Any) -> None:
        try:
            for chunk in chunks:
                if ctx.cancelled:
                    raise Cancelled(f"request {ctx.id} was cancelled")
                self._send_data(Chunk(msg_id, _as_chunk(chunk)))
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        self._send_data(EndOfStream(msg_id))

    # -- async predicts -----------------------------------------------------------------------
    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            import asyncio  # (only a worker with async hooks pays its import)

            self._loop = asyncio.new_event_loop()
        return self._loop


def _async_cancel(exc: BaseException) -> bool:
    """``exc`` is asyncio's CancelledError (an async predict's task cancelled): none can be
    raised before something imported asyncio, so it is not imported to ask."""
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)


def _not_connected(_frame: bytes) -> None:
    raise OSError("not connected")


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
