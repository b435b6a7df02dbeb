"""Benchmark: round trip of a small request through a Dynamo client to a worker.

Not a test. Run: ``.venv/bin/python bench/dynamo.py [--n 1000]`` (needs the ``dynamo`` extra).
Everything runs on this host with file discovery and the TCP request plane in a temporary
directory (no etcd, no NATS). Each case sends ``--n`` requests one after another (after
``--warmup`` unmeasured ones) from an asyncio Dynamo client in this process and prints the
median, p90 and p99 wall time of a whole round trip (send, every response item received) and
the sequential rate, measured with ``time.perf_counter``.

Cases:
- bare-dynamo: a plain Dynamo async-generator handler echoing the request, no worker_sdk: the
  floor that Dynamo's client, TCP request plane and msgpack codec set;
- raw-bytes: ``python -m worker_sdk.dynamo examples/echo/main.py`` (raw type), 16 bytes in,
  one reply item out; the difference to bare-dynamo is the bridge (thread hop to the predict
  thread, request context, shaping);
- raw-stream-10: the same worker, ``{"stream": 10}``: ten streamed chunks per request;
- embedding: ``examples/dynamo/main.py --type embedding``, one 8-float vector in the OpenAI
  embedding shape;
- raw-bytes-sync-client: raw-bytes through ``worker_sdk.dynamo.client.Client``, the blocking
  client (its background-thread hop included).

Through the engine: ``vramtui --serve --dynamo benchengine`` (simulated GPU, the journal on, as
served) with the echo example as its backend ``echo``; each request is an engine job (submit
through the facade, journal, queue, scheduler step, dispatch to the hot worker over its socket,
result, journal, event back to the bridge):
- engine-raw-bytes, engine-raw-stream-10: the raw-bytes and raw-stream-10 requests sent to
  ``benchengine.echo.generate``;
- engine-status: ``benchengine.echo.status`` (a snapshot of the engine, no job);
- engine-control-socket: the same 16-byte job without Dynamo, ``submit_wait`` on the engine's
  control socket (``supervisor.client.Client``): what the engine itself costs.

Dynamo 1.6.1 prints one INFO line per client request (the ``request_span`` target ignores
``DYN_LOG``), so this process's stderr goes to a log file in the temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# ``python bench/dynamo.py`` puts bench/ first on sys.path, where this very file would shadow
# the ``dynamo`` package: drop it, and put the project root there instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

from worker_sdk.dynamo import apply_discovery_dir, import_dynamo  # noqa: E402


def _bare_server(endpoint: str) -> None:
    """The bare-dynamo worker: an echo handler straight on Dynamo (run in a child process)."""
    dyn = import_dynamo()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        runtime = dyn.DistributedRuntime(loop, "file", "tcp")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runtime.shutdown)

        async def handler(request: Any, context: Any) -> Any:
            yield request

        await runtime.endpoint(endpoint).serve_endpoint(handler)

    asyncio.run(main())


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with open(log, "wb") as fh:
        return subprocess.Popen(
            [sys.executable, *args], stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _measure(
    call: Callable[[], Awaitable[int]], n: int, warmup: int
) -> tuple[list[float], int]:
    items = 0
    for _ in range(warmup):
        items = await call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples, items


async def _run(directory: str, n: int, warmup: int) -> list[tuple[str, int, list[float]]]:
    dyn = import_dynamo()
    runtime = dyn.DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    results: list[tuple[str, int, list[float]]] = []

    async def client_for(endpoint: str) -> Any:
        client = await runtime.endpoint(endpoint).client()
        await asyncio.wait_for(client.wait_for_instances(), 60)
        return client

    def caller(client: Any, request: Any) -> Callable[[], Awaitable[int]]:
        async def call() -> int:
            count = 0
            async for _item in await client.generate(request, annotated=False):
                count += 1
            return count

        return call

    cases = [
        ("bare-dynamo", "bench.bare.generate", b"0123456789abcdef"),
        ("raw-bytes", "bench.echo.generate", b"0123456789abcdef"),
        ("raw-stream-10", "bench.echo.generate", {"stream": 10}),
        ("embedding", "bench.embed.generate", {"input": "hello", "dimensions": 8}),
        ("engine-raw-bytes", "benchengine.echo.generate", b"0123456789abcdef"),
        ("engine-raw-stream-10", "benchengine.echo.generate", {"stream": 10}),
        ("engine-status", "benchengine.echo.status", None),
    ]
    for name, endpoint, request in cases:
        client = await client_for(endpoint)
        samples, items = await _measure(caller(client, request), n, warmup)
        results.append((name, items, samples))
    runtime.shutdown()
    return results


def _sync_client_case(directory: str, n: int, warmup: int) -> tuple[str, int, list[float]]:
    from worker_sdk.dynamo.client import Client

    with Client("bench.echo.generate", discovery_dir=directory) as client:
        client.wait_for_instances(timeout=60)
        items = 0
        for _ in range(warmup):
            items = len(client.call(b"0123456789abcdef"))
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            client.call(b"0123456789abcdef")
            samples.append(time.perf_counter() - start)
    return "raw-bytes-sync-client", items, samples


ENGINE_BACKENDS = """\
backends:
  - name: echo
    script: {script}
    vram: {{weights: 0MiB, activation: 16MiB}}
"""


def _engine_env(directory: str) -> dict[str, str]:
    """The environment of the served engine: its own config, state and runtime directories."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=os.path.join(directory, "run"),
               VRAMTUI_STATE_DIR=os.path.join(directory, "state"),
               VRAMTUI_CONFIG_DIR=os.path.join(directory, "cfg"))
    return env


def _start_engine(directory: str) -> subprocess.Popen[bytes]:
    """``vramtui --serve --dynamo benchengine`` on a simulated GPU, once its socket answers."""
    from supervisor.client import Client as ControlClient
    from supervisor.control.errors import EngineNotRunning
    from supervisor.paths import Paths

    descriptor = Path(directory, "backends.yaml")
    descriptor.write_text(ENGINE_BACKENDS.format(script=ROOT / "examples" / "echo" / "main.py"))
    env = _engine_env(directory)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with open(Path(directory, "engine.log"), "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vramtui", "--serve", "--gpus", "sim:8GiB", "--backends",
             str(descriptor), "--dynamo", "benchengine"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )
    socket_path = Paths.from_env(env).control_socket
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"vramtui --serve exited with {proc.returncode}; see {directory}")
        try:
            ControlClient(socket_path).close()
            return proc
        except EngineNotRunning:
            if time.monotonic() > deadline:
                raise SystemExit("vramtui --serve did not answer within 60 s") from None
            time.sleep(0.05)


def _control_socket_case(directory: str, n: int, warmup: int) -> tuple[str, int, list[float]]:
    from supervisor.client import Client as ControlClient
    from supervisor.paths import Paths

    client = ControlClient(Paths.from_env(_engine_env(directory)).control_socket)
    try:
        for _ in range(warmup):
            client.submit_wait("echo", b"0123456789abcdef")
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            client.submit_wait("echo", b"0123456789abcdef")
            samples.append(time.perf_counter() - start)
    finally:
        client.close()
    return "engine-control-socket", 1, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="measured requests per case")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured requests first")
    parser.add_argument("--bare-server", metavar="ENDPOINT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        _bare_server(args.bare_server)
        return
    directory = tempfile.mkdtemp(prefix="vt-dynbench-")
    apply_discovery_dir(os.path.join(directory, "discovery"))
    os.environ.setdefault("DYN_LOG", "warn")
    discovery = os.environ["DYN_FILE_KV"]
    workers = [
        _spawn([str(Path(__file__).resolve()), "--bare-server", "bench.bare.generate"],
               Path(directory, "bare.log")),
        _spawn(["-m", "worker_sdk.dynamo", "examples/echo/main.py", "--endpoint",
                "bench.echo.generate", "--discovery-dir", discovery], Path(directory, "echo.log")),
        _spawn(["-m", "worker_sdk.dynamo", "examples/dynamo/main.py", "--endpoint",
                "bench.embed.generate", "--type", "embedding", "--discovery-dir", discovery],
               Path(directory, "embed.log")),
    ]
    log_path = Path(directory, "client.log")
    saved_stderr = os.dup(2)
    try:
        workers.append(_start_engine(directory))
        with open(log_path, "wb") as log:
            os.dup2(log.fileno(), 2)
        results = asyncio.run(_run(discovery, args.n, args.warmup))
        results.append(_sync_client_case(discovery, args.n, args.warmup))
        results.append(_control_socket_case(directory, args.n, args.warmup))
    finally:
        os.dup2(saved_stderr, 2)
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"Dynamo {_dynamo_version()} round trips, file discovery + TCP, one host, "
          f"{args.n} sequential requests per case (logs: {directory})")
    print(f"{'case':<24}{'items':>6}{'median ms':>11}{'p90 ms':>9}{'p99 ms':>9}{'req/s':>8}")
    for name, items, samples in results:
        median = statistics.median(samples)
        print(
            f"{name:<24}{items:>6}{median * 1e3:>11.3f}{_percentile(samples, 0.9) * 1e3:>9.3f}"
            f"{_percentile(samples, 0.99) * 1e3:>9.3f}{len(samples) / sum(samples):>8.0f}"
        )
    leftover = list(Path(discovery).rglob("*"))
    stale = [p for p in leftover if p.is_file()]
    print(f"discovery entries left after SIGTERM: {len(stale)}")


def _dynamo_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai-dynamo-runtime")
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
