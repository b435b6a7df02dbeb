"""The vramtui engine: admits jobs by real peak VRAM, queues, evicts, runs workers.

Embed it with :class:`Supervisor` (``Supervisor.from_config(...).start_in_thread()``); every
face (TUI, CLI, control socket) uses that same facade.  Never imports textual.

The names below are imported on first use (PEP 562), so that a client process — ``vramtui
status`` — that needs only ``supervisor.client`` does not pay for importing the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "EngineConfig": "engine",
    "BackendFailed": "errors",
    "EngineStopped": "errors",
    "InvalidRequest": "errors",
    "JobTimeout": "errors",
    "NothingToDo": "errors",
    "QueueFull": "errors",
    "Refused": "errors",
    "UnknownBackend": "errors",
    "UnknownJob": "errors",
    "VramtuiError": "errors",
    "EngineEvent": "events",
    "Subscription": "events",
    "EngineRunning": "facade",
    "Supervisor": "facade",
    "JobState": "jobs",
    "JobView": "jobs",
    "BackendView": "snapshot",
    "EngineSnapshot": "snapshot",
    "GpuView": "snapshot",
}

__all__ = [
    "BackendFailed",
    "BackendView",
    "EngineConfig",
    "EngineEvent",
    "EngineRunning",
    "EngineSnapshot",
    "EngineStopped",
    "GpuView",
    "InvalidRequest",
    "JobState",
    "JobTimeout",
    "JobView",
    "NothingToDo",
    "QueueFull",
    "Refused",
    "Subscription",
    "Supervisor",
    "UnknownBackend",
    "UnknownJob",
    "VramtuiError",
]

if TYPE_CHECKING:
    from .engine import EngineConfig
    from .errors import (
        BackendFailed,
        EngineStopped,
        InvalidRequest,
        JobTimeout,
        NothingToDo,
        QueueFull,
        Refused,
        UnknownBackend,
        UnknownJob,
        VramtuiError,
    )
    from .events import EngineEvent, Subscription
    from .facade import EngineRunning, Supervisor
    from .jobs import JobState, JobView
    from .snapshot import BackendView, EngineSnapshot, GpuView


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'supervisor' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
