"""A real worker (worker_sdk) against a hostile server: junk on its control and data sockets.

Frames are written by hand with msgpack.  The worker must refuse each one, answer what it
can (an error for a junk request, naming it), keep serving, and give up a connection that
sends nothing but junk — then reconnect, without initialising again.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import msgpack
import pytest
from conftest import ServerFactory, SpawnWorker

from worker_sdk.conversation import MAX_REFUSED_IN_A_ROW

pytestmark = pytest.mark.timeout(60)
HEADER = struct.Struct(">QBBH")


def frame(msg_type: int, data_type: int, msg_id: int, payload: Any) -> bytes:
    body = msgpack.packb({"id": msg_id, "message_type": msg_type, "data_type": data_type,
                          "timestamp": None, "payload": payload}, use_bin_type=True)
    return HEADER.pack(len(body), msg_type, data_type, 0) + body


JUNK_CONTROL = [
    frame(4, 0, 900, {"event": 2, "request": "not an id"}),  # CANCEL of junk
    frame(4, 0, 901, {"event": 2, "request": -5}),
    frame(4, 0, 902, {"event": 99}),  # unknown event code
    frame(4, 0, 903, {"event": 2**64 - 1}),
    frame(4, 0, 904, {"no": "event"} | {"event": "3"}),  # a SHUTDOWN spelled as a str
    frame(3, 0, 905, {"status": "ready"}),  # a RESPONSE to a worker
    frame(6, 0, 906, {"event": 0}),  # a PONG nobody asked for
    frame(7, 0, 907, b"DATA on the control socket"),
    frame(1, 0, 908, {"identifier": "w", "vramtui-features": ""}),  # a second ACK: noise
]


def test_junk_on_the_control_socket_is_refused_and_the_worker_serves_on(
        wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    server = wire_server()
    proc = spawn_worker("full.py", server, "target")
    link = server.wait_worker("target")
    assert link.control is not None
    for junk in JUNK_CONTROL:
        link.control.send_raw(junk)
    assert link.status() == {"status": "ready"}  # after every junk frame: control in order
    assert link.ping().id > 0
    assert link.request(b"still serving").data == b"still serving"
    # The second ACK changed nothing: the extensions are still in use (an explicit stream).
    wire_id = link.send_request(json.dumps({"op": "stream", "n": 1}).encode())
    frames = [link.read(wire_id) for _ in range(2)]
    assert [f.data_type for f in frames] == [2, 2] and frames[-1].payload is None
    assert proc.poll() is None
    assert "unknown event code" in proc.output()


@pytest.mark.parametrize(
    ("envelope", "needle"),
    [
        ({"payload": b"x", "deadline": math.nan}, "deadline"),
        ({"payload": b"x", "deadline": "tomorrow"}, "deadline"),
        ({"payload": b"x", "metadata": {7: "int key"}}, "metadata"),
        ({"payload": b"x", "request_id": "r" * 5000}, "request_id"),
    ],
)
def test_a_junk_request_envelope_gets_an_error_for_it_alone(
        wire_server: ServerFactory, spawn_worker: SpawnWorker, envelope: dict[str, Any],
        needle: str) -> None:
    server = wire_server()
    spawn_worker("full.py", server, "target")
    link = server.wait_worker("target")
    link.send_raw(frame(7, 3, 4242, envelope))
    reply = link.collect(4242)
    assert reply.kind == "error" and reply.status_code == 400
    assert reply.error is not None and needle in reply.error["error"]
    assert link.request(b"next").data == b"next"


def test_a_server_that_sends_only_junk_is_given_up_and_the_worker_reconnects(
        wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    server = wire_server()
    proc = spawn_worker("full.py", server, "target")
    link = server.wait_worker("target")
    assert link.control is not None
    link.control.send_raw(frame(4, 0, 1, {"event": 99}) * (MAX_REFUSED_IN_A_ROW + 1))
    assert link.closed.wait(10)  # the worker closed that session ...
    again = server.wait_worker("target")  # ... and came back on a new one
    assert again is not link
    assert again.request(b"back").data == b"back"
    assert proc.marker("init") == "init\n"  # initialised once, not on the reconnect
    assert "giving up on this connection" in proc.output()
