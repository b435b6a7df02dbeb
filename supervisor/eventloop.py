"""The engine's event loop: uvloop's where it is installed, else asyncio's own.

Everything the engine does runs on one loop, and a forwarded request crosses it several
times before its first token reaches the client (its bytes in, the request out to the
server, the answer back, the first chunk out): uvloop's turns, socket reads and writes cost
a fraction of asyncio's (measured with ``bench/model_server.py``: about 0.3 ms less to the
first streamed chunk). The engine needs nothing of a loop but asyncio's API; its protocols
take any loop's transports. ``VRAMTUI_LOOP=asyncio`` keeps asyncio's loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory(environ: dict[str, str] | None = None
                 ) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's ``new_event_loop`` when it is installed and not refused; None: asyncio's."""
    env = os.environ if environ is None else environ
    if env.get("VRAMTUI_LOOP", "").strip().lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the engine's loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
