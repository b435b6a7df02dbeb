"""The vramtui engine: admits jobs by real peak VRAM, queues, evicts, runs workers.

Embed it with :class:`Supervisor` (``Supervisor.from_config(...).start_in_thread()``); every
face (TUI, CLI, control socket) uses that same facade.  Never imports textual.
"""

from __future__ import annotations

from .engine import EngineConfig
from .errors import (
    BackendFailed,
    EngineStopped,
    JobTimeout,
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

__all__ = [
    "BackendFailed",
    "BackendView",
    "EngineConfig",
    "EngineEvent",
    "EngineRunning",
    "EngineSnapshot",
    "EngineStopped",
    "GpuView",
    "JobState",
    "JobTimeout",
    "JobView",
    "QueueFull",
    "Refused",
    "Subscription",
    "Supervisor",
    "UnknownBackend",
    "UnknownJob",
    "VramtuiError",
]
