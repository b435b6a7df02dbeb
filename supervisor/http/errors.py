"""One error shape for every route: ``{"error": {"message", "type", "code"}}`` and a status.

OpenAI's clients read the same shape, so their exceptions carry our message.  The engine's
exceptions map to statuses here and nowhere else:

====================  ======  =========================================================
QueueFull             503     + ``Retry-After``: try again soon
EngineStopped         503     + ``Retry-After``: the engine is stopping (or restarting)
BackendFailed         503     + ``Retry-After``: it waits for a respawn
Refused (submit)      507     too large for every GPU here (another box may take it)
NothingToDo           409     ``nothing_to_do``: so already (resume a GPU not yielded, …)
Refused (other)       409     e.g. evict while busy
UnknownBackend/Job/Gpu 404
NoReport              404     no calibration report (of that name)
JobTimeout            504     a wait ran out of time (the job goes on)
InvalidRequest        400
====================  ======  =========================================================
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..errors import (
    BackendFailed,
    EngineStopped,
    InvalidRequest,
    JobTimeout,
    NoReport,
    NothingToDo,
    QueueFull,
    Refused,
    UnknownBackend,
    UnknownGpu,
    UnknownJob,
    VramtuiError,
)

RETRY_AFTER_S = 2
# An error echoes what it was sent (a model's name, a path, a header): never read as anything
# but the JSON it is, whatever a browser would sniff in it.
ERROR_HEADERS = {"X-Content-Type-Options": "nosniff"}


#: The mark of a route handler whose errors are in Ollama's shape (``ollama_jobs.ollama_errors``
#: sets it): its clients read that shape, wherever the error is raised.
OLLAMA_SHAPED = "ollama_shaped"


class HttpError(Exception):
    """An error answer: raise it from a route (or build one with :func:`from_engine`)."""

    def __init__(self, status: int, message: str, type_: str, code: str | None = None,
                 headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code or type_
        self.headers = {**ERROR_HEADERS, **(headers or {})}
        self.param = param

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.code}
        if self.param is not None:
            err["param"] = self.param
        return {"error": err}

    def response(self) -> web.Response:
        return web.Response(status=self.status, body=json.dumps(self.body()).encode(),
                            content_type="application/json", headers=self.headers)

    def ollama_response(self) -> web.Response:
        """The same error in Ollama's shape (``{"error": "…"}``), which its clients read."""
        from .ollama_shapes import error_body

        return web.Response(status=self.status, body=json.dumps(error_body(self.message)).encode(),
                            content_type="application/json", headers=self.headers)

    def response_for(self, request: web.Request) -> web.Response:
        """The answer in the shape the clients of ``request``'s route read: Ollama's for its
        routes (marked ``OLLAMA_SHAPED``) and for a path under ``/api/`` that no route takes
        (Ollama's namespace: a 404, or a 405 for a method its route does not take), OpenAI's
        elsewhere; for an error a middleware raises before the route runs (the token, the
        body limit, requests in flight) too."""
        match = request.match_info
        if getattr(getattr(match, "handler", None), OLLAMA_SHAPED, False) or (
                getattr(match, "http_exception", None) is not None
                and request.path.startswith("/api/")):
            return self.ollama_response()
        return self.response()


def bad_request(message: str, code: str = "invalid_request", param: str | None = None
                ) -> HttpError:
    return HttpError(400, message, "invalid_request_error", code, param=param)


def not_found(message: str, code: str = "not_found") -> HttpError:
    return HttpError(404, message, "not_found_error", code)


def conflict(message: str, code: str) -> HttpError:
    return HttpError(409, message, "conflict_error", code)


def unavailable(message: str, code: str, retry_after: int = RETRY_AFTER_S) -> HttpError:
    return HttpError(503, message, "unavailable_error", code,
                     headers={"Retry-After": str(retry_after)})


def from_engine(exc: BaseException, *, submitting: bool = False) -> HttpError:
    """The answer for an exception the engine raised (``submitting``: from a submit)."""
    text = str(exc)
    if isinstance(exc, QueueFull):
        return unavailable(text, "queue_full")
    if isinstance(exc, EngineStopped):
        return unavailable(text, "engine_stopping", retry_after=10)
    if isinstance(exc, BackendFailed):
        return unavailable(text, "backend_failed", retry_after=30)
    if isinstance(exc, NothingToDo):  # (a Refused: before it)
        return conflict(text, "nothing_to_do")
    if isinstance(exc, Refused):
        if submitting:
            return HttpError(507, text, "insufficient_storage_error", "too_large")
        return conflict(text, "refused")
    if isinstance(exc, UnknownBackend):
        return not_found(text, "unknown_backend")
    if isinstance(exc, UnknownJob):
        return not_found(text, "unknown_job")
    if isinstance(exc, UnknownGpu):
        return not_found(text, "unknown_gpu")
    if isinstance(exc, NoReport):
        return not_found(text, "no_report")
    if isinstance(exc, JobTimeout):
        return HttpError(504, text, "timeout_error", "wait_timeout")
    if isinstance(exc, InvalidRequest):
        return bad_request(text, param=exc.param)
    if isinstance(exc, VramtuiError):
        return HttpError(500, text, "engine_error")
    return HttpError(500, f"internal error: {type(exc).__name__}: {exc}", "internal_error")
