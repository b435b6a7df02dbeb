"""Errors of the control socket, and how every engine error crosses it and comes back.

An error reply carries the exception's class name, its message and a few attributes; the
client raises the same class again (see :func:`error_from_wire`), so ``except UnknownBackend``
works the same whether the engine is embedded or remote.
"""

from __future__ import annotations

from typing import Any

from .. import errors as engine_errors
from ..errors import EngineStopped, VramtuiError


class EngineNotRunning(EngineStopped):
    """No engine answers on the control socket."""


class ConnectionLost(EngineStopped):
    """The engine hung up in the middle of a request (it stopped, or was killed)."""


class RequestTooLarge(VramtuiError):
    """A request over the server's size limit (the message names the limit)."""

    length: int | None = None
    limit: int | None = None

    def __init__(self, message: str, *, length: int | None = None,
                 limit: int | None = None) -> None:
        super().__init__(message)
        self.length = length
        self.limit = limit


class AccessDenied(VramtuiError):
    """The control socket refused this user (SO_PEERCRED: not the owner, root or the group)."""


class UntrustedEngine(AccessDenied):
    """The control socket is not the engine's user's (its directory, its file or the process
    serving it belongs to someone else): the client refused it before sending anything."""


class EngineBusy(VramtuiError):
    """The engine refused a request for now (it is receiving other large requests); retry."""


class ProtocolMismatch(VramtuiError):
    """The other end speaks another version of the control protocol."""


class BadRequest(VramtuiError):
    """A request the server could not understand (unknown method, wrong arguments)."""


class TooManyConnections(VramtuiError):
    """The server is at its connection limit."""


_ATTRS = ("name", "job_id", "length", "limit")
_LOCAL: dict[str, type[VramtuiError]] = {
    cls.__name__: cls
    for cls in (EngineNotRunning, ConnectionLost, RequestTooLarge, AccessDenied,
                UntrustedEngine, EngineBusy, ProtocolMismatch, BadRequest, TooManyConnections)
}


def _known(name: str) -> type[VramtuiError]:
    cls = _LOCAL.get(name) or getattr(engine_errors, name, None)
    if isinstance(cls, type) and issubclass(cls, VramtuiError):
        return cls
    return VramtuiError


def error_to_wire(exc: BaseException) -> dict[str, Any]:
    """The ERROR payload for ``exc`` (class name, message, the attributes worth keeping)."""
    name = type(exc).__name__ if isinstance(exc, VramtuiError) else "VramtuiError"
    attrs = {a: getattr(exc, a) for a in _ATTRS if isinstance(getattr(exc, a, None), str | int)}
    return {"type": name, "error": str(exc), "attrs": attrs}


def error_from_wire(payload: object) -> VramtuiError:
    """The exception an ERROR payload describes, as the same class when it is known here."""
    if not isinstance(payload, dict):
        return VramtuiError(f"the engine answered with a malformed error: {payload!r:.200}")
    cls = _known(str(payload.get("type", "")))
    message = str(payload.get("error") or "the engine reported an error")
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    attrs = payload.get("attrs")
    if isinstance(attrs, dict):
        for key in _ATTRS:
            if key in attrs:
                setattr(exc, key, attrs[key])
    return exc
