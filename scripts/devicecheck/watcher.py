"""A thread that reads one GPU's used memory at a fixed rate and remembers the worst instant.

It keeps the count, the highest reading, every instant used memory was above the total (the
first 100), and a timeline thinned to at most ``MAX_TIMELINE`` points, so a long run's memory
stays bounded.  The achieved rate is part of the answer: a check that read too rarely cannot
vouch for "never above the total".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

MAX_TIMELINE = 2000
MAX_OVER = 100


class Watcher(threading.Thread):
    def __init__(self, open_reader: Callable[[], Any], hz: float = 50.0) -> None:
        super().__init__(name="devicecheck-watcher", daemon=True)
        self._open = open_reader
        self.period = 1.0 / hz
        self._stop_event = threading.Event()
        self.readings = 0
        self.unreadable = 0
        self.max_used: int | None = None
        self.max_at: float | None = None
        self.total: int | None = None
        self.over: list[tuple[float, int, int]] = []
        self.over_count = 0
        self.timeline: list[tuple[float, int]] = []
        self._stride = 1
        self.started_at = 0.0
        self.stopped_at = 0.0
        self.error: str | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            reader = self._open()
        except Exception as exc:  # noqa: BLE001 - reported in the row
            self.error = f"cannot open the reader: {exc}"
            self.ready.set()
            return
        self.started_at = time.monotonic()
        self.ready.set()
        try:
            tick = self.started_at
            while not self._stop_event.is_set():
                self._read(reader)
                tick += self.period
                delay = tick - time.monotonic()
                if delay < 0:
                    tick = time.monotonic()  # late: do not try to catch up in a burst
                    delay = 0
                if self._stop_event.wait(delay):
                    break
        except Exception as exc:  # noqa: BLE001 - reported in the row
            self.error = f"reading failed: {exc!r}"
        finally:
            self.stopped_at = time.monotonic()
            reader.close()

    def _read(self, reader: Any) -> None:
        used, total = reader.device()
        t = time.monotonic() - self.started_at
        self.readings += 1
        self.total = total
        if used is None:
            self.unreadable += 1
            return
        if self.max_used is None or used > self.max_used:
            self.max_used, self.max_at = used, t
        if used > total:
            self.over_count += 1
            if len(self.over) < MAX_OVER:
                self.over.append((round(t, 3), used, total))
        if self.readings % self._stride == 0:
            self.timeline.append((round(t, 3), used))
            if len(self.timeline) >= MAX_TIMELINE:
                self.timeline = self.timeline[::2]
                self._stride *= 2

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)

    @property
    def seconds(self) -> float:
        end = self.stopped_at or time.monotonic()
        return max(0.0, end - self.started_at) if self.started_at else 0.0

    @property
    def hz(self) -> float:
        return self.readings / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {"readings": self.readings, "unreadable": self.unreadable,
                "seconds": round(self.seconds, 3), "hz": round(self.hz, 1),
                "max_used_mib": self.max_used, "max_at_s": self.max_at,
                "total_mib": self.total, "over_count": self.over_count, "over": self.over,
                "error": self.error, "timeline": self.timeline}
