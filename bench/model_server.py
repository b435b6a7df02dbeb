"""Benchmark of model servers as backends: a server called directly vs through the engine.

For each server (``tests/model_server.py``, the llama-server look-alike; and a real
llama.cpp ``llama-server`` when one is found on PATH or given with ``--llama-server``, serving
a tiny random-weight GGUF — ``--model``, or one written by ``scripts/tiny_gguf.py``), in one
run, side by side:

- the median latency of a short request (a 1-token chat completion), on a kept-alive
  connection (``delta``: engine's median less direct's; ``paired``: the median of what each
  engine request took more than the direct one measured just before or after it, the
  steadier figure on a busy machine);
- the time to the first streamed chunk of a chat completion (llama-server closes its
  connection after a stream, so directly each stream has a fresh one, opened before the
  clock starts; the engine keeps its client's, as a pooled client uses it: a fresh
  connection to the engine costs another ~0.3-0.6 ms on a busy 2-core box, its accept on the
  engine's loop);
- streamed chunks (tokens) per second over a longer stream;
- the switch between two servers that cannot co-reside on the simulated GPU (A loaded, a
  request for B: B's cold start + A's exit), beside B's cold start and A's exit measured
  directly.

Beside them, the floor: ``bench/proxy_floor.py``, the least a Python proxy costs (aiohttp on
uvloop and httptools, as the engine's door uses, with no admission, job or check). What the floor
adds to a direct call is the hop itself on this machine; what the engine adds beyond the
floor (``over floor``) is the cost of being an engine: a job, admission, events, the
door's checks. On a busy or slow machine the hop alone can take most of a goal.

All sides call the same server process (the one the engine started, found with ``GET
/running``), request by request in turn, so a shared machine's changing load weighs on both
alike; the cold start and exit are of the server started alone first.  Through the engine
is ``vramtui --serve --http 127.0.0.1:0 --gpus sim:8GiB`` in a fresh /tmp
root. Run: ``.venv/bin/python bench/model_server.py [--n 40] [--llama-server PATH]``. Prints
a table; never run as a test.

A change's effect is smaller than the noise between two runs of this machine (0.3 ms):
``--against CHECKOUT`` (``git worktree add /tmp/before HEAD~1``) also runs that checkout's
engine, interleaved with the others in the same run, and prints what it takes more than this
one's, pair by pair (about 0.1 ms of noise at ``--n 400``).
"""

# ruff: noqa: E402  (the path is fixed before the imports: see below)
from __future__ import annotations

import os
import sys

# bench/http.py is beside this file: keep the folder off the path so `http` is the stdlib's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse
import contextlib
import http.client
import json
import random
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from vramtui.http_serve import front_door_url

ROOT = Path(__file__).resolve().parents[1]
TEST_SERVER = ROOT / "tests" / "model_server.py"
FLOOR = ROOT / "bench" / "proxy_floor.py"
VOCAB = "models/ggml-vocab-llama-spm.gguf"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(base: str, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None
                 ) -> float:
    """Seconds until ``base``/health answers 200."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode})")
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                conn.close()
                return time.monotonic() - t0
            conn.close()
        except OSError:
            pass
        time.sleep(0.01)
    raise SystemExit(f"{base} was not healthy within {timeout:g} s")


class Server:
    """One kind of server: how to start it on a port, and its requests."""

    def __init__(self, label: str, argv: Callable[[str], list[str]], tokens: int) -> None:
        self.label = label
        self.argv = argv  # port (or "${PORT}") -> command line
        self.tokens = tokens

    def short(self, model: str) -> bytes:
        return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 1, "temperature": 0}).encode()

    def streamed(self, model: str) -> bytes:
        return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": self.tokens, "temperature": 0, "stream": True}).encode()


def _conn(base: str) -> http.client.HTTPConnection:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=120)


def post(conn: http.client.HTTPConnection, body: bytes) -> bytes:
    conn.request("POST", "/v1/chat/completions", body=body,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise SystemExit(f"HTTP {resp.status}: {data[:300]!r}")
    return data


class Side:
    """One way of calling a server (directly, or through the engine) and what it measured."""

    def __init__(self, base: str, model: str, server: Server, *,
                 keeps_streams: bool = False) -> None:
        self.base = base
        self.model = model
        self.server = server
        self.keeps_streams = keeps_streams  # a streamed answer leaves its connection open
        self.conn = _conn(base)
        self.stream_conn: http.client.HTTPConnection | None = None
        self.lat: list[float] = []
        self.ttft: list[float] = []
        self.rates: list[float] = []

    def short(self, keep: bool = True) -> None:
        t0 = time.perf_counter()
        post(self.conn, self.server.short(self.model))
        if keep:
            self.lat.append(time.perf_counter() - t0)

    def stream(self) -> None:
        # llama-server closes a connection after a stream: a fresh one each (opened before
        # the clock starts, so only the request is timed). The engine keeps it, and a
        # client's pool (httpx's, the openai client's) uses it again: so does this one.
        conn = self.stream_conn or _conn(self.base)
        if conn.sock is None:
            conn.connect()
        self.stream_conn = None
        try:
            conn.request("POST", "/v1/chat/completions", body=self.server.streamed(self.model),
                         headers={"Content-Type": "application/json"})
            t0 = time.perf_counter()
            resp = conn.getresponse()
            first = last = None
            chunks = 0
            while True:
                line = resp.readline()
                if not line:
                    break
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    chunks += 1
            resp.read()
            if self.keeps_streams and not resp.will_close:
                self.stream_conn, conn = conn, None
        finally:
            if conn is not None:
                conn.close()
        if first is not None:
            self.ttft.append(first - t0)
            if last is not None and last - first > 0.001 and chunks > 1:
                self.rates.append((chunks - 1) / (last - first))

    def figures(self) -> dict[str, float]:
        """Median short-request latency, median time to first chunk, chunks per second."""
        self.conn.close()
        if self.stream_conn is not None:
            self.stream_conn.close()
        return {"latency_ms": statistics.median(self.lat) * 1000,
                "ttft_ms": statistics.median(self.ttft) * 1000,
                "tokens_s": statistics.median(self.rates) if self.rates else float("nan")}


def paired(a: list[float], b: list[float]) -> float:
    """The median of ``b[i] - a[i]``, each pair measured back to back: what one side adds
    to the other, with the load both saw at that moment taken out."""
    return statistics.median(y - x for x, y in zip(a, b, strict=False)) if a and b \
        else float("nan")


def measure(sides: list[Side], n: int) -> list[dict[str, float]]:
    """Every side measured request by request in turn, so a machine that gets busier or
    quieter during the run weighs on all alike; the order of each round shuffled (a fixed
    seed): a side that runs right after itself (the last of a round, first of the next, as
    when each round reversed the last) or after a process of the same code finds its caches
    warm, 0.2 ms faster here. Each later side's figures also say what it adds to the
    first's, pair by pair (``*_added``)."""
    order = random.Random(28)
    for side in sides:
        for _ in range(3):
            side.short(keep=False)  # warm up
    for _ in range(n):
        for side in order.sample(sides, len(sides)):
            side.short()
    for _ in range(max(10, n // 2)):
        for side in order.sample(sides, len(sides)):
            side.stream()
    figures = [side.figures() for side in sides]
    first = sides[0]
    for side, fig in zip(sides[1:], figures[1:], strict=True):
        fig["latency_ms_added"] = paired(first.lat, side.lat) * 1000
        fig["ttft_ms_added"] = paired(first.ttft, side.ttft) * 1000
    return figures


def start_direct(server: Server) -> tuple[subprocess.Popen[bytes], str, float]:
    """The server itself, started alone; with its cold start."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(server.argv(str(port)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        return proc, base, wait_healthy(base, proc=proc)
    except BaseException:
        stop_direct(proc)
        raise


def stop_direct(proc: subprocess.Popen[bytes]) -> float:
    """Its exit (SIGTERM), in seconds."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)
    return time.monotonic() - t0


def serve(root: Path, backends: list[dict[str, Any]], tree: Path = ROOT
            ) -> tuple[subprocess.Popen[bytes], str]:
    """``vramtui --serve`` of the checkout ``tree`` (its code: run from it, on this venv)."""
    desc = root / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": backends}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"), PYTHONPATH=str(tree))
    out = root / "serve.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vramtui", "--serve", "--gpus", "sim:8GiB",
                                 "--backends", str(desc), "--http", "127.0.0.1:0"],
                                env=env, stdout=f, stderr=subprocess.DEVNULL,
                                start_new_session=True, cwd=tree)
    deadline = time.monotonic() + 60
    while (url := front_door_url(out.read_text(errors="replace"))) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("vramtui --serve --http did not start")
        time.sleep(0.05)
    return proc, url


def descriptor(name: str, server: Server) -> dict[str, Any]:
    # 5 GiB each on an 8 GiB simulated GPU: the two can never be loaded together.
    return {"name": name, "command": server.argv("${PORT}"), "http": {"health": "/health"},
            "api": ["chat"], "vram": {"weights": "5000MiB", "activation": "0MiB"},
            "safety": "0MiB", "concurrency": 4, "keep_alive": "forever",
            "timeouts": {"start": "60s", "stop_grace": "10s"}}


def own_server(base: str, model: str) -> str:
    """The base URL of the server the engine runs for ``model`` (llama-swap's ``/running``)."""
    conn = _conn(base)
    try:
        conn.request("GET", "/running")
        running = json.loads(conn.getresponse().read())["running"]
    finally:
        conn.close()
    return str(next(r["proxy"] for r in running if r["model"] == model))


def start_floor(upstream: str) -> tuple[subprocess.Popen[bytes], str]:
    """``bench/proxy_floor.py`` in front of ``upstream``, once it accepts connections."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FLOOR), upstream.rsplit(":", 1)[1],
                             str(port)], stdout=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    stop_direct(proc)
                raise SystemExit("bench/proxy_floor.py did not start") from None
            time.sleep(0.02)


def side_by_side(server: Server, n: int, switches: int, against: Path | None = None
                 ) -> tuple[list[dict[str, float]], float, float, float]:
    """The server's cold start and exit on its own; then the engine's own server called
    directly, through the floor proxy and through the engine (and the engine of the checkout
    ``against``, with a server of its own), interleaved; then the switch through the
    engine."""
    alone, _base, cold = start_direct(server)
    exit_s = stop_direct(alone)
    root = Path(tempfile.mkdtemp(prefix="vt-bench-ms-", dir="/tmp"))
    proc, base = serve(root, [descriptor("a", server), descriptor("b", server)])
    floor: subprocess.Popen[bytes] | None = None
    other: subprocess.Popen[bytes] | None = None
    third: subprocess.Popen[bytes] | None = None
    other_root: Path | None = None
    try:
        post(_conn(base), server.short("a"))  # loads a
        upstream = own_server(base, "a")
        if against is not None:
            # Each engine with a server of its own, and direct and the floor a third: a
            # server that also answers the other sides is warmer, its engine 0.1-0.2 ms
            # faster than one beside a server of its own (an A/A run).
            third, upstream, _cold = start_direct(server)
        floor, floor_base = start_floor(upstream)
        sides = [Side(upstream, "m", server), Side(floor_base, "m", server, keeps_streams=True),
                 Side(base, "a", server, keeps_streams=True)]
        if against is not None:
            other_root = Path(tempfile.mkdtemp(prefix="vt-bench-ms-", dir="/tmp"))
            other, other_base = serve(other_root, [descriptor("a", server)], against)
            post(_conn(other_base), server.short("a"))
            sides.append(Side(other_base, "a", server, keeps_streams=True))
        figures = measure(sides, n)
        if against is not None:  # (what the other tree's engine takes more than this one's)
            figures[3]["latency_ms_vs"] = paired(sides[2].lat, sides[3].lat) * 1000
            figures[3]["ttft_ms_vs"] = paired(sides[2].ttft, sides[3].ttft) * 1000
            os.killpg(other.pid, signal.SIGTERM)  # type: ignore[union-attr]
            other.wait(60)  # type: ignore[union-attr]
            other = None
        stop_direct(floor)
        floor = None
        times = []
        for i in range(switches):
            model = "b" if i % 2 == 0 else "a"
            conn = _conn(base)
            conn.connect()
            t0 = time.perf_counter()
            post(conn, server.short(model))  # the other one is loaded: a switch
            times.append(time.perf_counter() - t0)
            conn.close()
    finally:
        if floor is not None:
            stop_direct(floor)
        if third is not None:
            stop_direct(third)
        for engine in (proc, other):
            if engine is not None:
                os.killpg(engine.pid, signal.SIGTERM)
                engine.wait(60)
        for folder in (root, other_root):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
    return figures, cold, exit_s, statistics.median(times)


def llama(path: str, model: str) -> Server:
    # One thread: its spinning threads would otherwise take both cores of a small machine
    # from whatever relays its answer (the engine, or the client).
    return Server("llama-server", lambda port: [
        path, "-m", model, "--host", "127.0.0.1", "--port", port, "-np", "4", "-c", "2048",
        "-t", "1", "--no-warmup"], tokens=128)


def find_model(args: argparse.Namespace) -> str:
    if args.model:
        return str(args.model)
    out = Path(tempfile.gettempdir()) / "vramtui-tiny.gguf"
    if not out.exists():
        vocab = Path(args.vocab) if args.vocab else Path("/tmp/llama-build").glob(
            f"llama_cpp_python-*/vendor/llama.cpp/{VOCAB}").__next__()
        subprocess.run([sys.executable, str(ROOT / "scripts" / "tiny_gguf.py"), str(vocab),
                        str(out)], check=True, stdout=subprocess.DEVNULL)
    return str(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40, help="short requests per side")
    parser.add_argument("--switches", type=int, default=4)
    parser.add_argument("--llama-server", default=shutil.which("llama-server"))
    parser.add_argument("--model", help="a GGUF for llama-server (default: a tiny random one)")
    parser.add_argument("--vocab", help="a vocab-only GGUF for the tiny model")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="also measure the engine of another checkout of vramtui (a git "
                        "worktree of the code before a change), interleaved in the same run, "
                        "and print what it takes more than this one, pair by pair")
    args = parser.parse_args()
    servers = [Server("test server", lambda port: [
        sys.executable, str(TEST_SERVER), "--port", port, "--tokens", "64", "--load-s", "0.2",
        "--token-s", "0.0005"],
        tokens=64)]
    if args.llama_server:
        # absolute: the engine reads a descriptor's relative command from the descriptor's
        # own folder (a temporary one here), and would refuse both backends; a bare name is
        # a program on PATH
        program = (args.llama_server if "/" in args.llama_server
                   else shutil.which(args.llama_server) or args.llama_server)
        servers.append(llama(os.path.abspath(program), os.path.abspath(find_model(args))))
    rows = []
    for server in servers:
        figures, cold, exit_s, switch = side_by_side(server, args.n, args.switches,
                                                     args.against)
        rows.append((server.label, figures, cold, exit_s, switch))
    print(f"{'server':<14} {'measure':<24} {'direct':>9} {'floor':>9} {'engine':>9} "
          f"{'floor +':>9} {'engine +':>9} {'over floor':>10}")
    for label, (d, f, e, *others), cold, exit_s, switch in rows:
        for key, what in (("latency_ms", "short request (median)"),
                          ("ttft_ms", "time to first chunk")):
            hop, added = f[f"{key}_added"], e[f"{key}_added"]
            print(f"{label:<14} {what:<24} {d[key]:>7.2f}ms {f[key]:>7.2f}ms "
                  f"{e[key]:>7.2f}ms {hop:>+7.2f}ms {added:>+7.2f}ms {added - hop:>+8.2f}ms")
            for o in others:  # (--against)
                print(f"{'':<14} {'  ' + str(args.against)[-22:]:<24} {'':>9} {'':>9} "
                      f"{o[key]:>7.2f}ms {'':>9} {o[f'{key}_added']:>+7.2f}ms "
                      f"{o[f'{key}_vs']:>+8.2f}ms vs this")
        print(f"{label:<14} {'streamed chunks/s':<24} {d['tokens_s']:>7.0f}/s "
              f"{f['tokens_s']:>7.0f}/s {e['tokens_s']:>7.0f}/s "
              f"{f['tokens_s'] / d['tokens_s'] * 100:>8.0f}% "
              f"{e['tokens_s'] / d['tokens_s'] * 100:>8.0f}%")
        budget = cold + exit_s + 0.3
        print(f"{label:<14} {'switch A->B (median)':<24} {cold + exit_s:>7.2f}s  "
              f"{'':>9} {switch:>7.2f}s   goal <= {budget:.2f}s (B cold {cold:.2f}s + A "
              f"exit {exit_s:.2f}s + 0.3s)")
    print("floor +, engine +: the median of what each request took more than the direct "
          "one beside it; over floor: engine + less floor +")
    if args.against is not None:
        print(f"{args.against}: its engine (and its own server), measured in turn with the "
              "others; 'vs this': what it took more than this checkout's engine, pair by pair "
              "(noise here: about 0.1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
