"""Benchmark: a small request through Dynamo to a worker, directly and through the engine.

Not a test. Run: ``.venv/bin/python bench/dynamo.py [--n 1000]`` (needs the ``dynamo`` extra).
Everything runs on this host with file discovery and the TCP request plane in a temporary
directory (no etcd, no NATS).  The cases are measured in interleaved rounds (``--round``
requests of each case in turn, until every case has ``--n``, after ``--warmup`` unmeasured
ones each), so that the noise of a shared machine falls on all of them alike; each is a whole
round trip (send, every response item received), timed with ``time.perf_counter`` from an
asyncio Dynamo client in this process.

The main table, one column per path, the same job on each:

- direct worker: ``python -m worker_sdk.dynamo examples/echo/main.py`` (raw type): Dynamo's
  client and TCP request plane, then the worker's thread hop to its predict thread;
- engine bridge: ``vramtui --serve --dynamo benchengine`` (simulated GPU, as served) with the
  same echo example as its backend ``echo``: each request is an engine job (submit, queue,
  the scheduler's decision, dispatch to the hot worker over its socket, result, the job's
  future back to the bridge; a Dynamo job is not journaled, its caller goes with the engine);
- control socket: the same job on that engine without Dynamo, ``submit_wait`` on its control
  socket (``supervisor.client.Client``), journaled: what the engine itself costs.

It also gives the CPU time the serving side spent per request (every thread of the direct
worker's process; of the engine's process and its worker's), read from ``/proc/*/schedstat``
around each round: unlike latency, it hardly moves with the machine's load.

Rows: a 16-byte request with one reply item; ``{"stream": 10}``, ten streamed chunks (not on
the control socket, whose submit_wait answers once).  Below it, the bridge's overhead over the
direct worker (median and p90) against the bar of issue 16 (within 0.5 ms), then other cases:
bare-dynamo (a plain Dynamo async-generator handler: the floor), the embedding example, the
engine's ``NS.B.status`` endpoint, and the blocking client ``worker_sdk.dynamo.client.Client``.

Dynamo 1.6.1 prints one INFO line per client request (the ``request_span`` target ignores
``DYN_LOG``), so this process's stderr goes to a log file in the temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from bench.timing import percentile  # noqa: E402
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


Call = Callable[[], Awaitable[int]]


def _cpu_ns(root: int) -> int:
    """CPU time (ns, every thread) of process ``root`` and its descendants, from schedstat."""
    import psutil

    try:
        procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for proc in procs:
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{proc.pid}/task"):
                with contextlib.suppress(OSError), open(
                        f"/proc/{proc.pid}/task/{task}/schedstat") as fh:
                    total += int(fh.read().split()[0])
    return total


async def _interleaved(cases: dict[str, Call], n: int, warmup: int, per_round: int,
                       servers: dict[str, int]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """``n`` timed calls of every case, ``per_round`` of each in turn; and the CPU time its
    serving processes (``servers``: case -> root pid) spent on them."""
    for call in cases.values():
        for _ in range(warmup):
            await call()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, int] = dict.fromkeys(servers, 0)
    while any(len(s) < n for s in samples.values()):
        for name, call in cases.items():
            server = servers.get(name)
            before = _cpu_ns(server) if server else 0
            for _ in range(min(per_round, n - len(samples[name]))):
                start = time.perf_counter()
                await call()
                samples[name].append(time.perf_counter() - start)
            if server:
                cpu[name] += _cpu_ns(server) - before
    return samples, cpu


async def _run(directory: str, n: int, warmup: int, per_round: int, pids: dict[str, int]
               ) -> tuple[dict[str, list[float]], dict[str, int]]:
    from supervisor.client import Client as ControlClient
    from supervisor.paths import Paths
    from worker_sdk.dynamo.client import Client as BlockingClient

    dyn = import_dynamo()
    runtime = dyn.DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")

    async def client_for(endpoint: str) -> Any:
        client = await runtime.endpoint(endpoint).client()
        await asyncio.wait_for(client.wait_for_instances(), 60)
        return client

    def dynamo_call(client: Any, request: Any, items: int) -> Call:
        async def call() -> int:
            count = 0
            async for _item in await client.generate(request, annotated=False):
                count += 1
            if count != items:
                raise SystemExit(f"expected {items} item(s), got {count}")
            return count

        return call

    control = ControlClient(Paths.from_env(_engine_env(directory)).control_socket)
    blocking = BlockingClient("bench.echo.generate",
                              discovery_dir=os.environ["DYN_FILE_KV"])
    blocking.wait_for_instances(timeout=60)

    async def control_call() -> int:
        view = control.submit_wait("echo", SMALL)
        if view.data != SMALL:
            raise SystemExit(f"the control socket answered {view.data!r}")
        return 1

    async def blocking_call() -> int:
        return len(blocking.call(SMALL))

    echo, engine = await client_for("bench.echo.generate"), await client_for(
        "benchengine.echo.generate")
    cases = {
        "direct": dynamo_call(echo, SMALL, 1),
        "bridge": dynamo_call(engine, SMALL, 1),
        "control": control_call,
        "direct-stream": dynamo_call(echo, STREAM, 10),
        "bridge-stream": dynamo_call(engine, STREAM, 10),
        "bare-dynamo": dynamo_call(await client_for("bench.bare.generate"), SMALL, 1),
        "embedding": dynamo_call(await client_for("bench.embed.generate"),
                                 {"input": "hello", "dimensions": 8}, 1),
        "engine-status": dynamo_call(await client_for("benchengine.echo.status"), None, 1),
        "sync-client": blocking_call,
    }
    servers = {"direct": pids["direct"], "bridge": pids["engine"], "control": pids["engine"]}
    try:
        return await _interleaved(cases, n, warmup, per_round, servers)
    finally:
        control.close()
        blocking.close()
        runtime.shutdown()


SMALL = b"0123456789abcdef"
STREAM = {"stream": 10}


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


def _ms(samples: list[float] | None, q: float) -> str:
    if not samples:
        return "—"
    return f"{(statistics.median(samples) if q == 0.5 else percentile(samples, q)) * 1e3:.3f}"


def _report(results: dict[str, list[float]], cpu: dict[str, int], n: int, per_round: int,
            directory: str) -> None:
    print(f"Dynamo {_dynamo_version()}, file discovery + TCP, one host; {n} sequential requests "
          f"per case, interleaved {per_round} at a time (logs: {directory})")
    print()
    head = f"{'':<24}{'direct worker':>20}{'engine bridge':>20}{'control socket':>20}"
    print(head)
    print(f"{'ms':<24}" + f"{'median':>11}{'p90':>9}" * 3)
    rows = (("16 B request, 1 reply", "direct", "bridge", "control"),
            ("stream of 10 chunks", "direct-stream", "bridge-stream", None))
    for label, *keys in rows:
        line = f"{label:<24}"
        for key in keys:
            samples = results.get(key) if key else None
            line += f"{_ms(samples, 0.5):>11}{_ms(samples, 0.9):>9}"
        print(line)
    line = f"{'server CPU per request':<24}"
    for key in ("direct", "bridge", "control"):
        line += f"{cpu[key] / len(results[key]) / 1e6:>11.3f}{'':>9}"
    print(line + "   (ms, all threads of the serving processes)")
    print()
    for label, direct, bridge in (("16 B request", "direct", "bridge"),
                                  ("stream of 10", "direct-stream", "bridge-stream")):
        over = statistics.median(results[bridge]) - statistics.median(results[direct])
        over90 = percentile(results[bridge], 0.9) - percentile(results[direct], 0.9)
        verdict = "met" if over <= 0.0005 else "NOT met"
        print(f"bridge over direct, {label}: {over * 1e3:+.3f} ms median, {over90 * 1e3:+.3f} ms "
              f"p90 (bar: within 0.5 ms at the median: {verdict})")
    print()
    print(f"{'other cases':<24}{'median':>11}{'p90':>9}{'p99':>9}")
    for key, label in (("bare-dynamo", "bare Dynamo handler"),
                       ("embedding", "direct, embedding type"),
                       ("engine-status", "engine NS.B.status"),
                       ("sync-client", "direct, blocking Client")):
        samples = results[key]
        print(f"{label:<24}{_ms(samples, 0.5):>11}{_ms(samples, 0.9):>9}{_ms(samples, 0.99):>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="measured requests per case")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured requests first")
    parser.add_argument("--round", type=int, default=50, dest="per_round",
                        help="requests of one case before the next case's (default 50)")
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
        pids = {"direct": workers[1].pid, "engine": workers[3].pid}
        results, cpu = asyncio.run(_run(directory, args.n, args.warmup, args.per_round, pids))
    except BaseException:
        os.dup2(saved_stderr, 2)  # the reason is shown; Dynamo's shutdown chatter is not
        raise
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    _report(results, cpu, args.n, args.per_round, directory)
    stale = [p for p in Path(discovery).rglob("*") if p.is_file()]
    print(f"discovery entries left after SIGTERM: {len(stale)}")


def _dynamo_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ai-dynamo-runtime")
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
