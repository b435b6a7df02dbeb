"""The worker SDK end to end: real worker processes over real Unix sockets, served by WireServer.

Covers registration, every reply kind, envelopes, errors, progress, cancellation (cooperative,
streaming, async, not running, before processing), health while busy, pings, shutdown, init
failures, bad scripts, reconnects, initialize order, async and two-parameter predicts, config
precedence, hostile frames on a live worker, and that importing the SDK configures no logging.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import WORKERS, Gate, ServerFactory, SpawnWorker

from worker_sdk.config import ConfigError, resolve
from worker_sdk.events import Event, Progress, Status
from worker_sdk.protocol import (
    EXTENSIONS,
    HEADER,
    DataType,
    MessageType,
)
from worker_sdk.testing import WireServer, WorkerLink

pytestmark = pytest.mark.timeout(60)


def cmd(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def is_progress(wire_id: int, message: str | None = None) -> Callable[[Event], bool]:
    def match(e: Event) -> bool:
        return (
            isinstance(e, Progress)
            and e.request == wire_id
            and (message is None or e.message == message)
        )

    return match


def start(
    wire_server: ServerFactory, spawn_worker: SpawnWorker, script: str, name: str, *args: str
) -> tuple[WireServer, subprocess.Popen[bytes], WorkerLink]:
    server = wire_server()
    proc = spawn_worker(script, server, name, *args)
    return server, proc, server.wait_worker(name)


@pytest.fixture
def full(
    wire_server: ServerFactory, spawn_worker: SpawnWorker
) -> tuple[WireServer, subprocess.Popen[bytes], WorkerLink]:
    return start(wire_server, spawn_worker, "full.py", "full")


# -- registration and replies ---------------------------------------------------------------


@pytest.mark.process
def test_registration_negotiates_extensions(full: Any) -> None:
    server, _proc, link = full
    assert link.name == "full"
    assert link.worker_features == EXTENSIONS
    assert link.features == EXTENSIONS - {"data-progress"}  # what this server offered
    assert link.statuses[:2] == ["initializing", "ready"]
    assert link.status() == {"status": "ready"}
    assert link.health() == {"status": "ok", "device": "test"}


@pytest.mark.process
def test_every_reply_kind(full: Any) -> None:
    _server, _proc, link = full
    plain = link.request(b"\x00raw bytes\xff")
    assert (plain.kind, plain.data) == ("bytes", b"\x00raw bytes\xff")

    resp = link.request(cmd(op="response", data="made", headers={"X-A": "1"}, status=201))
    assert resp.kind == "envelope"
    assert (resp.data, resp.headers, resp.status_code) == (b"made", {"X-A": "1"}, 201)

    stream = link.request(cmd(op="stream", n=4))
    assert stream.kind == "stream"
    assert stream.chunks == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n", b"chunk 3\n"]

    err = link.request(cmd(op="error", message="bad input: 7"))
    assert err.kind == "error"
    assert err.error == {"error": "ValueError: bad input: 7", "type": "prediction_error",
                         "status_code": 500}
    assert err.status_code == 500

    wrong = link.request(cmd(op="bad_return"))
    assert wrong.kind == "error"
    assert wrong.error is not None and wrong.error["error"].startswith("TypeError: predict()")
    # Still serving after the failures.
    assert link.request(b"again").data == b"again"


@pytest.mark.process
def test_explicit_stream_frames(full: Any) -> None:
    _server, _proc, link = full
    wire_id = link.send_request(cmd(op="stream", n=2))
    frames = [link.read(wire_id) for _ in range(3)]
    assert [(f.type, f.data_type) for f in frames] == [(MessageType.DATA, DataType.STREAM)] * 3
    assert [f.payload for f in frames] == [b"chunk 0\n", b"chunk 1\n", None]


@pytest.mark.process
def test_envelope_reaches_current(full: Any) -> None:
    _server, _proc, link = full
    wire_id = link.send_request(
        cmd(op="context"), request_id="req-42", metadata={"user": "ann", "n": 3}, deadline=1234.5
    )
    assert json.loads(link.collect(wire_id).data) == {
        "id": "req-42", "wire_id": wire_id, "metadata": {"user": "ann", "n": 3},
        "deadline": 1234.5,
    }
    bare = link.send_request(cmd(op="context"), envelope=False)
    assert json.loads(link.collect(bare).data) == {
        "id": str(bare), "wire_id": bare, "metadata": {}, "deadline": None
    }


@pytest.mark.process
def test_progress_events(full: Any) -> None:
    _server, _proc, link = full
    steps = ["load", "denoise", "decode", "unknown"]
    wire_id = link.send_request(
        cmd(op="progress", steps=steps, fractions=[0.25, 1.5, -1, None])
    )
    assert link.collect(wire_id).data == b"done"
    got = [link.wait_event(is_progress(wire_id)) for _ in steps]
    assert [(p.fraction, p.message) for p in got] == [  # type: ignore[attr-defined]
        (0.25, "load"), (1.0, "denoise"), (0.0, "decode"), (None, "unknown")
    ]


# -- cancellation -----------------------------------------------------------------------------


@pytest.mark.process
def test_cancel_cooperative(full: Any) -> None:
    _server, _proc, link = full
    wire_id = link.send_request(cmd(op="coop"))
    link.wait_event(is_progress(wire_id, "started"))
    link.cancel(wire_id)
    reply = link.collect(wire_id)
    assert reply.kind == "error"
    assert reply.status_code == 499
    assert reply.error is not None and reply.error["type"] == "cancelled"
    assert reply.error["error"].startswith("Cancelled:")
    assert link.request(b"next").data == b"next"


@pytest.mark.process
def test_cancel_stream_stops_at_next_yield(full: Any, gate: Callable[[str], Gate]) -> None:
    _server, proc, link = full
    g = gate("stream")
    wire_id = link.send_request(cmd(op="stream_gate", gate=str(g.path)))
    first = link.read(wire_id)
    assert first.payload == b"first"
    link.cancel(wire_id)
    assert link.status() == {"status": "busy"}  # control is in order: the cancel was handled
    g.release()
    reply = link.collect(wire_id)
    assert reply.kind == "error" and reply.status_code == 499
    assert reply.chunks == []  # "second" was produced after the cancel and never sent
    assert proc.marker("stream_closed") == "closed\n"  # the generator was closed
    assert link.request(b"ok").data == b"ok"


@pytest.mark.process
def test_cancel_not_running_keeps_worker_healthy(full: Any) -> None:
    _server, _proc, link = full
    done = link.send_request(b"finished")
    assert link.collect(done).data == b"finished"
    link.cancel(done)  # already answered
    link.cancel(10_000)  # never sent
    link.cancel("not-an-id")  # type: ignore[arg-type]
    assert link.ping().type == MessageType.PONG
    assert link.request(b"still here").data == b"still here"


@pytest.mark.process
def test_cancel_before_processing(full: Any, gate: Callable[[str], Gate]) -> None:
    _server, _proc, link = full
    g = gate("busy")
    blocker = link.send_request(cmd(op="block", gate=str(g.path)))
    link.wait_event(is_progress(blocker, "blocked"))
    queued = link.send_request(b"queued behind the blocker")
    link.cancel(queued)
    assert link.status() == {"status": "busy"}
    g.release()
    assert link.collect(blocker).data == b"released"
    reply = link.collect(queued)
    assert reply.kind == "error" and reply.status_code == 499
    assert reply.error is not None and reply.error["type"] == "cancelled"


@pytest.mark.process
def test_a_worker_of_sync_hooks_never_imports_asyncio() -> None:
    """asyncio (with ssl) was a third of a simulated worker's start: every cold start and
    switch waits for it. Only a worker with an async hook imports it (the test above cancels
    one)."""
    code = ("import sys, worker_sdk, worker_sdk.runner, worker_sdk.sim, worker_sdk.testing; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'asyncio'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_cancel_async_predict(wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    _server, proc, link = start(wire_server, spawn_worker, "async_worker.py", "async-cancel")
    wire_id = link.send_request(cmd(op="block"))
    link.wait_event(is_progress(wire_id, "started"))
    link.cancel(wire_id)
    reply = link.collect(wire_id)
    assert reply.kind == "error" and reply.status_code == 499
    assert proc.marker("async_cancelled") == "cancelled\n"

    endless = link.send_request(cmd(op="endless"))
    assert link.read(endless).payload == b"first"
    link.cancel(endless)
    reply = link.collect(endless)
    assert reply.kind == "error" and reply.status_code == 499
    assert proc.marker("agen_closed") == "closed\n"
    assert link.request(b"after").data.startswith(b"async:after:")


# -- control while busy, pings ----------------------------------------------------------------


@pytest.mark.process
def test_health_and_ping_while_predict_busy(full: Any, gate: Callable[[str], Gate]) -> None:
    _server, _proc, link = full
    g = gate("health")
    wire_id = link.send_request(cmd(op="block", gate=str(g.path)))
    link.wait_event(is_progress(wire_id, "blocked"))
    assert link.health(timeout=2) == {"status": "ok", "device": "test"}
    assert link.ping(timeout=2).type == MessageType.PONG
    assert link.status(timeout=2) == {"status": "busy"}
    with pytest.raises(TimeoutError):
        link.collect(wire_id, timeout=0.2)  # really still blocked
    g.release()
    assert link.collect(wire_id).data == b"released"


@pytest.mark.process
def test_ping_on_both_sockets(full: Any) -> None:
    _server, _proc, link = full
    ctrl = link.ping()
    data = link.ping_data()
    for pong in (ctrl, data):
        assert pong.type == MessageType.PONG
        assert pong.payload == {"event": 0}
    assert ctrl.id != data.id


# -- lifecycle ---------------------------------------------------------------------------------


@pytest.mark.process
def test_shutdown_event(full: Any) -> None:
    _server, proc, link = full
    assert link.request(b"x").data == b"x"
    link.shutdown()
    assert proc.wait(timeout=10) == 0
    assert proc.marker("unload") == "unload\n"
    assert proc.marker("init") == "init\n"


@pytest.mark.process
def test_sigterm_finishes_request_then_exits(full: Any, gate: Callable[[str], Gate]) -> None:
    _server, proc, link = full
    g = gate("term")
    wire_id = link.send_request(cmd(op="block", gate=str(g.path)))
    link.wait_event(is_progress(wire_id, "blocked"))
    proc.send_signal(signal.SIGTERM)
    assert link.status() == {"status": "busy"}
    g.release()
    assert link.collect(wire_id).data == b"released"
    assert proc.wait(timeout=10) == 0
    assert proc.marker("unload") == "unload\n"


def test_init_failure_reported(wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    server = wire_server()
    proc = spawn_worker("init_fail.py", server, "broken")
    link = server.wait_worker("broken", ready=False)
    event = link.wait_status("failed")
    assert isinstance(event, Status)
    assert event.error == (
        "RuntimeError: model weights missing at /nonexistent/weights.bin"
    )
    assert proc.wait(timeout=10) == 3
    assert proc.marker("unload") == ""
    assert "ready" not in link.statuses


def test_init_failure_plain_server(wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    server = wire_server(features=frozenset())
    proc = spawn_worker("init_fail.py", server, "broken-plain")
    link = server.wait_worker("broken-plain", ready=False)
    assert proc.wait(timeout=10) == 3
    assert link.closed.wait(5)
    assert link.statuses == ["initializing"]  # no "failed" report without the extension
    assert "model weights missing" in proc.output()


def error_lines(proc: Any) -> list[str]:
    return [line for line in proc.output().splitlines() if " ERROR " in line]


def test_script_that_cannot_load(wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    server = wire_server()
    proc = spawn_worker("bad_import.py", server, "bad")
    assert proc.wait(timeout=10) == 1
    [line] = error_lines(proc)
    assert str(WORKERS / "bad_import.py") in line
    assert "vramtui_test_no_such_module" in line
    assert not server.links

    missing = spawn_worker("does_not_exist.py", server, "missing")
    assert missing.wait(timeout=10) == 1
    [line] = error_lines(missing)
    assert "not found" in line and str(WORKERS / "does_not_exist.py") in line


@pytest.mark.parametrize(
    ("script", "needles"),
    [
        ("no_predict.py", ["no_predict.py", "no @worker_sdk.predict"]),
        ("two_predicts.py", ["two_predicts.py", "two @worker_sdk.predict", "first", "second"]),
    ],
)
def test_predict_count_must_be_one(
    wire_server: ServerFactory, spawn_worker: SpawnWorker, script: str, needles: list[str]
) -> None:
    proc = spawn_worker(script, wire_server(), "count")
    assert proc.wait(timeout=10) == 1
    [line] = error_lines(proc)
    for needle in needles:
        assert needle in line


@pytest.mark.process
def test_reconnect_without_reinitialising(full: Any) -> None:
    server, proc, link = full
    assert link.request(cmd(op="init_count")).data == b"1"
    server.drop_connections()
    again = server.wait_worker("full")
    assert again is not link
    assert again.request(cmd(op="init_count")).data == b"1"
    assert again.request(b"served").data == b"served"
    assert proc.marker("init") == "init\n"
    assert proc.poll() is None


def test_server_gone_for_good_exits_4(
    wire_server: ServerFactory, spawn_worker: SpawnWorker
) -> None:
    server = wire_server()
    proc = spawn_worker("full.py", server, "orphan", "--max-reconnect-count", "2")
    server.wait_worker("orphan")
    server.close()
    assert proc.wait(timeout=15) == 4
    out = proc.output()
    assert "reconnect attempt 2" in out and "reconnect attempt 3" not in out
    assert "gone for good after 2 reconnect attempts" in out


def test_initialize_order(wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    _server, _proc, link = start(wire_server, spawn_worker, "init_order.py", "order")
    assert link.request(b"?").data == b"neg5,a0,a0-second,b1,c2"


def test_async_predict_and_stream(wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    _server, _proc, link = start(wire_server, spawn_worker, "async_worker.py", "async")
    assert link.request(b"hi", request_id="r1").data == b"async:hi:r1"
    stream = link.request(cmd(op="stream", n=3))
    assert stream.kind == "stream"
    assert stream.chunks == [b"async 0", b"async 1", b"async 2"]
    err = link.request(cmd(op="error"))
    assert err.error is not None and err.error["error"] == "KeyError: 'async failure'"


def test_two_parameter_predict(wire_server: ServerFactory, spawn_worker: SpawnWorker) -> None:
    _server, _proc, link = start(wire_server, spawn_worker, "two_param.py", "two")
    reply = link.request(b"data", request_id="abc", metadata={"k": "v"})
    assert json.loads(reply.data) == {"payload": "data", "id": "abc", "meta": {"k": "v"}}


# -- configuration -----------------------------------------------------------------------------


def write_config(path: Path, server: WireServer, **extra: Any) -> Path:
    lines = [
        f"script: {WORKERS / 'full.py'}",
        f"control-socket: {server.control_path}",
        f"data-socket: {server.data_path}",
        "name: from-file",
        "environment:",
        "  GREETING: from-config",
    ]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_config_precedence_processes(
    wire_server: ServerFactory, spawn_worker: SpawnWorker, sock_dir: Path
) -> None:
    server = wire_server()
    cfg = write_config(sock_dir / "worker.yaml", server)
    env = {"VERDA_IO_WORKER_NAME": "from-env"}
    # file beats defaults (sockets and name), env beats file, flags beat env.
    spawn_worker(None, None, None, "-c", str(cfg))
    spawn_worker(None, None, None, "-c", str(cfg), env=env)
    spawn_worker(None, None, "from-flag", "-c", str(cfg), env=env)
    # The config file may also come from $VERDA_IO_WORKER_CONFIG.
    spawn_worker(None, None, None, env={"VERDA_IO_WORKER_CONFIG": str(cfg),
                                        "VERDA_IO_WORKER_NAME": "via-env-config"})
    for name in ("from-file", "from-env", "from-flag", "via-env-config"):
        link = server.wait_worker(name)
        assert link.request(cmd(op="env", key="GREETING")).data == b"from-config"


def test_config_precedence_resolve(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("script: file.py\nname: file\ncontrol-socket: /f/c\nmax-reconnect-count: 9\n")
    env = {"VERDA_IO_WORKER_NAME": "env", "VERDA_IO_WORKER_CONTROL_SOCKET": "/e/c",
           "VERDA_IO_WORKER_DEBUG": "true"}
    none = {"script": None, "control_socket": None, "data_socket": None, "name": None,
            "max_reconnect_count": None, "debug": None}
    defaults = resolve(none, None, {})
    assert (defaults.name, defaults.max_reconnect_count, defaults.debug) == (
        "ml-worker-1", 5, False)
    from_file = resolve(none, str(cfg), {})
    assert (from_file.script, from_file.name, from_file.control_socket,
            from_file.max_reconnect_count) == ("file.py", "file", "/f/c", 9)
    assert from_file.data_socket == defaults.data_socket
    from_env = resolve(none, str(cfg), env)
    assert (from_env.name, from_env.control_socket, from_env.debug) == ("env", "/e/c", True)
    from_flags = resolve({**none, "name": "flag", "max_reconnect_count": 1}, str(cfg), env)
    assert (from_flags.name, from_flags.max_reconnect_count, from_flags.control_socket) == (
        "flag", 1, "/e/c")
    cfg.write_text("max-reconnect-count: lots\n")
    with pytest.raises(ConfigError, match="max-reconnect-count must be an integer"):
        resolve(none, str(cfg), {})


def test_unknown_config_key_exits_2(spawn_worker: SpawnWorker, sock_dir: Path) -> None:
    cfg = sock_dir / "bad.yaml"
    cfg.write_text(f"script: {WORKERS / 'full.py'}\nnmae: typo\n")
    proc = spawn_worker(None, None, None, "-c", str(cfg))
    assert proc.wait(timeout=10) == 2
    out = proc.output().strip()
    assert out.count("\n") == 0, out
    assert "unknown key 'nmae'" in out and str(cfg) in out

    missing = spawn_worker(None, None, None, "-c", str(sock_dir / "nope.yaml"))
    assert missing.wait(timeout=10) == 2
    assert "cannot read worker config" in missing.output()


@pytest.mark.process
def test_import_configures_no_logging() -> None:
    code = textwrap.dedent(
        """
        import logging
        import worker_sdk, worker_sdk.testing, worker_sdk.worker, worker_sdk.protocol
        assert not logging.getLogger().handlers, logging.getLogger().handlers
        assert logging.getLogger().level == logging.WARNING
        assert not logging.getLogger("worker_sdk").handlers
        print("clean")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


# -- hostile frames on a live worker -----------------------------------------------------------


def raw_frame(msg_type: int, data_type: int, msg_id: int, payload: Any) -> bytes:
    body = msgpack.packb(
        {"id": msg_id, "message_type": msg_type, "data_type": data_type, "timestamp": None,
         "payload": payload},
        use_bin_type=True,
    )
    return HEADER.pack(len(body), msg_type, data_type, 0) + body


@pytest.mark.process
def test_str_payload_gets_error_and_worker_keeps_serving(full: Any) -> None:
    _server, proc, link = full
    link.send_raw(raw_frame(MessageType.DATA, DataType.DEFAULT, 777, "text, not bin"))
    reply = link.collect(777)
    assert reply.kind == "error"
    assert reply.status_code == 400
    assert reply.error is not None and reply.error["type"] == "bad_request"
    assert "DATA payload must be bin, got str" in reply.error["error"]
    assert link.request(b"fine").data == b"fine"
    assert proc.poll() is None


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(HEADER.pack(2**40, MessageType.DATA, 0, 0) + b"tiny", id="oversized"),
        pytest.param(HEADER.pack(5, 99, 0, 0) + b"\x80" * 5, id="unknown-type"),
    ],
)
@pytest.mark.process
def test_fatal_frame_closes_and_worker_recovers(full: Any, frame: bytes) -> None:
    server, proc, link = full
    link.send_raw(frame)
    assert link.closed.wait(10)  # the worker closed the session
    again = server.wait_worker("full")
    assert again is not link
    assert again.request(b"back").data == b"back"
    assert proc.poll() is None
    assert "frame" in proc.output()
