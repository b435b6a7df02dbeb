"""Running a worker's ``@sleep`` or ``@wake`` hook: sync or async, its answer checked.

The worker loop calls :func:`run_sleep_hook` on its main thread when the server asks it to
sleep or wake.  What a sleep hook may return is ``None`` or a mapping with ``kept_mib`` (what
it says it keeps on the GPU) and ``host_mib`` (what it says it took in host memory); when it
does not say the latter, the host memory the process grew by during the hook (its resident
set, from ``/proc/self/status``) is reported instead.  The server measures the GPU itself: a
worker's word is only a claim it is held to.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

_KEYS = ("kept_mib", "host_mib")


@dataclass(frozen=True, slots=True)
class HookOutcome:
    """How a hook went: ``error`` (None: it succeeded) and what a sleep hook said it keeps."""

    error: str | None = None
    kept_mib: int | None = None
    host_mib: int | None = None


def rss_mib() -> int | None:
    """This process's resident set in MiB (``VmRSS``), None where it cannot be read."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) // 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def run_sleep_hook(hook: Callable[..., Any], args: tuple[Any, ...],
                   loop_of_thread: Callable[[], asyncio.AbstractEventLoop], *,
                   measure_host: bool) -> HookOutcome:
    """Call ``hook(*args)`` (awaiting it on the thread's loop when it is async)."""
    before = rss_mib() if measure_host else None
    try:
        result = hook(*args)
        if inspect.isawaitable(result):
            result = loop_of_thread().run_until_complete(_await(result))
    except Exception as exc:  # noqa: BLE001 - a hook's failure of any kind is reported
        traceback.print_exc()
        return HookOutcome(f"{type(exc).__name__}: {exc}")
    if not measure_host:
        return HookOutcome()
    said = _said(result)
    if isinstance(said, str):
        return HookOutcome(said)
    kept, host = said
    if host is None and before is not None:
        after = rss_mib()
        host = None if after is None else max(0, after - before)
    return HookOutcome(None, kept, host)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _said(result: object) -> tuple[int | None, int | None] | str:
    """(kept_mib, host_mib) from what a sleep hook returned, or why it cannot be read."""
    if result is None:
        return None, None
    if not isinstance(result, Mapping) or not set(result) <= set(_KEYS):
        return (f"@sleep returned {type(result).__name__} {str(result)[:80]!r}: return None "
                "or a mapping with kept_mib and host_mib (MiB)")
    values = []
    for key in _KEYS:
        value = result.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            return f"@sleep returned {key}={value!r}: a whole number of MiB, or None"
        values.append(value)
    return values[0], values[1]
