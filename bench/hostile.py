"""Attacks on a running engine, measured: memory, whether ``status`` still answers, jobs lost.

Each attack gets a fresh ``vramtui --serve`` (simulated GPU; the echo example and
``tests/workers/hostile.py`` as backends) in its own /tmp root, run from the tree given with
``--tree`` (default: this one) — so the same attacks can be run against an older tree for a
before/after table.  The attacks speak raw frames, so they do not depend on either tree's
client.  For each: the engine process's RSS before, at its peak (sampled at 20 Hz) and after;
the time a fresh connection takes to get a ``snapshot`` answered *during* the attack (the
question is "within a second?"), and the wall time of a whole ``vramtui status`` process;
honest jobs submitted during the attack that did not succeed ("lost"); and a note with what
the attack itself achieved.

Run: ``.venv/bin/python bench/hostile.py [--tree DIR] [--only NAME,...]``.  Never run as a
test (it takes a minute or two and hundreds of MiB).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker_sdk.protocol import (  # noqa: E402
    HEADER,
    DataType,
    Decoder,
    Message,
    MessageType,
    encode_bytes,
)

MiB = 1024 * 1024
ECHO = {"name": "echo", "script": str(ROOT / "examples" / "echo" / "main.py"),
        "vram": {"weights": "0MiB", "activation": "16MiB"}, "keep_alive": "forever"}
HOSTILE = {"name": "hostile", "script": str(ROOT / "tests" / "workers" / "hostile.py"),
           "vram": {"weights": "0MiB", "activation": "16MiB"}, "keep_alive": "forever",
           "timeouts": {"request": "600s"}}


# -- raw frames -------------------------------------------------------------------------------

def frame(msg_id: int, method: str, **args: Any) -> bytes:
    return encode_bytes(MessageType.REQUEST, DataType.DEFAULT, msg_id, {"m": method, "a": args})


HELLO = encode_bytes(MessageType.REGISTRATION, DataType.DEFAULT, 1, {
    "identifier": "vramtui-client", "type": "control",
    "metadata": {"protocol": "1", "pid": str(os.getpid()), "version": "bench"}})


class Raw:
    def __init__(self, path: Path, timeout: float = 30, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.dec = Decoder(1 << 31)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> Message:
        while (msg := self.dec.next()) is None:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("the engine hung up")
            self.dec.feed(data)
        return msg

    def hello(self) -> Message:
        with contextlib.suppress(BrokenPipeError):
            self.send(HELLO)
        return self.recv()

    def call(self, msg_id: int, method: str, **args: Any) -> Message:
        self.send(frame(msg_id, method, **args))
        while True:
            msg = self.recv()
            if msg.id == msg_id or (msg.type == MessageType.ERROR and msg.id == 0):
                return msg

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def result(msg: Message) -> Any:
    if msg.type == MessageType.ERROR:
        raise RuntimeError(str(msg.payload.get("error")))
    return msg.payload.get("r")


# -- the engine under attack ------------------------------------------------------------------

@dataclass
class Engine:
    tree: Path
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vt-h-",
                                                                     dir="/tmp")))
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.root / "run" / "control.sock"

    def start(self) -> None:
        desc = self.root / "backends.yaml"
        desc.write_text(yaml.safe_dump({"backends": [ECHO, HOSTILE]}))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
        self.env.update(VRAMTUI_RUNTIME_DIR=str(self.root / "run"),
                        VRAMTUI_STATE_DIR=str(self.root / "state"),
                        VRAMTUI_CONFIG_DIR=str(self.root / "cfg"),
                        PYTHONPATH=str(self.tree), COLUMNS="200")
        err = open(self.root / "serve.err", "ab")  # noqa: SIM115 - kept for the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vramtui", "--serve", "--gpus", "sim:8GiB",
             "--backends", str(desc)], env=self.env, stdout=err, stderr=err,
            stdin=subprocess.DEVNULL, cwd=self.tree, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.log()[-2000:]}")
            with contextlib.suppress(OSError, EOFError):
                raw = Raw(self.socket, timeout=2)
                ok = raw.hello().type == MessageType.ACKNOWLEDGEMENT
                raw.close()
                if ok:
                    return
            time.sleep(0.05)
        raise RuntimeError("serve did not answer within 60 s")

    def log(self) -> str:
        return (self.root / "serve.err").read_text(errors="replace")

    @property
    def rss(self) -> int:
        assert self.proc is not None
        try:
            return int(psutil.Process(self.proc.pid).memory_info().rss)
        except psutil.Error:
            return 0

    def kill(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        # workers live in their own sessions: kill what is left of ours
        for p in psutil.process_iter(["environ"]):
            with contextlib.suppress(psutil.Error, TypeError):
                if p.info["environ"] and p.info["environ"].get("VRAMTUI_SIM_DIR", "").startswith(
                        str(self.root)):
                    p.kill()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def submit_wait(self, backend: str, payload: bytes, timeout: float = 120,
                    **kw: Any) -> dict[str, Any]:
        raw = Raw(self.socket, timeout=timeout + 30)
        try:
            raw.hello()
            return result(raw.call(2, "submit", backend=backend, payload=payload, wait=True,
                                   wait_timeout=timeout, **kw))  # type: ignore[no-any-return]
        finally:
            raw.close()


class Peak:
    """The engine's RSS, sampled at 20 Hz while the attack runs."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.peak = engine, engine.rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.engine.rss)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)


def status_rtt(engine: Engine) -> str:
    """A fresh connection's hello + light snapshot, in seconds, or why it failed."""
    t0 = time.perf_counter()
    try:
        raw = Raw(engine.socket, timeout=5)
        try:
            if raw.hello().type != MessageType.ACKNOWLEDGEMENT:
                return "refused"
            msg = raw.call(2, "snapshot", light=True)
            if msg.type == MessageType.ERROR:
                return f"error: {str(msg.payload.get('error'))[:40]}"
        finally:
            raw.close()
    except (OSError, EOFError) as exc:
        return f"failed ({type(exc).__name__})"
    return f"{time.perf_counter() - t0:.3f} s"


def cli_status(engine: Engine) -> str:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vramtui", "status"], env=engine.env,
                          cwd=engine.tree, capture_output=True, timeout=60)
    took = time.perf_counter() - t0
    return f"{took:.2f} s" + ("" if done.returncode == 0 else f" (exit {done.returncode})")


def honest_jobs(engine: Engine, n: int = 5) -> int:
    """Submit ``n`` echo jobs while the attack goes on; how many did not succeed."""
    lost = 0
    for i in range(n):
        try:
            view = engine.submit_wait("echo", json.dumps({"n": i}).encode(), timeout=60)
            lost += view.get("state") != "succeeded"
        except (OSError, EOFError, RuntimeError):
            lost += 1
    return lost


# -- attacks ------------------------------------------------------------------------------------

@dataclass
class Row:
    attack: str
    before: int = 0
    peak: int = 0
    after: int = 0
    status: str = ""
    cli: str = ""
    lost: str = ""
    note: str = ""


Attack = Callable[[Engine, Row], None]
ATTACKS: dict[str, tuple[str, Attack]] = {}


def attack(name: str, title: str) -> Callable[[Attack], Attack]:
    def register(fn: Attack) -> Attack:
        ATTACKS[name] = (title, fn)
        return fn
    return register


def during(engine: Engine, row: Row, hold: float = 2.0) -> None:
    """What every attack measures while it holds: status, the CLI, honest jobs."""
    time.sleep(hold)
    row.status = status_rtt(engine)
    row.cli = cli_status(engine)
    row.lost = str(honest_jobs(engine))


@attack("pipeline", "pipelined snapshot requests, never read")
def pipeline(engine: Engine, row: Row) -> None:
    for _ in range(10):  # results a snapshot with data_limit=-1 carries
        engine.submit_wait("echo", b"r" * (512 * 1024))
    raw = Raw(engine.socket, rcvbuf=4096)
    raw.hello()
    burst = b"".join(frame(i, "snapshot", data_limit=-1) for i in range(1, 41))
    raw.send(burst)
    row.note = f"{len(burst)} bytes of requests"
    during(engine, row, 3.0)
    raw.close()


@attack("halfframes", "12 clients announce 64 MiB frames, send 1 KiB")
def halfframes(engine: Engine, row: Row) -> None:
    conns = []
    for _ in range(12):
        raw = Raw(engine.socket)
        raw.hello()
        raw.send(HEADER.pack(64 * MiB - 16, int(MessageType.REQUEST), 0, 0) + b"\x85"
                 + b"z" * 1023)
        conns.append(raw)
    during(engine, row, 3.0)
    for raw in conns:
        raw.close()


@attack("silent", "128 clients silent after hello")
def silent(engine: Engine, row: Row) -> None:
    conns = []
    for _ in range(128):
        with contextlib.suppress(OSError, EOFError):
            raw = Raw(engine.socket, timeout=5)
            raw.hello()
            conns.append(raw)
    during(engine, row, 1.0)
    for raw in conns:
        raw.close()


@attack("subscribers", "10 subscribers, 20 jobs with 4 MiB results")
def subscribers(engine: Engine, row: Row) -> None:
    got = [0] * 10
    subs = []

    def drain(i: int, raw: Raw) -> None:
        with contextlib.suppress(OSError, EOFError):
            while data := raw.sock.recv(1 << 20):
                got[i] += len(data)

    for i in range(10):
        raw = Raw(engine.socket, timeout=120)
        raw.hello()
        raw.send(frame(2, "subscribe"))
        threading.Thread(target=drain, args=(i, raw), daemon=True).start()
        subs.append(raw)
    for _ in range(20):
        engine.submit_wait("hostile", json.dumps({"data": 4 * MiB}).encode())
    during(engine, row, 0.5)
    row.note = f"subscribers received {sum(got) / MiB:.0f} MiB"
    for raw in subs:
        raw.close()


@attack("stream", "a worker streams 300 MiB in 64 KiB chunks")
def stream(engine: Engine, row: Row) -> None:
    view: dict[str, Any] = {}

    def run() -> None:
        with contextlib.suppress(Exception):
            view.update(engine.submit_wait(
                "hostile", json.dumps({"stream": 300 * MiB, "chunk": 65536}).encode(),
                stream=True, timeout=300))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    during(engine, row, 1.0)
    t.join(300)
    row.note = f"job {view.get('state')}: {str(view.get('error') or '')[:44]}"


@attack("logflood", "a worker writes 200 MiB to stderr")
def logflood(engine: Engine, row: Row) -> None:
    view: dict[str, Any] = {}

    def run() -> None:
        with contextlib.suppress(Exception):
            view.update(engine.submit_wait("hostile", json.dumps({"flood": 200 * MiB}).encode(),
                                           timeout=300))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    during(engine, row, 1.0)
    t.join(300)
    logs = engine.root / "state" / "logs"
    size = sum(f.stat().st_size for f in logs.glob("hostile.log*"))
    row.note = f"job {view.get('state')}; logs take {size / MiB:.0f} MiB of disk"


@attack("badvalues", "priority 2**63, NaN/negative timeouts")
def badvalues(engine: Engine, row: Row) -> None:
    raw = Raw(engine.socket)
    raw.hello()
    answers = []
    for i, kw in enumerate(({"priority": 2**63}, {"timeout": math.nan}, {"timeout": -1.0}), 2):
        msg = raw.call(i, "submit", backend="echo", payload=b"x", **kw)
        answers.append("refused" if msg.type == MessageType.ERROR else "ACCEPTED")
    raw.close()
    during(engine, row, 0.2)
    row.note = (f"{'/'.join(answers)}; tracebacks in the log: "
                f"{engine.log().count('Traceback')}")


@attack("unstorable", "a reply with status 2**64-1, then a restart")
def unstorable(engine: Engine, row: Row) -> None:
    view = engine.submit_wait("hostile", json.dumps({"status": 2**64 - 1}).encode())
    during(engine, row, 0.2)
    engine.kill()
    engine.start()
    raw = Raw(engine.socket)
    raw.hello()
    again = raw.call(2, "job", job=view["id"])
    raw.close()
    after = "unknown" if again.type == MessageType.ERROR else again.payload["r"]["state"]
    reran = "recovered" in engine.log().split("engine started")[-1]
    row.note = f"reported {view['state']}; after restart {after}{', re-run' if reran else ''}"


@attack("wal", "kill -9 after 50 submits, one byte of the WAL flipped")
def wal(engine: Engine, row: Row) -> None:
    raw = Raw(engine.socket)
    raw.hello()
    raw.call(2, "submit", backend="echo", payload=b"warm", wait=True)
    ids = [result(raw.call(i, "submit", backend="echo", payload=b"x", priority=-5,
                           timeout=3600.0)) for i in range(3, 53)]
    raw.close()
    engine.kill(signal.SIGKILL)
    walfile = engine.root / "state" / "journal.sqlite3-wal"
    data = bytearray(walfile.read_bytes())
    data[len(data) // 2] ^= 0xFF
    walfile.write_bytes(bytes(data))
    engine.start()
    during(engine, row, 0.2)
    raw = Raw(engine.socket)
    raw.hello()
    unknown = [i for n, i in enumerate(ids, 100)
               if raw.call(n, "job", job=i).type == MessageType.ERROR]
    raw.close()
    log = engine.log()
    listed = "".join(p.read_text() for p in (engine.root / "state").glob("*.lost.txt"))
    named = sum(i in log for i in unknown)
    kept = sum(i in listed for i in unknown)
    row.lost = f"{row.lost} (+{len(unknown)} of 50 acked)"
    row.note = (f"lost ids named: {named} in the log line, {kept} in the kept .lost.txt; "
                f"damaged files kept: {len(list((engine.root / 'state').glob('*.corrupt-*')))}")


# -- the table ---------------------------------------------------------------------------------

def run(name: str, tree: Path) -> Row:
    title, fn = ATTACKS[name]
    row = Row(f"{name}: {title}")
    engine = Engine(tree)
    try:
        engine.start()
        engine.submit_wait("echo", b"warm-up")
        row.before = engine.rss
        with Peak(engine) as peak:
            fn(engine, row)
            time.sleep(0.5)
            row.after = engine.rss
        row.peak = peak.peak
    except Exception as exc:  # noqa: BLE001 - a row says what broke
        row.note = f"{row.note} [harness: {type(exc).__name__}: {exc}]"[:120]
    finally:
        engine.cleanup()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the vramtui tree to attack")
    parser.add_argument("--only", help="comma-separated attack names: " + ", ".join(ATTACKS))
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(ATTACKS)
    print(f"tree {args.tree.resolve()}; RSS of the engine process; status = a fresh "
          "connection's hello + light snapshot during the attack; CLI = `vramtui status`")
    head = f"{'attack':<58} {'RSS before':>10} {'peak':>9} {'after':>9} {'status':>12} " \
           f"{'CLI':>9} {'lost':>6}  note"
    print(head)
    print("-" * len(head))
    for name in names:
        r = run(name, args.tree)
        print(f"{r.attack[:58]:<58} {r.before / MiB:>7.0f} MiB {r.peak / MiB:>5.0f} MiB "
              f"{r.after / MiB:>5.0f} MiB {r.status:>12} {r.cli:>9} {r.lost:>6}  {r.note}",
              flush=True)


if __name__ == "__main__":
    main()
