"""The engine's loop: tasks it spawns, named timers, the coalesced scheduling step, the stop.

Every event (a submit, a job's end, a worker's change, a sample, a tick) asks for one
scheduling step (:meth:`EngineLoop.schedule`); asks before it runs coalesce into one, taken
on the loop's next turn, and none is taken while nothing waits.  A caller that has nothing
else to do first (a request handler that has just submitted and will wait) may take the
step at once (:meth:`step_now`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class EngineLoop:
    """One engine's asyncio loop, seen from the engine."""

    def __init__(self, step: Callable[[], None], idle: Callable[[], bool],
                 clock: Callable[[], float]) -> None:
        self.started_at = clock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = False
        self._step = step
        self._idle = idle  # nothing waits: a step could neither start nor evict anything
        self._step_handle: asyncio.Handle | None = None
        self._stopped = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def attach(self) -> asyncio.AbstractEventLoop:
        """Run on the running loop (once, as the engine starts)."""
        self.loop = asyncio.get_running_loop()
        return self.loop

    # -- the step ----------------------------------------------------------------------------
    def schedule(self) -> None:
        """A step on the loop's next turn (unless one is due already, or nothing waits)."""
        if self._step_handle is None and self.loop is not None and not self.stopping \
                and not self._idle():
            self._step_handle = self.loop.call_soon(self._take_step)

    @property
    def step_due(self) -> bool:
        return self._step_handle is not None

    def _take_step(self) -> None:
        self._step_handle = None
        if self.stopping or self._idle():  # it may have changed since it was scheduled
            return
        self._step()

    def step_now(self) -> None:
        """Take the step that is due now rather than on the loop's next turn; never raising:
        what goes wrong in a step is the engine's, reported as from the loop."""
        handle = self._step_handle
        if handle is None:
            return
        handle.cancel()
        try:
            self._take_step()
        except Exception as exc:  # noqa: BLE001 - the loop's handler logs it, as it would
            assert self.loop is not None
            self.loop.call_exception_handler({
                "message": "the engine's scheduling step failed", "exception": exc})

    # -- tasks and timers ---------------------------------------------------------------------
    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def every(self, period_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` every ``period_s`` until cancelled; a pass that raises is reported as
        from the loop (its handler logs it) and the next pass runs: one bad pass must not end
        the pings, keep-alive and yield expiry for good."""
        while True:
            await asyncio.sleep(period_s)
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - the loop's handler logs it
                asyncio.get_running_loop().call_exception_handler({
                    "message": f"the engine's periodic {fn.__name__} failed", "exception": exc})

    def set_timer(self, key: str, delay: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` after ``delay`` seconds, replacing any timer of the same ``key``."""
        assert self.loop is not None
        self.cancel_timer(key)

        def fire() -> None:
            self._timers.pop(key, None)
            fn()

        self._timers[key] = self.loop.call_later(max(0.0, delay), fire)

    def cancel_timer(self, key: str) -> None:
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    # -- stopping -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        self.stopping = True
        self._stopped.set()

    async def stopped(self) -> None:
        await self._stopped.wait()
