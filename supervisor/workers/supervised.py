"""What every worker handle shares, whatever protocol its worker speaks: its process group.

:class:`SupervisedProcess` owns the end of a stop (the handle's own ``begin_stop`` asks the
worker to exit its way; then SIGTERM, then SIGKILL of the whole process group), the wait for
the process to be gone, and the pids that belong to the worker (itself, its descendants, and
those seen before that may outlive it on the GPU). A handle sets ``pid``, ``_exited`` and
``_descendants`` and calls nothing here before its process exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal

import psutil

from . import process


class SupervisedProcess:
    """The process side of a worker handle (mixed into each handle class)."""

    pid: int | None
    _exited: asyncio.Event
    _descendants: set[int]

    def begin_stop(self) -> None:
        """Take no more jobs and ask the worker to exit, its own way."""
        raise NotImplementedError

    async def stop(self, grace: float = 10.0) -> None:
        """Ask the worker to go, then SIGTERM, then SIGKILL its process group; returns once
        it exited."""
        if self._exited.is_set():
            return
        self.begin_stop()
        if await self._wait_exit(grace):
            return
        if self.pid is not None:
            process.signal_group(self.pid, signal.SIGTERM)
        if await self._wait_exit(min(grace, 2.0)):
            return
        self.kill()
        await self._wait_exit(5.0)

    def kill(self) -> None:
        """SIGKILL the process group now (an unplanned end: reported as a crash)."""
        if self.pid is not None and not self._exited.is_set():
            process.signal_group(self.pid, signal.SIGKILL)

    async def wait_exited(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to be gone; True once it is."""
        return await self._wait_exit(timeout)

    async def _wait_exit(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited.wait(), timeout)
        return self._exited.is_set()

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def accepts_pid(self, pid: int | None) -> bool:
        """Whether ``pid`` is the worker or one of its descendants (remembered once seen)."""
        if pid is None or self.pid is None:
            return False
        if pid == self.pid or pid in self._descendants:
            return True
        try:
            parents = {p.pid for p in psutil.Process(pid).parents()}
        except psutil.Error:
            return False
        if self.pid in parents:
            self._descendants.add(pid)
            return True
        return False

    def known_descendants(self) -> set[int]:
        """The worker's children seen so far (they may outlive it on the GPU)."""
        return set(self._descendants)

    def pids(self) -> set[int]:
        """The worker's process and its descendants (for per-process GPU memory)."""
        if self.pid is None or self._exited.is_set():
            return set()
        found = {self.pid}
        with contextlib.suppress(psutil.Error):
            found.update(c.pid for c in psutil.Process(self.pid).children(recursive=True))
        return found
