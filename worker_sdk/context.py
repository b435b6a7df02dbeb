"""The request context: who asked, with what metadata, progress reports and cancellation.

Inside ``predict``, ``worker_sdk.current()`` returns the :class:`RequestContext` of the request
being served (a context variable, so it also works inside ``async`` predicts).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any


class Cancelled(Exception):
    """Raised by :meth:`RequestContext.check_cancelled` once the request was cancelled."""


ProgressSink = Callable[[int, "float | None", str], None]


# Guards the lazy creation of a context's Event against a concurrent cancel (both are rare;
# creating an Event for every request would cost more than the rest of the context).
_EVENT_LOCK = threading.Lock()


class RequestContext:
    """What a predict function may know and do about the request it serves."""

    __slots__ = (
        "wire_id", "id", "metadata", "deadline", "_cancelled", "_event", "_progress", "_on_cancel"
    )

    def __init__(
        self,
        wire_id: int,
        *,
        request_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        deadline: float | None = None,
        progress_sink: ProgressSink | None = None,
    ) -> None:
        self.wire_id = wire_id
        self.id = request_id if request_id is not None else str(wire_id)
        self.metadata: dict[str, Any] = metadata or {}
        self.deadline = deadline
        self._cancelled = False
        self._event: threading.Event | None = None  # made on the first wait_cancelled()
        self._progress = progress_sink
        self._on_cancel: Callable[[], None] | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def check_cancelled(self) -> None:
        """Raise :class:`Cancelled` if the request was cancelled; otherwise return."""
        if self._cancelled:
            raise Cancelled(f"request {self.id} was cancelled")

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for a cancellation; True once cancelled."""
        if self._cancelled:
            return True
        event = self._event
        if event is None:
            with _EVENT_LOCK:
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
                    if self._cancelled:
                        event.set()
        return event.wait(timeout)

    def progress(self, fraction: float | None = None, message: str = "") -> None:
        """Report progress (0..1, or None when unknown) with a short phase text."""
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        if self._progress is not None:
            self._progress(self.wire_id, fraction, str(message))

    # -- used by the worker loop -------------------------------------------------------------
    def cancel(self) -> None:
        with _EVENT_LOCK:
            self._cancelled = True
            event = self._event
        if event is not None:
            event.set()
        hook = self._on_cancel
        if hook is not None:
            hook()

    def on_cancel(self, hook: Callable[[], None] | None) -> None:
        self._on_cancel = hook
        if hook is not None and self._cancelled:
            hook()


_current: contextvars.ContextVar[RequestContext] = contextvars.ContextVar("worker_sdk_request")


def current() -> RequestContext:
    """The context of the request being served; a RuntimeError outside ``predict``."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("worker_sdk.current() was called outside a predict call") from None


def activate(ctx: RequestContext) -> contextvars.Token[RequestContext]:
    return _current.set(ctx)


def deactivate(token: contextvars.Token[RequestContext]) -> None:
    _current.reset(token)
