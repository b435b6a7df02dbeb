"""Errors a Dynamo caller can act on: how our endpoints raise them, and how any client reads them.

Dynamo 1.6.1 carries no structured error to the caller: whatever a handler raises reaches the
client as an exception whose text is ``"<Class>: <detail>"``.  ``Class`` is Dynamo's error
class (``Unavailable``, ``Internal``, ``InvalidRequest``, ...); for an ``HttpError(code, msg)``
the detail is the JSON ``{"message": msg, "code": code}``.  Two facts shape what we raise:

- an ``HttpError`` keeps its code in that JSON, but ``507`` is classed ``Internal`` and the
  client's router goes on sending to the same instance;
- a ``WorkerUnavailable`` (``dynamo.llm.exceptions``) is classed ``Unavailable``, its text is
  passed through verbatim, and the client's router takes that instance out of its rotation for
  about 5 s, so the caller's next ``generate()`` / ``random()`` / ``round_robin()`` goes to
  another instance (``direct()`` still reaches it).

So "not here, try another instance" (the engine bridge's 503 and 507) is raised as a
``WorkerUnavailable`` whose text is one JSON object with the keys Dynamo's own ``HttpError``
payload has, and a retry hint::

    Unavailable: {"message":"queue full: 1 jobs waiting; ...","code":503,"reason":"queue_full",
                  "retry":"another_instance","retry_after_s":1.0,"instance_id":7157...}

``retry`` is ``"another_instance"``; ``retry_after_s``, when present, says this instance may
take the request again after that long (absent: do not send it here again, e.g. a 507: too large
for every GPU of this box).  ``instance_id`` is the refusing instance, to leave out.
:func:`error_info` reads any Dynamo client error (ours, an ``HttpError``'s, Dynamo's own "No
workers available"); :class:`worker_sdk.dynamo.client.Client` raises :class:`RequestError`
with it, and ``call(..., retries=N)`` retries on the other instances.

Nothing here imports Dynamo; :func:`unavailable` takes the names :func:`import_dynamo` gives.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

RETRY_ANOTHER_INSTANCE = "another_instance"

_TEXT = re.compile(r"^(?P<cls>[A-Za-z][A-Za-z0-9_.]*): (?P<detail>.*)$", re.DOTALL)
_NO_WORKERS = "No workers available for endpoint"
_CACHE: dict[int, type[Exception]] = {}


@dataclass(frozen=True)
class ErrorInfo:
    """What a Dynamo client error says, read back from its text."""

    error_class: str  # Dynamo's class: "Unavailable", "Internal", "InvalidRequest", ...
    message: str
    code: int | None = None  # the HTTP-style status, when the endpoint gave one
    reason: str | None = None  # ours: "queue_full", "too_large", "engine_stopping", ...
    retry: str | None = None  # ours: "another_instance"
    retry_after_s: float | None = None  # ours: this instance may take it after this long
    instance_id: int | None = None  # ours: the instance that refused
    extra: dict[str, Any] | None = None

    @property
    def try_another_instance(self) -> bool:
        """Whether another instance may serve what this one refused."""
        return self.retry == RETRY_ANOTHER_INSTANCE


def error_info(error: BaseException | str) -> ErrorInfo | None:
    """Read a Dynamo client error (its text); None when it is not one."""
    text = str(error)
    match = _TEXT.match(text)
    if match is None:
        return None
    cls, detail = match["cls"], match["detail"].strip()
    if detail.startswith(_NO_WORKERS):  # the client's own router: every instance is out
        return ErrorInfo(cls, detail, code=503, reason="no_instance")
    try:
        body = json.loads(detail)
    except ValueError:
        return ErrorInfo(cls, detail)
    if not isinstance(body, dict):
        return ErrorInfo(cls, detail)
    code = body.get("code")
    after = body.get("retry_after_s")
    instance = body.get("instance_id")
    known = {"message", "code", "reason", "retry", "retry_after_s", "instance_id"}
    return ErrorInfo(
        cls,
        str(body.get("message", detail)),
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        reason=body.get("reason") if isinstance(body.get("reason"), str) else None,
        retry=body.get("retry") if isinstance(body.get("retry"), str) else None,
        retry_after_s=float(after) if isinstance(after, int | float) else None,
        instance_id=instance if isinstance(instance, int) else None,
        extra={k: v for k, v in body.items() if k not in known} or None,
    )


def unavailable(dyn: SimpleNamespace, code: int, message: str, *, reason: str,
                instance_id: int | None = None, retry_after_s: float | None = None,
                **extra: Any) -> Exception:
    """The exception a handler raises for "not here: try another instance" (see above)."""
    cls = _CACHE.get(id(dyn.WorkerUnavailable))
    if cls is None:
        cls = _CACHE[id(dyn.WorkerUnavailable)] = _unavailable_class(dyn.WorkerUnavailable)
    body: dict[str, Any] = {"message": message, "code": code, "reason": reason,
                            "retry": RETRY_ANOTHER_INSTANCE}
    if retry_after_s is not None:
        body["retry_after_s"] = retry_after_s
    if instance_id is not None:
        body["instance_id"] = instance_id
    body.update(extra)
    return cls(code, message, body)


def _unavailable_class(base: type[Exception]) -> type[Exception]:
    class Unavailable(base):  # type: ignore[misc, valid-type]
        """Not served here; the text is the JSON object Dynamo hands to the caller."""

        def __init__(self, code: int, message: str, body: dict[str, Any]) -> None:
            self.code = code
            self.message = message
            self.body = body
            super().__init__(json.dumps(body, separators=(",", ":"), ensure_ascii=False))

    Unavailable.__qualname__ = Unavailable.__name__ = "EngineUnavailable"
    return Unavailable


class RequestError(Exception):
    """A Dynamo request failed; ``info`` says how (its text is the client's, unchanged)."""

    def __init__(self, text: str, info: ErrorInfo) -> None:
        super().__init__(text)
        self.info = info

    @property
    def code(self) -> int | None:
        return self.info.code
