"""The control socket: the engine's API carried between processes.

- :mod:`.messages` — the wire shapes (hello, requests, replies, pushed events) and errors;
- :mod:`.codec` — JobView / EngineSnapshot / EngineEvent to msgpack-able dicts and back;
- :mod:`.reader` — a frame reader that answers an oversized request instead of hanging up;
- :mod:`.peer` — the SO_PEERCRED check (same user, root, or an allowed group);
- :mod:`.server` — the asyncio server that runs on the engine loop (socket, limits, stats);
- :mod:`.connection` — one client: hello, requests, replies, pushed events, back-pressure;
- :mod:`.methods` — each request as a call of the engine; ``wait`` answered from a callback;
- :mod:`.logtail` — reading a worker's log for ``vramtui logs``.

The client is :class:`supervisor.client.Client`.  Nothing here is imported by this package
itself, so that a client process imports only what it uses.
"""
