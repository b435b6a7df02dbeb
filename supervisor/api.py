"""`EngineAPI`: the one interface every face uses, whether the engine is embedded or remote.

:class:`supervisor.Supervisor` (in-process) and :class:`supervisor.client.Client` (over the
control socket) both implement it, so the TUI and the CLI never know which one they hold.
Each method's arguments, checks and result are declared once, in :mod:`supervisor.apispec`;
``tests/test_api_spec.py`` keeps these signatures equal to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .events import EngineEvent, Subscription
from .jobs import JobView
from .results import (
    CancelResult,
    DescriptorInfo,
    JobRequest,
    LogChunk,
    ReloadResult,
    ReportFile,
)
from .snapshot import EngineSnapshot


@runtime_checkable
class EngineAPI(Protocol):
    def submit(self, backend: str, payload: bytes = b"", *, priority: int | None = None,
               timeout: float | None = None, metadata: dict[str, Any] | None = None,
               stream: bool = False) -> str: ...

    def wait(self, job_id: str, timeout: float | None = None) -> JobView: ...

    def job(self, job_id: str) -> JobView: ...

    def job_request(self, job_id: str, *, limit: int = 65536) -> JobRequest: ...

    def cancel(self, job_id: str) -> JobView: ...

    def cancel_many(self, job_ids: Sequence[str]) -> list[CancelResult]: ...

    def retry(self, job_id: str) -> str: ...

    def set_priority(self, job_id: str, priority: int) -> JobView: ...

    def evict(self, backend: str) -> None: ...

    def respawn(self, backend: str) -> None: ...

    def preload(self, backend: str) -> None: ...

    def kill(self, backend: str) -> None: ...

    def zero(self) -> list[str]: ...

    def drain(self, gpu: int, on: bool = True) -> tuple[int, ...]: ...

    def reload(self) -> ReloadResult: ...

    def descriptor(self, backend: str) -> DescriptorInfo: ...

    def calibration_report(self, backend: str, *, name: str | None = None) -> ReportFile: ...

    def calibrate(self, backend: str, *, repeats: int = 3, request: bytes | None = None,
                  settle_s: float = 1.0) -> str: ...

    def snapshot(self, *, light: bool = False) -> EngineSnapshot: ...

    def subscribe(self, *, kinds: Sequence[str] | None = None, maxsize: int = 1000,
                  callback: Callable[[EngineEvent], Any] | None = None) -> Subscription: ...

    def logs(self, backend: str, *, lines: int = 50, offset: int | None = None) -> LogChunk: ...

    def stop(self, timeout: float | None = None) -> None: ...
