"""The decorators a model author uses, and the registry of what they registered.

``initialize`` (optionally with an order), ``predict`` (exactly one), ``hardware_health``,
``unload``, and ``sleep`` with ``wake`` (at most one each, and both or neither) record functions
in a module-level :class:`Registry`; the worker loop reads it after the author's script has
been imported.  A worker with ``sleep`` and ``wake`` says so in its handshake (the capability
``sleep``): the engine may then put it to sleep (its GPU memory given back, its process alive)
instead of stopping it, and wake it for its next job.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

F = TypeVar("F", bound=Callable[..., Any])


class WorkerScriptError(Exception):
    """The worker script registered something the SDK cannot run (none or two predicts, …)."""


@dataclass
class Registry:
    initializers: list[tuple[int, int, Callable[[], Any]]] = field(default_factory=list)
    predict: Callable[..., Any] | None = None
    predict_takes_context: bool = False
    hardware_health: Callable[[], Any] | None = None
    unload: list[Callable[[], Any]] = field(default_factory=list)
    sleep: Callable[..., Any] | None = None  # sleep() or sleep(level)
    sleep_takes_level: bool = False
    wake: Callable[[], Any] | None = None

    @property
    def can_sleep(self) -> bool:
        """Both ``@sleep`` and ``@wake`` were registered."""
        return self.sleep is not None and self.wake is not None

    def check_sleep(self, script: str) -> None:
        """``@sleep`` and ``@wake`` come together (one alone could never be undone or used)."""
        if (self.sleep is None) != (self.wake is None):
            have, lack = ("sleep", "wake") if self.sleep is not None else ("wake", "sleep")
            raise WorkerScriptError(
                f"{script} registers @worker_sdk.{have} but no @worker_sdk.{lack}: a worker "
                "that can sleep must be able to wake (register both, or neither)")

    def ordered_initializers(self) -> list[Callable[[], Any]]:
        """Ascending order; registration order among equal orders."""
        return [fn for _order, _seq, fn in sorted(self.initializers, key=lambda t: (t[0], t[1]))]

    def require_predict(self, script: str) -> Callable[..., Any]:
        if self.predict is None:
            raise WorkerScriptError(
                f"{script} registers no @worker_sdk.predict function; decorate exactly one"
            )
        return self.predict

    def clear(self) -> None:
        self.initializers.clear()
        self.predict = None
        self.predict_takes_context = False
        self.hardware_health = None
        self.unload.clear()
        self.sleep = None
        self.sleep_takes_level = False
        self.wake = None


REGISTRY = Registry()


def _name(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    where = f" ({code.co_filename}:{code.co_firstlineno})" if code else ""
    return f"{getattr(fn, '__qualname__', repr(fn))}{where}"


def takes_context(fn: Callable[..., Any]) -> bool:
    """Whether ``predict`` takes the request context as a second positional argument."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


@overload
def initialize(func_or_order: F) -> F: ...
@overload
def initialize(func_or_order: int | None = None) -> Callable[[F], F]: ...


def initialize(func_or_order: Any = None) -> Any:
    """Register a start-up function; ``@initialize(order)`` runs in ascending order."""

    def register(fn: F, order: int) -> F:
        REGISTRY.initializers.append((order, len(REGISTRY.initializers), fn))
        return fn

    if callable(func_or_order):
        return register(func_or_order, 0)
    if func_or_order is not None and not isinstance(func_or_order, int):
        raise TypeError(f"@initialize(order) takes an int order, got {func_or_order!r}")
    order = func_or_order or 0
    return lambda fn: register(fn, order)


def predict(fn: F) -> F:
    """Register THE prediction function: ``predict(payload: bytes[, context])``."""
    if REGISTRY.predict is not None:
        raise WorkerScriptError(
            f"two @worker_sdk.predict functions: {_name(REGISTRY.predict)} and {_name(fn)}; "
            "a worker has exactly one"
        )
    REGISTRY.predict = fn
    REGISTRY.predict_takes_context = takes_context(fn)
    return fn


def hardware_health(fn: F) -> F:
    """Register the hardware health check (a function returning a dict)."""
    if REGISTRY.hardware_health is not None:
        raise WorkerScriptError(
            f"two @worker_sdk.hardware_health functions: {_name(REGISTRY.hardware_health)} "
            f"and {_name(fn)}"
        )
    REGISTRY.hardware_health = fn
    return fn


def unload(fn: F) -> F:
    """Register a function called once before a graceful exit, to free memory."""
    REGISTRY.unload.append(fn)
    return fn


def _takes_one_argument(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return bool(positional) or any(p.kind is p.VAR_POSITIONAL for p in params)


def sleep(fn: F) -> F:
    """Register THE sleep hook: give the GPU memory back while the process stays alive
    (``model.to("cpu")``, vLLM's ``llm.sleep(level)``, …).  ``sleep()`` or ``sleep(level)``
    (1: keep the weights in host memory; 2: drop them), sync or async; it may return
    ``{"kept_mib": n, "host_mib": n}`` (what it keeps on the GPU and took in host memory) or
    None.  Needs a ``@wake`` too."""
    if REGISTRY.sleep is not None:
        raise WorkerScriptError(
            f"two @worker_sdk.sleep functions: {_name(REGISTRY.sleep)} and {_name(fn)}")
    REGISTRY.sleep = fn
    REGISTRY.sleep_takes_level = _takes_one_argument(fn)
    return fn


def wake(fn: F) -> F:
    """Register THE wake hook: take the memory again after ``@sleep`` (sync or async)."""
    if REGISTRY.wake is not None:
        raise WorkerScriptError(
            f"two @worker_sdk.wake functions: {_name(REGISTRY.wake)} and {_name(fn)}")
    REGISTRY.wake = fn
    return fn
