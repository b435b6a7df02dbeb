"""The engine's worker sockets under load nobody should send: connection floods, chunk floods,
frames at the size limit — and the liveness ping, answered by a busy worker.

The attackers are real processes and sockets; the truths are the engine process's own file
descriptors (/proc/self/fd), its log records, what a real control-socket client gets back,
and the bytes a flooding sender managed to push.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import WORKERS, Gate
from engine_support import sim_backend
from serve_support import in_process

from supervisor.client import Client
from supervisor.jobs import JobState
from supervisor.workers.wire import WireConnection, WireLimits, WireListener
from worker_sdk.events import Chunk, Event, Reply, Request

pytestmark = pytest.mark.timeout(120)
HEADER = struct.Struct(">QBBH")

# Open N connections to each of the two sockets and hold them, idle; say how many got through.
FLOOD = textwrap.dedent("""
    import socket, sys
    held = []
    for path in sys.argv[1:3]:
        for _ in range(int(sys.argv[3])):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
            except OSError:
                s.close()
                continue
            held.append(s)
    print(len(held), flush=True)
    sys.stdin.read()
""")


def frame(msg_type: int, data_type: int, msg_id: int, payload: Any) -> bytes:
    body = msgpack.packb({"id": msg_id, "message_type": msg_type, "data_type": data_type,
                          "timestamp": None, "payload": payload}, use_bin_type=True)
    return HEADER.pack(len(body), msg_type, data_type, 0) + body


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.process
def test_20000_idle_connections_cost_the_engine_a_few_fds_and_nothing_else() -> None:
    backends = [sim_backend("a", 256, 128), sim_backend("b", 256, 128)]
    records = Records()
    wire_log = logging.getLogger("supervisor.workers.wire")
    wire_log.addHandler(records)
    try:
        with in_process(backends) as (sup, _server, _root):
            fds_before = open_fds()
            peak = [fds_before]
            sampling = threading.Event()

            def sample() -> None:  # the most descriptors the engine held at any moment
                while not sampling.wait(0.005):
                    peak[0] = max(peak[0], open_fds())

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            paths = [str(sup.paths.worker_control_socket), str(sup.paths.worker_data_socket)]
            attackers = [subprocess.Popen([sys.executable, "-c", FLOOD, *paths, "5000"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                         for _ in range(2)]
            try:
                held = 0
                for proc in attackers:
                    assert proc.stdout is not None
                    ready, _, _ = select.select([proc.stdout], [], [], 90)
                    assert ready, "the attacker did not finish connecting"
                    held += int(proc.stdout.readline())
                assert held == 20_000  # every connect went through: nothing stalls the accept
                # (asyncio accepts a batch before the engine sees it: let the last ones close)
                deadline = time.monotonic() + 10
                while (fds_during := open_fds()) - fds_before >= 100 and \
                        time.monotonic() < deadline:
                    time.sleep(0.01)
                sampling.set()
                sampler.join(5)
                started = time.monotonic()
                with Client(sup.paths.control_socket) as client:
                    snapshot = client.snapshot()
                status_s = time.monotonic() - started
                jobs = [sup.submit(name, b'{"steps": 1}') for name in ("a", "b")]
                results = [sup.wait(job, 60) for job in jobs]
            finally:
                for proc in attackers:
                    proc.kill()
                    proc.wait(10)
            refused = sup.engine.pool.factory.listener.refused_connections
    finally:
        wire_log.removeHandler(records)
    assert fds_during - fds_before < 100, (fds_before, fds_during)
    assert peak[0] - fds_before < 2000, peak  # of 20,000 held by the attackers
    assert status_s < 1.0, status_s
    assert {b.name for b in snapshot.backends} >= {"a", "b"}
    assert all(r.state is JobState.SUCCEEDED for r in results), [r.error for r in results]
    assert refused >= 20_000 - 64
    assert len(records.records) < 50, len(records.records)  # not one line per connection


# -- the listener alone, in a loop of the test's own -----------------------------------------


class Loop:
    """An asyncio loop on a thread, for driving a WireListener directly."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Any, *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)
        return self.run(call())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Claim:
    """The claimant a worker handle would be: takes the connections of one process."""

    def __init__(self, pid: int, slow_s: float = 0.0) -> None:
        self.pid = pid
        self.slow_s = slow_s
        self.conns: dict[bool, WireConnection] = {}
        self.events: list[Event] = []
        self.chunk_bytes = 0
        self.max_decoder = 0
        self.attached = threading.Event()

    def accepts_pid(self, pid: int | None) -> bool:
        if pid == self.pid:
            return True
        try:
            import psutil
            return self.pid in {p.pid for p in psutil.Process(pid).parents()}
        except Exception:  # noqa: BLE001
            return False

    def attach(self, conn: WireConnection, is_control: bool) -> None:
        self.conns[is_control] = conn
        conn.on_event = lambda event, c=conn: self.on_event(c, event)
        if len(self.conns) == 2:
            self.attached.set()

    def on_event(self, conn: WireConnection, event: Event) -> None:
        self.max_decoder = max(self.max_decoder, conn.decoder_capacity)
        if isinstance(event, Chunk):
            self.chunk_bytes += len(event.data)
            if self.slow_s:
                time.sleep(self.slow_s)  # an engine that cannot keep up
        else:
            self.events.append(event)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A folder for the listener's sockets with a short path (a Unix socket's path has a
    limit that pytest's own temporary folders can pass), removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="vtw-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def listener(socket_dir: Path) -> Iterator[tuple[Loop, WireListener]]:
    loop = Loop()
    wire = WireListener(str(socket_dir / "c.sock"), str(socket_dir / "d.sock"),
                        limits=WireLimits(data_frame=1024 * 1024, register_timeout_s=0.5))
    loop.run(wire.start())
    yield loop, wire
    loop.run(wire.close())
    loop.close()


def register(path: str, name: str, features: str = "stream") -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    sock.sendall(frame(0, 0, 1, {"identifier": name, "type": "ml_worker",
                                 "metadata": {"vramtui-features": features}}))
    return sock


def test_a_chunk_flood_is_held_back_by_the_socket_not_buffered_by_the_engine(
        listener: tuple[Loop, WireListener]) -> None:
    loop, wire = listener
    claim = Claim(os.getpid(), slow_s=0.002)  # 2 ms per chunk: about 32 MB/s at most
    wire.claim("flood", claim)
    control = register(wire.control_path, "flood")
    data = register(wire.data_path, "flood")
    assert claim.attached.wait(10)
    conn = claim.conns[False]
    loop.call(conn.send, Request(1, b"go", "job", stream=True))
    sent = 0
    stop = threading.Event()
    chunk = frame(7, 2, 1, b"c" * 65536)

    def flood() -> None:
        nonlocal sent
        data.settimeout(0.2)
        while not stop.is_set():
            try:
                data.sendall(chunk)
            except TimeoutError:
                continue  # (the engine is not reading: exactly the point)
            except OSError:
                return
            sent += len(chunk)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    deadline = time.monotonic() + 1.0
    lag = 0
    while time.monotonic() < deadline:
        lag = max(lag, sent - claim.chunk_bytes)
        time.sleep(0.05)
    stop.set()
    thread.join(5)
    assert claim.chunk_bytes > 1024 * 1024  # it did take chunks all along
    # What the sender got rid of but the engine had not handled: socket buffers and one
    # decoder buffer, whatever the sender's speed.
    socket_buffers = sum(s.getsockopt(socket.SOL_SOCKET, opt)
                         for s in (data,) for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF))
    assert lag < socket_buffers + 2 * 1024 * 1024, (lag, socket_buffers)
    assert claim.max_decoder <= 1024 * 1024
    control.close()
    data.close()


def test_frames_at_the_data_limit_pass_and_one_byte_more_closes(
        listener: tuple[Loop, WireListener]) -> None:
    loop, wire = listener
    claim = Claim(os.getpid())
    wire.claim("big", claim)
    control = register(wire.control_path, "big", features="")
    data = register(wire.data_path, "big", features="")
    assert claim.attached.wait(10)
    conn = claim.conns[False]
    for wire_id in (1, 2):
        loop.call(conn.send, Request(wire_id, b"x"))
    base = len(frame(7, 0, 1, b"x" * 70_000)) - 12 - 70_000  # around a bin32 payload
    at = frame(7, 0, 1, b"x" * (1024 * 1024 - base))
    assert len(at) - 12 == 1024 * 1024
    data.sendall(at)
    data.sendall(HEADER.pack(1024 * 1024 + 1, 7, 0, 0))  # refused on the header alone
    data.settimeout(10)
    while data.recv(65536):  # the engine closes the connection
        pass
    replies = [e for e in claim.events if isinstance(e, Reply)]
    assert len(replies) == 1 and len(replies[0].data) == 1024 * 1024 - base  # type: ignore
    assert conn.closed and conn.closed_by_engine
    control.close()


def test_unregistered_connections_time_out_and_are_capped_per_process(
        listener: tuple[Loop, WireListener]) -> None:
    _loop, wire = listener
    socks = []
    for _ in range(20):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(wire.control_path)
        sock.settimeout(10)
        socks.append(sock)
    # Beyond 8 from one process: closed at once.  The 8 others: once 0.5 s unregistered.
    started = time.monotonic()
    closed_at: list[float] = []
    waiting = list(socks)
    while waiting and time.monotonic() - started < 10:
        readable, _, _ = select.select(waiting, [], [], 0.5)
        for sock in readable:
            assert sock.recv(1) == b""
            closed_at.append(time.monotonic() - started)
            waiting.remove(sock)
            sock.close()
    assert not waiting
    assert sum(1 for t in closed_at if t < 0.3) >= 12
    assert sum(1 for t in closed_at if t >= 0.45) >= 8
    assert max(closed_at) < 5
    assert wire.unregistered == 0


# -- the liveness ping ---------------------------------------------------------------------


@pytest.mark.process
@pytest.mark.parametrize("module", ["worker_sdk", "verda_io"])
def test_a_worker_busy_in_predict_answers_the_engine_ping(
        listener: tuple[Loop, WireListener], module: str, tmp_path: Path) -> None:
    loop, wire = listener
    gate = Gate(tmp_path / "gate")
    started = tmp_path / "started"
    script = tmp_path / "blocking.py"
    script.write_text(textwrap.dedent(f"""
        import {module} as sdk

        @sdk.predict
        def predict(payload):
            open({str(started)!r}, "w").close()
            with open({str(gate.path)!r}, "rb") as gate:
                gate.read(1)
            return payload
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(WORKERS.parent.parent),
                                                      env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", module, str(script),
                             "--control-socket", wire.control_path,
                             "--data-socket", wire.data_path, "--name", "pinged"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        claim = Claim(proc.pid)
        wire.claim("pinged", claim)
        assert claim.attached.wait(20)
        control, data = claim.conns[True], claim.conns[False]

        def ready() -> bool:
            return any(getattr(e, "status", None) == "ready" for e in list(claim.events))

        deadline = time.monotonic() + 20
        while not ready():
            assert time.monotonic() < deadline, "the worker never said ready"
            time.sleep(0.01)
        loop.call(data.send, Request(1, b"blocked", "job"))
        deadline = time.monotonic() + 10
        while not started.exists():
            assert time.monotonic() < deadline, "predict never started"
            time.sleep(0.01)
        loop.call(control.ping)
        deadline = time.monotonic() + 10
        while loop.call(control.oldest_unanswered_ping_s) is not None:
            assert time.monotonic() < deadline, "no pong while predict is busy"
            time.sleep(0.01)
        assert control.last_pong_at is not None
        assert not [e for e in claim.events if isinstance(e, Reply)]  # predict still blocked
        gate.release()
        deadline = time.monotonic() + 10
        while not [e for e in claim.events if isinstance(e, Reply)]:
            assert time.monotonic() < deadline, "no reply once released"
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait(10)
        gate.close()


def test_a_worker_that_never_reads_is_cut_off_not_buffered_for(socket_dir: Path) -> None:
    loop = Loop()
    wire = WireListener(str(socket_dir / "c.sock"), str(socket_dir / "d.sock"),
                        limits=WireLimits(max_write_buffer=1024 * 1024))
    loop.run(wire.start())
    try:
        claim = Claim(os.getpid())
        wire.claim("deaf", claim)
        control = register(wire.control_path, "deaf")
        data = register(wire.data_path, "deaf")  # and then never reads a byte
        assert claim.attached.wait(10)
        conn = claim.conns[False]
        payload = b"r" * 256 * 1024
        sent = 0
        while not conn.closed and sent < 256:  # 64 MiB at most
            loop.call(conn.send, Request(sent + 1, payload, "job"))
            sent += 1
        assert conn.closed and conn.closed_by_engine
        assert sent * len(payload) < 32 * 1024 * 1024  # cut off early, not at 64 MiB
        control.close()
        data.close()
    finally:
        loop.run(wire.close())
        loop.close()


class StartingClaim(Claim):
    """A claimant whose process is still being started: its pid is not known yet."""

    def __init__(self) -> None:
        super().__init__(-1)
        self.waiting: list[Any] = []

    def when_started(self, then: Any) -> bool:
        if self.pid != -1:
            return False
        self.waiting.append(then)
        return True

    def started(self, pid: int) -> None:
        self.pid = pid
        waiting, self.waiting = self.waiting, []
        for then in waiting:
            then()


def test_a_worker_that_registers_before_its_start_returned_is_taken_once_its_pid_is_known(
        listener: tuple[Loop, WireListener]) -> None:
    # Its process connected while the engine's start was still completing (the loop turns
    # in between): refusing it as "not that worker's process" failed healthy workers on a
    # loaded machine. Its registration waits for the pid, then is decided by it.
    loop, wire = listener
    claim = StartingClaim()
    wire.claim("early", claim)
    control = register(wire.control_path, "early")
    data = register(wire.data_path, "early")
    wait_for = time.monotonic() + 10
    while len(claim.waiting) < 2:
        assert time.monotonic() < wait_for, "the registrations did not wait"
        time.sleep(0.01)
    assert not claim.attached.is_set()
    loop.call(claim.started, os.getpid())
    assert claim.attached.wait(10)
    # Another process's registration, once the pid is known: refused as before.
    other = StartingClaim()
    wire.claim("other", other)
    sock = register(wire.control_path, "other")
    wait_for = time.monotonic() + 10
    while not other.waiting:
        assert time.monotonic() < wait_for, "the registration did not wait"
        time.sleep(0.01)
    loop.call(other.started, os.getpid() + 10**6)
    sock.settimeout(10)
    assert sock.recv(65536) == b""  # closed, never attached
    assert not other.conns
    for s in (control, data, sock):
        s.close()
