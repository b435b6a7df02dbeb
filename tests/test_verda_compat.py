"""Wire compatibility with verda-io 0.4.4, both ways.

- The unmodified verda-io worker (``python -m verda_io``), served by our WireServer, gets the
  same answers as our worker running the same functions: bytes, Response, errors, streams.
- Our worker facing a server that advertises no extensions behaves like a plain verda-io
  worker: busy/ready status per request, DATA/DEFAULT stream chunks ended by an empty bin,
  ERROR payloads without status_code, no progress events.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Gate, ServerFactory, SpawnWorker

from worker_sdk.events import Event, Status
from worker_sdk.protocol import EXTENSIONS, DataType, MessageType
from worker_sdk.testing import Reply, WorkerLink

pytestmark = pytest.mark.timeout(60)

CASES: list[tuple[str, bytes, bool]] = [
    ("bytes", b"\x00\x01 plain bytes \xfe\xff", False),
    ("empty", b"", False),
    ("response", json.dumps({"op": "response", "data": "img", "status": 202,
                             "headers": {"Content-Type": "image/png"}}).encode(), False),
    ("response-defaults", json.dumps({"op": "response", "data": ""}).encode(), False),
    ("error", json.dumps({"op": "error", "message": "prompt too long: 9000 > 77"}).encode(),
     False),
    ("bad-return", json.dumps({"op": "bad_return"}).encode(), False),
    ("stream", json.dumps({"op": "stream", "n": 3}).encode(), True),
]


def comparable(reply: Reply) -> tuple[Any, ...]:
    """The Reply fields a server acts on (an ERROR's status_code is our extension)."""
    error = None
    if reply.error is not None:
        error = (reply.error["error"], reply.error["type"])
    return (reply.kind, reply.data, reply.headers, reply.status_code, reply.chunks, error)


def answers(link: WorkerLink) -> dict[str, tuple[Any, ...]]:
    return {name: comparable(link.request(payload, stream=stream))
            for name, payload, stream in CASES}


def test_verda_worker_answers_like_ours(
    wire_server: ServerFactory, spawn_worker: SpawnWorker
) -> None:
    server = wire_server()
    spawn_worker("compat_verda.py", server, "verda", module="verda_io")
    spawn_worker("compat_ours.py", server, "ours")
    plain_server = wire_server(features=frozenset())
    spawn_worker("compat_ours.py", plain_server, "ours-plain")
    verda = server.wait_worker("verda")
    ours = server.wait_worker("ours")
    ours_plain = plain_server.wait_worker("ours-plain")

    assert verda.worker_features == frozenset() and verda.features == frozenset()
    assert ours.features == server.features and ours_plain.features == frozenset()

    expected = answers(verda)
    assert expected["error"][5] == ("ValueError: prompt too long: 9000 > 77", "prediction_error")
    assert expected["bad-return"][5][0].startswith("TypeError: predict() must return bytes")
    assert expected["response"][:4] == ("envelope", b"img", {"Content-Type": "image/png"}, 202)
    assert expected["stream"][4] == [b"part 0", b"part 1", b"part 2"]

    got, got_plain = answers(ours), answers(ours_plain)
    for name, _payload, _stream in CASES:
        if name == "bad-return":  # our message adds the SDK's own Response type; same kind
            assert got[name][5][0].startswith("TypeError: predict() must return bytes")
            assert got_plain[name][5][0].startswith("TypeError: predict() must return bytes")
            continue
        assert got[name] == expected[name], name
        assert got_plain[name] == expected[name], name

    # Control replies match too.
    for link in (verda, ours, ours_plain):
        assert link.health() == {"status": "not enabled"}
        assert link.status() in ({"status": "ready"}, {"status": "busy"})
        pong = link.ping()
        assert (pong.type, pong.payload) == (MessageType.PONG, {"event": 0})
        data_pong = link.ping_data()
        assert (data_pong.type, data_pong.payload) == (MessageType.PONG, {"event": 0})


def until_ready(link: WorkerLink) -> list[Event]:
    """Consume control events up to and including the next "ready" status event."""
    seen: list[Event] = []

    def match(e: Event) -> bool:
        seen.append(e)
        return isinstance(e, Status) and e.status == "ready"

    link.wait_event(match)
    return seen


def kinds(events: list[Event]) -> list[Any]:
    return [e.status if isinstance(e, Status) else type(e).__name__ for e in events]


def test_our_worker_falls_back_to_plain_verda(
    wire_server: ServerFactory, spawn_worker: SpawnWorker, gate: Callable[[str], Gate]
) -> None:
    server = wire_server(features=frozenset())
    spawn_worker("full.py", server, "plain")
    link = server.wait_worker("plain")
    assert link.worker_features == EXTENSIONS  # it offered them ...
    assert link.features == frozenset()  # ... but the server did not
    assert kinds(until_ready(link)) == ["initializing", "ready"]

    # Plain bytes: a busy and a ready status event around the request.
    assert link.request(b"one").data == b"one"
    assert kinds(until_ready(link)) == ["busy", "ready"]

    # A stream: DATA/DEFAULT chunks ended by an empty bin; no progress events.
    wire_id = link.send_request(json.dumps({"op": "stream", "n": 3}).encode(), stream=True)
    frames = [link.read(wire_id) for _ in range(4)]
    assert [(f.type, f.data_type) for f in frames] == [(MessageType.DATA, DataType.DEFAULT)] * 4
    assert [f.payload for f in frames] == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n", b""]
    assert kinds(until_ready(link)) == ["busy", "ready"]  # no NOTIFY in between

    # An error: verda's plain payload, no status_code.
    wire_id = link.send_request(json.dumps({"op": "error", "message": "nope"}).encode())
    err = link.read(wire_id)
    assert (err.type, err.data_type) == (MessageType.ERROR, DataType.DEFAULT)
    assert err.payload == {"error": "ValueError: nope", "type": "prediction_error"}
    assert kinds(until_ready(link)) == ["busy", "ready"]

    # No request envelope: the context has the wire id and no metadata.
    ctx = json.loads(link.request(json.dumps({"op": "context"}).encode()).data)
    assert ctx["metadata"] == {} and ctx["id"] == str(ctx["wire_id"])
    assert kinds(until_ready(link)) == ["busy", "ready"]

    # CANCEL is not negotiated: ignored, like verda-io (a queued request still runs).
    g = gate("plain")
    blocker = link.send_request(json.dumps({"op": "block", "gate": str(g.path)}).encode())
    link.wait_status("busy")  # the worker is inside the blocker
    queued = link.send_request(b"not cancelled")
    link.cancel(queued)
    assert link.status() == {"status": "busy"}
    g.release()
    assert link.collect(blocker).data == b"released"
    assert link.collect(queued).data == b"not cancelled"
