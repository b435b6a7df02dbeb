"""The typed messages of the worker protocol: what a conversation hands out and takes in.

Each class is one thing a peer can say, already validated: a worker's ``Registration``, a
server's ``Acknowledgement``, ``Ping``/``Pong`` (either end, either socket), the server's
requests and control events, and the worker's replies and status reports.  Every message has
the wire ``id`` of its frame; replies carry the id of the request they answer.

:mod:`worker_sdk.conversation` turns frames into these (refusing what the protocol does not
allow) and these into frames.  Nothing here does I/O or validation of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Acknowledgement",
    "Cancel",
    "Chunk",
    "EndOfStream",
    "EnvelopeReply",
    "ErrorReply",
    "Event",
    "HealthReply",
    "HealthRequest",
    "Notice",
    "Ping",
    "Pong",
    "Progress",
    "Registration",
    "Reply",
    "Request",
    "ServerError",
    "Shutdown",
    "SleepReply",
    "SleepRequest",
    "Status",
    "StatusQuery",
    "StatusReply",
    "StatusRequest",
    "WakeReply",
    "WakeRequest",
]

# Not frozen: a frozen dataclass's __init__ costs twice as much, and Request/Reply are on
# every request's path.  Treat them as immutable all the same.


@dataclass(slots=True)
class Event:
    """Base of every typed message."""

    id: int


# -- the handshake (the first frame on each socket, then its answer) ---------------------------


@dataclass(slots=True)
class Registration(Event):
    """A worker says who it is and which extensions it supports."""

    name: str
    kind: str = "ml_worker"
    features: frozenset[str] = frozenset()
    version: str | None = None  # our protocol version; None for a plain verda-io worker


@dataclass(slots=True)
class Acknowledgement(Event):
    """The server accepted a registration; ``features`` is what it supports itself."""

    identifier: str
    features: frozenset[str] = frozenset()


# -- liveness -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Ping(Event):
    """Are you there?  Answered by a :class:`Pong` with the same id on the same socket."""


@dataclass(slots=True)
class Pong(Event):
    """The answer to the :class:`Ping` of the same id."""


# -- control socket, server to worker -------------------------------------------------------


@dataclass(slots=True)
class Shutdown(Event):
    """Finish the request in flight, then exit (EVENT SHUTDOWN)."""


@dataclass(slots=True)
class StatusQuery(Event):
    """Send a :class:`Status` event now (EVENT STATUS from the server)."""


@dataclass(slots=True)
class Cancel(Event):
    """Cancel the request whose wire id is ``request`` (extension ``cancel``)."""

    request: int


@dataclass(slots=True)
class Notice(Event):
    """An event a worker only logs: EMPTY, NOTIFY or RESTART sent by a server (``code``)."""

    code: int


@dataclass(slots=True)
class HealthRequest(Event):
    """Run the hardware-health check; answered by a :class:`HealthReply`."""


@dataclass(slots=True)
class StatusRequest(Event):
    """Say your status; answered by a :class:`StatusReply` (any REQUEST but health)."""


# -- control socket, worker to server -------------------------------------------------------


@dataclass(slots=True)
class Status(Event):
    """The worker's state: initializing, ready, busy, or failed (with ``error``)."""

    status: str
    error: str | None = None
    timestamp: float | None = None  # the worker's own clock, when its frame carried one


@dataclass(slots=True)
class Progress(Event):
    """How far request ``request`` got: ``fraction`` in [0, 1] or None, and a phase text."""

    request: int
    fraction: float | None
    message: str = ""


@dataclass(slots=True)
class HealthReply(Event):
    """The answer to a :class:`HealthRequest`: what the worker's check returned."""

    payload: Any = None


@dataclass(slots=True)
class StatusReply(Event):
    """The answer to a :class:`StatusRequest`."""

    status: str


# -- sleep (capability ``sleep``; on the data socket, in order with the requests) ------------


@dataclass(slots=True)
class SleepRequest(Event):
    """Give the GPU memory back and stay alive (the worker's ``@sleep`` runs); ``level`` as
    vLLM's: 1 keeps the weights in host memory, 2 drops them too.  Answered by a
    :class:`SleepReply`."""

    level: int = 1


@dataclass(slots=True)
class WakeRequest(Event):
    """Take the memory again after a sleep (the worker's ``@wake`` runs); answered by a
    :class:`WakeReply`."""


@dataclass(slots=True)
class SleepReply(Event):
    """The answer to a :class:`SleepRequest`: ``status`` "asleep", or "error" with ``error``.

    ``kept_mib`` and ``host_mib`` are what the worker *says* it keeps on the GPU and took in
    host memory (None: it does not say); the server measures what it really keeps.
    """

    status: str
    error: str | None = None
    kept_mib: int | None = None
    host_mib: int | None = None


@dataclass(slots=True)
class WakeReply(Event):
    """The answer to a :class:`WakeRequest`: ``status`` "awake", or "error" with ``error``."""

    status: str
    error: str | None = None


# -- data socket ---------------------------------------------------------------------------


@dataclass(slots=True)
class Request(Event):
    """One request for ``predict`` (a plain DATA frame, or our envelope with metadata)."""

    payload: bytes
    request_id: str | None = None
    metadata: dict[str, Any] | None = None
    deadline: float | None = None
    stream: bool = False  # server side only: a plain verda-io worker's reply will be a stream


@dataclass(slots=True)
class Reply(Event):
    """A whole reply of bytes."""

    data: bytes | bytearray | memoryview


@dataclass(slots=True)
class EnvelopeReply(Event):
    """A reply with headers and a status code (verda-io's ``Response``)."""

    data: bytes | bytearray | memoryview
    headers: dict[str, Any] = field(default_factory=dict)
    status_code: int = 200


@dataclass(slots=True)
class Chunk(Event):
    """One piece of a streamed reply."""

    data: bytes | bytearray | memoryview


@dataclass(slots=True)
class EndOfStream(Event):
    """A streamed reply is complete."""


@dataclass(slots=True)
class ErrorReply(Event):
    """The request failed: ``error`` text, ``kind`` (prediction_error, cancelled, ...)."""

    error: str
    kind: str = "prediction_error"
    status_code: int = 500


@dataclass(slots=True)
class ServerError(Event):
    """An ERROR frame a server sent to a worker (verda-io only logs it)."""

    error: str
