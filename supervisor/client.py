"""`Client`: the engine API over the control socket, the same methods as the in-process facade.

It implements :class:`supervisor.api.EngineAPI`: the same methods, the same return types (the
dataclasses are rebuilt from the wire) and the same exceptions (an error reply is raised again
as its own class from :mod:`supervisor.errors`).  Besides, :class:`EngineNotRunning` when no
engine answers, :class:`ConnectionLost` when it hangs up mid-request (both are
:class:`EngineStopped`), :class:`RequestTooLarge`, :class:`AccessDenied`.

Thread-safe: each call borrows a connection from a small pool (a call in progress on one thread,
``wait`` included, never holds up another), so the common call is one ``sendmsg`` and one
``recv`` on a blocking socket — no thread hop.  Each subscription has a connection of its own
read by a daemon thread.  ``stop()`` closes this client; the engine keeps running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from supervisor.clock import monotonic
from worker_sdk.protocol import DataType, Decoder, EventType, Message, MessageType, encode

from .apispec import METHODS
from .control import messages as m
from .control import trust
from .control.codec import DecodeError, event_from_wire, snapshot_from_wire
from .control.errors import (
    AccessDenied,
    ConnectionLost,
    EngineNotRunning,
    RequestTooLarge,
    error_from_wire,
)
from .errors import InvalidRequest, VramtuiError
from .events import EngineEvent, EventHub, Subscription
from .jobs import JobView
from .jobs.query import DEFAULT_LIMIT
from .snapshot import EngineSnapshot

if TYPE_CHECKING:
    from .results import (
        CancelResult,
        DescriptorInfo,
        JobRequest,
        LogChunk,
        ReloadResult,
        ReportFile,
        YieldInfo,
    )

__all__ = ["Client", "LogChunk", "RemoteSubscription", "RequestTooLarge"]


def __getattr__(name: str) -> Any:  # LogChunk used to live here
    if name == "LogChunk":
        from .results import LogChunk

        return LogChunk
    raise AttributeError(name)

CALL_TIMEOUT = 30.0
WAIT_MARGIN = 30.0
POOL_SIZE = 4
#: Signals a subscription's reader thread never takes (they are the main thread's).
TERMINAL_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


class _Conn:
    """One blocking connection: frames out, frames in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = Decoder(m.MAX_REPLY)
        self._ids = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def send(self, msg_type: int, msg_id: int, payload: Any) -> None:
        try:
            frames = encode(msg_type, DataType.DEFAULT, msg_id, payload)
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. an int over 64 bits
            raise InvalidRequest(f"an argument cannot be sent to the engine: {exc}") from None
        if len(frames) == 1:
            self.sock.sendall(frames[0])
            return
        total = sum(len(f) for f in frames)
        sent = self.sock.sendmsg(frames)
        if sent < total:
            self.sock.sendall(b"".join(bytes(f) for f in frames)[sent:])

    def recv(self, timeout: float | None) -> Message:
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            message = self.decoder.next()
            if message is not None:
                return message
            if deadline is not None:
                left = deadline - monotonic()
                if left <= 0:
                    raise TimeoutError
                self.sock.settimeout(left)
            else:
                self.sock.settimeout(None)
            buf = self.decoder.get_buffer()
            try:
                n = self.sock.recv_into(buf)
            finally:
                buf.release()
            if n == 0:
                raise EOFError
            self.decoder.buffer_updated(n)

    def alive(self) -> bool:
        """False when the other end has closed this idle connection (EOF waiting)."""
        before = self.sock.gettimeout()
        self.sock.settimeout(0.0)  # never wait here (with a timeout, recv would poll first)
        try:
            return self.sock.recv(1, socket.MSG_PEEK) != b""
        except BlockingIOError:
            return True  # nothing to read: still open
        except OSError:
            return False
        finally:
            self.sock.settimeout(before)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class RemoteSubscription(Subscription):
    """A :class:`Subscription` fed from the socket (callbacks run on its reader thread).

    When the engine dropped events because this subscriber fell behind, ``lagged`` is set,
    ``dropped`` counts them and ``snapshot`` holds the engine's state at that moment.
    """

    snapshot: EngineSnapshot | None = None


class _RemoteHub(EventHub):
    def __init__(self, conn: _Conn) -> None:
        super().__init__()
        self.conn = conn
        self.closed = False

    def attach(self, sub: Subscription) -> None:
        with self._lock:
            self._subs = [*self._subs, sub]

    def unsubscribe(self, sub: Subscription) -> None:
        super().unsubscribe(sub)
        self.closed = True
        self.conn.close()

    def pump(self, sub: RemoteSubscription) -> None:
        # It starts with TERMINAL_SIGNALS blocked (see _subscribe). A callback is the
        # caller's code, run here: what it starts must take ctrl+c and kill as usual (a
        # child inherits the mask), and no thread waits on a queue then.
        if sub.callback is not None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, TERMINAL_SIGNALS)
        try:
            while not self.closed:
                try:
                    message = self.conn.recv(None)
                except (OSError, EOFError, ValueError):
                    return
                payload = message.payload
                if message.type != MessageType.EVENT or not isinstance(payload, dict):
                    continue
                if payload.get("event") == EventType.SHUTDOWN:
                    return
                if "e" in payload:
                    try:
                        self.publish(event_from_wire(payload["e"]))
                    except DecodeError:
                        continue
                    except Exception:  # a callback's own error must not end the stream
                        import logging  # (not at import: the CLI starts faster without it)

                        logging.getLogger("supervisor.client").exception(
                            "a subscription callback failed")
                elif "lagged" in payload:
                    sub.lagged = True
                    sub.dropped += int(payload.get("lagged") or 0)
                    with contextlib.suppress(DecodeError):
                        sub.snapshot = snapshot_from_wire(payload.get("snapshot"))
        finally:
            self.close()


def _connect_socket(path: str, timeout: float) -> socket.socket:
    """A connected socket to the engine at ``path`` once it is known to be the engine's user's
    (see :mod:`supervisor.control.trust`); nothing has been sent on it yet."""
    trusted = trust.trusted_uids()
    trust.check_socket_path(path, trusted)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        trust.check_peer(sock, path, trusted)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        why = "no socket there" if isinstance(exc, FileNotFoundError) else "nothing listens"
        raise EngineNotRunning(
            f"no vramtui engine is running at {path} ({why}); start one with "
            "`vramtui --serve`, or run `vramtui`") from None
    except PermissionError:
        sock.close()
        raise AccessDenied(f"permission denied opening {path}: the engine belongs to another "
                           "user (it can open its socket to a group with --allow-group)") from None
    except OSError as exc:
        sock.close()
        raise EngineNotRunning(f"cannot reach the engine at {path}: "
                               f"{exc.strerror or exc}") from None
    except BaseException:
        sock.close()
        raise
    return sock


class Client:
    """The engine API over the control socket at ``path`` (connects at once)."""

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = CALL_TIMEOUT,
                 version: str = "") -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self.version = version
        self.info: dict[str, Any] = {}
        self._idle: list[_Conn] = []
        self._hubs: list[_RemoteHub] = []
        self._lock = threading.Lock()
        self._closed = False
        self._release(self._open())

    # -- connections --------------------------------------------------------------------------
    def _open(self) -> _Conn:
        conn = _Conn(_connect_socket(self.path, self.timeout))
        try:
            # Refused at once (BrokenPipe): the reason is waiting to be read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.send(MessageType.REGISTRATION, 0, m.hello(self.version))
            reply = conn.recv(self.timeout)
        except (OSError, EOFError, TimeoutError) as exc:
            conn.close()
            raise EngineNotRunning(f"the engine at {self.path} did not answer its hello "
                                   f"({_why(exc)}); is it starting or stuck?") from None
        except BaseException:
            conn.close()
            raise
        if reply.type == MessageType.ERROR:
            conn.close()
            raise error_from_wire(reply.payload)
        if reply.type != MessageType.ACKNOWLEDGEMENT or not isinstance(reply.payload, dict):
            conn.close()
            raise VramtuiError(f"{self.path} is not a vramtui control socket")
        self.info = reply.payload
        return conn

    def _acquire(self) -> _Conn:
        while True:
            with self._lock:
                if self._closed:
                    raise EngineNotRunning("this client was closed")
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open()
            if conn.alive():
                return conn
            conn.close()  # the engine hung up on it (it restarted?): try the next one

    def _release(self, conn: _Conn) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < POOL_SIZE:
                self._idle.append(conn)
                return
        conn.close()

    def _call(self, method: str, args: dict[str, Any] | None = None, *,
              timeout: float | None = CALL_TIMEOUT, retry: bool = False) -> Any:
        conn = self._acquire()
        try:
            msg_id = conn.next_id()
            conn.send(MessageType.REQUEST, msg_id, {"m": method, "a": args or {}})
            while True:
                reply = conn.recv(timeout)
                if reply.id == msg_id or (reply.type == MessageType.ERROR and reply.id == 0):
                    break
        except (OSError, EOFError) as exc:
            conn.close()
            if retry and not isinstance(exc, TimeoutError):
                return self._call(method, args, timeout=timeout, retry=False)
            if isinstance(exc, TimeoutError):
                raise VramtuiError(f"the engine did not answer {method} within {timeout:g} s"
                                   ) from None
            raise ConnectionLost(f"lost the connection to the engine at {self.path} "
                                 f"({_why(exc)}); it may have stopped") from None
        except BaseException:
            conn.close()  # interrupted mid-request: the connection's state is unknown
            raise
        self._release(conn)
        if reply.type == MessageType.ERROR:
            raise error_from_wire(reply.payload)
        payload = reply.payload
        if not isinstance(payload, dict):
            raise VramtuiError(f"malformed reply to {method}: {payload!r:.200}")
        return payload.get("r")

    def _invoke(self, name: str, given: dict[str, Any], *, waits: str | None = None,
                as_: str | None = None) -> Any:
        """Call API method ``name``: arguments checked and named by its entry in
        :data:`supervisor.apispec.METHODS`, the reply rebuilt as the result type of ``as_``
        (default: ``name``'s).  ``waits``: the argument holding how long the engine may take
        to answer (the call's own timeout is that plus a margin; None: no limit)."""
        spec = METHODS[name]
        args = spec.to_wire(given)
        timeout: float | None = CALL_TIMEOUT
        if waits is not None:
            timeout = _wait_timeout(args.get(spec.arg(waits).wire_name))
        reply = self._call(name, args, timeout=timeout, retry=spec.safe)
        try:
            return METHODS[as_ or name].decode(reply)
        except DecodeError as exc:
            raise VramtuiError(f"malformed reply to {name}: {exc}") from None

    # -- the engine API (each method's arguments and result: supervisor.apispec) ---------------
    def submit(self, backend: str, payload: bytes = b"", *, priority: int | None = None,
               timeout: float | None = None, metadata: dict[str, Any] | None = None,
               stream: bool = False) -> str:
        """Queue a job; returns its id once the engine accepted it."""
        return self._invoke("submit", {"backend": backend, "payload": payload,
                                       "priority": priority, "timeout": timeout,
                                       "metadata": metadata, "stream": stream})

    def submit_wait(self, backend: str, payload: bytes = b"", *, priority: int | None = None,
                    timeout: float | None = None, metadata: dict[str, Any] | None = None,
                    stream: bool = False, wait_timeout: float | None = None) -> JobView:
        """Submit and wait in one round trip; the job's final view."""
        return self._invoke("submit", {
            "backend": backend, "payload": payload, "priority": priority, "timeout": timeout,
            "metadata": metadata, "stream": stream, "wait": True,
            "wait_timeout": wait_timeout}, waits="wait_timeout", as_="wait")

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """Block until the job ends; its final view (raises JobTimeout after ``timeout``)."""
        return self._invoke("wait", {"job_id": job_id, "timeout": timeout}, waits="timeout")

    def job(self, job_id: str) -> JobView:
        """The job now (``position`` is its place in the queue while it waits)."""
        return self._invoke("job", {"job_id": job_id})

    def jobs(self, *, state: str | None = None, backends: Sequence[str] = (),
             limit: int = DEFAULT_LIMIT) -> tuple[JobView, ...]:
        """The jobs held, without their results, in the order of
        :func:`supervisor.jobs.query.list_jobs` (``state``: "queued,running", "active",
        "finished"; ``backends``: only theirs; at most ``limit``, within its limits)."""
        return self._invoke("jobs", {"state": state, "backends": backends, "limit": limit})

    def job_request(self, job_id: str, *, limit: int = 65536) -> JobRequest:
        """The request the job was submitted with (its first ``limit`` bytes), while kept."""
        return self._invoke("job_request", {"job_id": job_id, "limit": limit})

    def cancel(self, job_id: str) -> JobView:
        return self._invoke("cancel", {"job_id": job_id})

    def cancel_many(self, job_ids: Sequence[str]) -> list[CancelResult]:
        """Cancel several jobs; one result each (an unknown job's says so)."""
        return list(self._invoke("cancel_many", {"job_ids": job_ids}) or ())

    def retry(self, job_id: str) -> str:
        """Run a finished job's request again as a new job; the new job's id."""
        return self._invoke("retry", {"job_id": job_id})

    def set_priority(self, job_id: str, priority: int) -> JobView:
        """Give a queued job another priority (higher runs first)."""
        return self._invoke("set_priority", {"job_id": job_id, "priority": priority})

    def evict(self, backend: str) -> None:
        self._invoke("evict", {"backend": backend})

    def respawn(self, backend: str) -> None:
        self._invoke("respawn", {"backend": backend})

    def preload(self, backend: str) -> None:
        self._invoke("preload", {"backend": backend})

    def kill(self, backend: str) -> None:
        """SIGKILL a (stuck) backend's worker now; its jobs fail, saying so."""
        self._invoke("kill", {"backend": backend})

    def sleep(self, backend: str) -> None:
        """Put a backend's idle worker to sleep (its GPU memory given back, its process kept)."""
        self._invoke("sleep", {"backend": backend})

    def wake(self, backend: str) -> None:
        """Wake a backend's sleeping worker (once what waking takes fits)."""
        self._invoke("wake", {"backend": backend})

    def zero(self) -> list[str]:
        return list(self._invoke("zero", {}) or ())

    def drain(self, gpu: int, on: bool = True) -> tuple[int, ...]:
        """Drain a GPU (running work finishes, nothing new admitted there), or reopen it."""
        return tuple(self._invoke("drain", {"gpu": gpu, "on": on}) or ())

    def yield_gpus(self, gpus: Sequence[int] = (), *, for_s: float | None = None,
                   now: bool = False, by: str = "") -> tuple[YieldInfo, ...]:
        """Hand GPUs over to programs we do not manage, until resumed or ``for_s`` ends."""
        return tuple(self._invoke("yield_gpus", {"gpus": list(gpus), "for_s": for_s,
                                                 "now": now, "by": by}) or ())

    def resume_gpus(self, gpus: Sequence[int] = ()) -> tuple[int, ...]:
        """Take yielded GPUs back (none: all of them)."""
        return tuple(self._invoke("resume_gpus", {"gpus": list(gpus)}) or ())

    def reload(self) -> ReloadResult:
        """Read the backend descriptors again and apply what changed."""
        return self._invoke("reload", {})

    def descriptor(self, backend: str) -> DescriptorInfo:
        """A backend's layers (each file's entry for it) and its effective descriptor."""
        return self._invoke("descriptor", {"backend": backend})

    def calibration_report(self, backend: str, *, name: str | None = None) -> ReportFile:
        """A backend's latest calibration report (or the one named), as JSON bytes."""
        return self._invoke("calibration_report", {"backend": backend, "name": name})

    def calibrate(self, backend: str, *, repeats: int = 3, request: bytes | None = None,
                  settle_s: float = 1.0) -> str:
        """Queue a calibration run of ``backend``; its job id (the result is the summary)."""
        return self._invoke("calibrate", {"backend": backend, "repeats": repeats,
                                          "request": request, "settle_s": settle_s})

    def snapshot(self, *, light: bool = False, data_limit: int | None = None) -> EngineSnapshot:
        """The engine now.  Job data and chunks over ``data_limit`` bytes (default 64 KiB)
        are left out (use :meth:`job` or :meth:`wait` for them); -1 keeps everything.
        ``light`` leaves out the GPUs' history, the recent jobs and the log (a quick look:
        ``vramtui status``)."""
        return self._invoke("snapshot", {"light": light, "data_limit": data_limit})

    def logs(self, backend: str, *, lines: int = 50, offset: int | None = None) -> LogChunk:
        """The last ``lines`` of a backend's worker log, or what follows ``offset``."""
        return self._invoke("logs", {"backend": backend, "lines": lines, "offset": offset})

    def subscribe(self, *, kinds: Sequence[str] | None = None, maxsize: int = 1000,
                  callback: Callable[[EngineEvent], Any] | None = None,
                  job_id: str | None = None) -> RemoteSubscription:
        """Events as they happen, on a connection of their own (``job_id``: one job's only)."""
        args = METHODS["subscribe"].to_wire({"kinds": kinds, "job_id": job_id})
        _, sub = self._subscribe("subscribe", args, kinds, maxsize, callback)
        return sub

    def submit_follow(self, backend: str, payload: bytes = b"", *, priority: int | None = None,
                      timeout: float | None = None, metadata: dict[str, Any] | None = None,
                      stream: bool = False, maxsize: int = 1000,
                      ) -> tuple[str, RemoteSubscription]:
        """Submit, and receive that job's events (``job``, ``chunk``) from its first moment."""
        args = METHODS["submit"].to_wire({
            "backend": backend, "payload": payload, "priority": priority, "timeout": timeout,
            "metadata": metadata, "stream": stream, "follow": True})
        result, sub = self._subscribe("submit", args, ("job", "chunk"), maxsize, None)
        return str(result["id"]), sub

    def _subscribe(self, method: str, args: dict[str, Any], kinds: Sequence[str] | None,
                   maxsize: int, callback: Callable[[EngineEvent], Any] | None,
                   ) -> tuple[Any, RemoteSubscription]:
        conn = self._open()
        try:
            msg_id = conn.next_id()
            conn.send(MessageType.REQUEST, msg_id, {"m": method, "a": args})
            reply = conn.recv(self.timeout)
        except (OSError, EOFError) as exc:
            conn.close()
            raise ConnectionLost(f"lost the connection to the engine at {self.path} "
                                 f"({_why(exc)})") from None
        except BaseException:
            conn.close()
            raise
        if reply.type == MessageType.ERROR:
            conn.close()
            raise error_from_wire(reply.payload)
        result = reply.payload.get("r") if isinstance(reply.payload, dict) else None
        if not isinstance(result, dict | str):
            conn.close()
            raise VramtuiError(f"malformed reply to {method}: {reply.payload!r:.200}")
        conn.sock.settimeout(None)
        hub = _RemoteHub(conn)
        with self._lock:
            self._hubs = [h for h in self._hubs if not h.closed] + [hub]
        sub = RemoteSubscription(hub, maxsize, frozenset(kinds) if kinds else None, callback)
        hub.attach(sub)
        # Ctrl+C and kill go to the main thread, never to the reader: Python runs handlers
        # only in the main thread, and one waiting on this subscription's queue would not
        # wake for a signal the kernel gave the reader (``vramtui events`` hung until the
        # next event). Blocked here, the thread starts with them blocked: no moment unmasked.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, TERMINAL_SIGNALS)
        try:
            threading.Thread(target=hub.pump, args=(sub,), name="vramtui-events",
                             daemon=True).start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return result, sub

    def stop(self, timeout: float | None = None) -> None:
        """Close this client (the engine itself keeps running; see :meth:`shutdown_engine`)."""
        self.close()

    # -- the wire only ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The control server's counters and connections."""
        return dict(self._invoke("stats", {}) or {})

    def ping(self) -> float:
        """Seconds for one round trip."""
        t0 = time.perf_counter()
        self._invoke("ping", {})
        return time.perf_counter() - t0

    def shutdown_engine(self, now: bool = False) -> tuple[str, ...]:
        """Ask the engine to stop, as SIGTERM does (running jobs get their stop grace; with
        ``now``, they are interrupted); the running jobs it waits for."""
        result: tuple[str, ...] = self._invoke("shutdown", {"now": now})
        return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            hubs, self._hubs = self._hubs, []
        for conn in idle:
            conn.close()
        for hub in hubs:  # their reader threads see the socket close and end the streams
            hub.closed = True
            hub.conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wait_timeout(timeout: float | None) -> float | None:
    from .validate import check_seconds  # here: a CLI start does not pay for it

    timeout = check_seconds(timeout, "wait timeout", allow_zero=True)  # NaN would never end
    return None if timeout is None else timeout + WAIT_MARGIN


def _why(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "it hung up"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
