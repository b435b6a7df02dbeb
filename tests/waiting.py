"""The one way a test waits for a condition: poll it, with a deadline, and say what it waited
for when the deadline passes.  Never ``sleep`` for a condition that can be polled.

``wait_until`` blocks the calling thread; ``wait_until_async`` is the same on an event loop
(``pause`` is what to await between polls: ``asyncio.sleep`` by default, a Textual pilot's
``pause`` in an app's test, so that the app runs meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
INTERVAL_S = 0.01


def _poll(predicate: Callable[[], T], end: float, deadline: float, what: str) -> T | None:
    """``predicate()``'s value when truthy; None to poll again; AssertionError past ``end``."""
    value = predicate()
    if value:
        return value
    if time.monotonic() > end:
        raise AssertionError(f"timed out after {deadline:g} s waiting for {what}")
    return None


def wait_until(predicate: Callable[[], T], deadline: float = 15.0,
               what: str = "condition") -> T:
    """``predicate()``'s first truthy value, polled for at most ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while (value := _poll(predicate, end, deadline, what)) is None:
        time.sleep(INTERVAL_S)
    return value


async def wait_until_async(predicate: Callable[[], T], deadline: float = 15.0,
                           what: str = "condition",
                           pause: Callable[[], Awaitable[object]] | None = None) -> T:
    """:func:`wait_until`, awaiting ``pause()`` between polls."""
    end = time.monotonic() + deadline
    while (value := _poll(predicate, end, deadline, what)) is None:
        await (pause() if pause is not None else asyncio.sleep(INTERVAL_S))
    return value
