"""The shapes of control-socket messages (framing and codec: :mod:`worker_sdk.protocol`).

A connection opens with a hello: the client sends REGISTRATION ``{identifier:
"vramtui-client", metadata: {protocol: "1", pid, version}}``; the server answers
ACKNOWLEDGEMENT ``{identifier: "vramtui-engine", protocol, version, pid, mode, socket,
max_request}`` or ERROR (wrong version, access denied, too many connections) and hangs up.

Then requests and replies, matched by frame id, any number in flight:

- REQUEST  ``{m: method, a: {keyword arguments}}`` (the methods, their arguments and results:
  :data:`supervisor.apispec.METHODS`, the one list)
- RESPONSE ``{r: result}``
- ERROR    ``{type: exception class name, error: message, attrs: {...}}``

and, after a ``subscribe`` request, pushed EVENT frames ``{event: NOTIFY, sub: id, e: event}``
(``e`` a dict of :class:`supervisor.events.EngineEvent`), ``{event: NOTIFY, sub, lagged: n,
snapshot}`` when the subscriber fell behind and n events were dropped, and
``{event: SHUTDOWN, sub}`` when the engine closed the stream.
"""

from __future__ import annotations

import os
from typing import Any

PROTOCOL = "1"
CLIENT_ID = "vramtui-client"
SERVER_ID = "vramtui-engine"

DEFAULT_MAX_REQUEST = 64 * 1024 * 1024  # bytes of one request frame (body)
MAX_REPLY = 1024 * 1024 * 1024  # what a client accepts in one reply frame
DEFAULT_MAX_CONNECTIONS = 128
SNAPSHOT_JOB_DATA_LIMIT = 64 * 1024  # job data/chunks larger than this stay out of snapshots



def hello(version: str) -> dict[str, Any]:
    """The client's REGISTRATION payload."""
    return {"identifier": CLIENT_ID, "type": "control",
            "metadata": {"protocol": PROTOCOL, "pid": str(os.getpid()), "version": version}}


def __getattr__(name: str) -> Any:
    """``METHODS`` (the wire's method names) lives in :mod:`supervisor.apispec` now."""
    if name == "METHODS":
        from ..apispec import WIRE_METHODS

        return WIRE_METHODS
    raise AttributeError(name)
