"""The ``sleep`` capability of the worker protocol: the conversation (sans I/O) and real workers.

A worker with ``@worker_sdk.sleep`` and ``@worker_sdk.wake`` offers ``sleep`` in its
registration; a server that uses it acknowledges it; only then do sleep and wake requests
travel (on the data socket, answered there).  Workers without the hooks, plain verda-io
workers and servers that do not offer it are unchanged.  The process tests check the memory a
worker gives back on the simulated device's ledger (its own per-process file), not in what
the worker says.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import ServerFactory, SpawnWorker

from worker_sdk.conversation import (
    Channel,
    LocalProtocolError,
    ServerConversation,
    WorkerConversation,
)
from worker_sdk.events import (
    Registration,
    Request,
    SleepReply,
    SleepRequest,
    WakeReply,
    WakeRequest,
)
from worker_sdk.protocol import CAPABILITIES, EXTENSIONS, HEADER, KNOWN_FEATURES, ProtocolError
from worker_sdk.worker import ExitCode

DATA = Channel.DATA
pytestmark = pytest.mark.timeout(60)


def frame(msg_type: int, dtype: int, msg_id: int, payload: Any) -> bytes:
    body = msgpack.packb({"id": msg_id, "message_type": msg_type, "data_type": dtype,
                          "timestamp": None, "payload": payload}, use_bin_type=True)
    return HEADER.pack(len(body), msg_type, dtype, 0) + body


def pair(worker_offers: frozenset[str], server_offers: frozenset[str]
         ) -> tuple[WorkerConversation, ServerConversation]:
    """A worker's and a server's data conversation after the handshake, bytes carried between
    them by hand."""
    worker = WorkerConversation(DATA, offered=worker_offers)
    server = ServerConversation(DATA, offered=server_offers)
    server.receive_data(b"".join(worker.send(worker.registration("w"))))
    assert isinstance(server.next_event(), Registration)
    worker.receive_data(b"".join(server.acknowledge()))
    worker.next_event()
    return worker, server


def carry(source: Any, frames: list[bytes | memoryview], dest: Any) -> Any:
    dest.receive_data(b"".join(bytes(f) for f in frames))
    return dest.next_event()


def test_sleep_and_wake_travel_only_when_both_ends_offered_them() -> None:
    worker, server = pair(EXTENSIONS | CAPABILITIES, KNOWN_FEATURES)
    assert "sleep" in worker.features and "sleep" in server.features
    asked = carry(server, server.send(SleepRequest(5, 2)), worker)
    assert asked == SleepRequest(5, 2)
    reply = carry(worker, worker.send(SleepReply(5, "asleep", None, 300, 8000)), server)
    assert reply == SleepReply(5, "asleep", None, 300, 8000)
    assert carry(server, server.send(WakeRequest(6)), worker) == WakeRequest(6)
    assert carry(worker, worker.send(WakeReply(6, "awake")), server) == WakeReply(6, "awake")
    # requests still go as before, beside it
    assert carry(server, server.send(Request(7, b"x")), worker).payload == b"x"


@pytest.mark.parametrize(("worker_offers", "server_offers"), [
    (EXTENSIONS, KNOWN_FEATURES),  # a worker without the hooks
    (EXTENSIONS | CAPABILITIES, EXTENSIONS),  # a server that does not use it
    (frozenset(), KNOWN_FEATURES),  # a plain verda-io worker
])
def test_without_both_offers_nobody_may_send_a_sleep(worker_offers: frozenset[str],
                                                      server_offers: frozenset[str]) -> None:
    worker, server = pair(worker_offers, server_offers)
    assert "sleep" not in server.features
    with pytest.raises(LocalProtocolError, match="sleep"):
        server.send(SleepRequest(1))
    with pytest.raises(LocalProtocolError, match="sleep"):
        worker.send(SleepReply(1, "asleep"))
    # and a worker refuses one sent anyway, naming its id (the stream stays in sync)
    worker.receive_data(frame(2, 0, 9, {"type": "sleep", "level": 1}))
    with pytest.raises(ProtocolError) as info:
        worker.next_event()
    assert not info.value.fatal and info.value.message_id == 9


@pytest.mark.parametrize(("payload", "needle"), [
    ({"type": "sleep", "level": 7}, "level"),
    ({"type": "sleep", "level": "1"}, "level"),
    ({"type": "nap"}, "sleep | wake"),
    ("sleep", "sleep | wake"),
])
def test_a_worker_refuses_a_junk_sleep_request_with_its_id(payload: Any, needle: str) -> None:
    worker, _server = pair(EXTENSIONS | CAPABILITIES, KNOWN_FEATURES)
    worker.receive_data(frame(2, 0, 4, payload))
    with pytest.raises(ProtocolError, match=needle) as info:
        worker.next_event()
    assert info.value.message_id == 4 and not info.value.fatal


@pytest.mark.parametrize(("payload", "needle"), [
    ({"status": "ready"}, "asleep"),
    ({"status": "asleep", "kept_mib": -1}, "kept_mib"),
    ({"status": "asleep", "host_mib": 2.5}, "host_mib"),
    (["asleep"], "map"),
])
def test_a_server_refuses_a_junk_sleep_reply_naming_the_sleep(payload: Any,
                                                               needle: str) -> None:
    _worker, server = pair(EXTENSIONS | CAPABILITIES, KNOWN_FEATURES)
    server.send(SleepRequest(3))
    server.receive_data(frame(3, 0, 3, payload))
    with pytest.raises(ProtocolError, match=needle) as info:
        server.next_event()
    assert info.value.message_id == 3
    # it was answered (badly): a second answer answers nothing
    server.receive_data(frame(3, 0, 3, {"status": "asleep"}))
    with pytest.raises(ProtocolError, match="answers no request"):
        server.next_event()


def test_an_error_answer_to_a_sleep_is_a_failed_sleep() -> None:
    _worker, server = pair(EXTENSIONS | CAPABILITIES, KNOWN_FEATURES)
    server.send(WakeRequest(8))
    server.receive_data(frame(8, 0, 8, {"error": "ProtocolError: no", "type": "bad_request"}))
    assert server.next_event() == WakeReply(8, "error", "ProtocolError: no")
    server.send(SleepRequest(9))
    server.receive_data(frame(3, 0, 9, {"status": "error", "error": "OOM on the host"}))
    assert server.next_event() == SleepReply(9, "error", "OOM on the host")


# -- real workers -----------------------------------------------------------------------------


def sim_mib(sim_dir: Path, pid: int) -> int:
    """What the worker process holds on the simulated device (its ledger file)."""
    return int(json.loads((sim_dir / f"{pid}.json").read_text())["mib"])


@pytest.fixture(autouse=True)
def _clean_sim_dirs() -> Iterator[None]:
    yield
    for path in _SIM_DIRS:
        shutil.rmtree(path, ignore_errors=True)
    _SIM_DIRS.clear()


_SIM_DIRS: list[Path] = []


def start(wire_server: ServerFactory, spawn_worker: SpawnWorker, mode: str,
          features: frozenset[str] = KNOWN_FEATURES, **env: str) -> tuple[Any, Any, Path]:
    sim_dir = Path(tempfile.mkdtemp(prefix="vt-sim-", dir="/tmp"))
    _SIM_DIRS.append(sim_dir)
    server = wire_server(features=features)
    proc = spawn_worker("sleepy.py", server, "sleepy", env={
        "VRAMTUI_SIM_DIR": str(sim_dir), "SLEEPY_MODE": mode, "SLEEPY_WEIGHTS": "1000",
        "SLEEPY_KEEP": "100", **env})
    link = server.wait_worker("sleepy")
    link.wait_status("ready")
    return proc, link, sim_dir


@pytest.mark.parametrize("mode", ["honest", "async"])
def test_a_worker_sleeps_and_wakes_and_the_device_sees_it(
        wire_server: ServerFactory, spawn_worker: SpawnWorker, mode: str) -> None:
    proc, link, sim_dir = start(wire_server, spawn_worker, mode)
    assert "sleep" in link.worker_features and "sleep" in link.features
    assert sim_mib(sim_dir, proc.pid) == 1000
    reply = link.sleep(level=2)
    assert (reply.status, reply.kept_mib) == ("asleep", 100)
    assert reply.host_mib is not None  # said, or measured by the SDK
    assert sim_mib(sim_dir, proc.pid) == 100  # the device's truth, not the worker's word
    assert link.status() == {"status": "asleep"}
    refused = link.request(b"while asleep")
    assert refused.kind == "error" and refused.status_code == 409
    assert "asleep" in refused.error["error"]
    assert link.sleep().status == "asleep"  # asleep already: said, nothing run again
    assert link.wake().status == "awake"
    assert sim_mib(sim_dir, proc.pid) == 1000
    answer = json.loads(link.request(b"hi").data)
    assert answer["pid"] == proc.pid and answer["sleep_calls"] == 1 and answer["level"] == 2
    assert proc.poll() is None  # one process all along


def test_a_failing_hook_is_answered_with_its_error_and_the_worker_lives_on(
        wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    proc, link, sim_dir = start(wire_server, spawn_worker, "wake-fails")
    assert link.sleep().status == "asleep"
    reply = link.wake()
    assert reply.status == "error" and "RuntimeError: the weights are gone" in (reply.error or "")
    assert proc.poll() is None and link.status() == {"status": "asleep"}


def test_a_worker_with_hooks_under_a_server_without_sleep_is_a_plain_worker(
        wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    proc, link, _sim = start(wire_server, spawn_worker, "honest", features=EXTENSIONS)
    assert "sleep" in link.worker_features and "sleep" not in link.features
    with pytest.raises(LocalProtocolError):
        link.sleep()
    assert json.loads(link.request(b"x").data)["pid"] == proc.pid


def test_a_sleep_without_a_wake_is_refused_at_start(
        wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    proc = spawn_worker("sleep_only.py", wire_server(), "lonely")
    assert proc.wait(timeout=10) == ExitCode.SCRIPT
    lines = [line for line in proc.output().splitlines() if " ERROR " in line]
    assert len(lines) == 1
    assert "@worker_sdk.sleep but no @worker_sdk.wake" in lines[0]
    assert "sleep_only.py" in lines[0]

