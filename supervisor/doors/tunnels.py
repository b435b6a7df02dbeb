"""A websocket a door holds open to a model server (``/upstream``), counted as use of it.

While a tunnel is open its backend's server is not unloaded by ``keep_alive`` and looks just
used to eviction; each message through it is use too (the backend's ``Usage`` owns what that
means). Room for a job may still evict the server: its process goes, and so do its tunnels.
On the engine loop, as everything that touches the engine is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine import Engine
    from ..engine.runtime import Usage


class Tunnel:
    """One open websocket to ``backend``'s server; :meth:`carried` for each message."""

    def __init__(self, engine: Engine, usage: Usage) -> None:
        self._engine = engine
        self._usage = usage

    def carried(self) -> None:
        self._usage.touched(self._engine.clock())


@contextmanager
def tunnel(engine: Engine, backend: str) -> Iterator[Tunnel | None]:
    """Count a websocket to ``backend``'s server as open while the block runs (None: the
    engine no longer knows the backend; nothing is counted)."""
    rt = engine.backends.get(backend)
    if rt is None:
        yield None
        return
    usage = rt.usage
    usage.tunnel_opened(engine.clock())
    try:
        yield Tunnel(engine, usage)
    finally:
        usage.tunnel_closed(engine.clock())
