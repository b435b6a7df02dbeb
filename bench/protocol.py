"""Round-trip latency and throughput of our worker SDK against the verda-io 0.4.4 worker.

Run: ``.venv/bin/python bench/protocol.py [--small N] [--large N] [--rounds R] [--no-info]``.

One :class:`worker_sdk.testing.WireServer` (advertising our extensions) serves: our worker
(negotiated mode: request envelopes, no per-request status events), the unmodified verda-io
worker with its logging lowered to WARNING (bench/workers/verda_quiet.py), and the verda-io
worker with its default INFO logging (written to a file, as a supervisor would).  For
reference, our worker is also measured under a second WireServer that advertises no
extensions (plain verda-io behaviour, with busy/ready status events around every request).

Each worker echoes sequential requests of 100 B and 1 MiB payloads after a warm-up.  The
workers run side by side and are measured in interleaved rounds, so that load from elsewhere
on the machine falls on all of them alike.  Latency is the client's wall time from sending a
request to holding the whole reply (the same blocking WireServer client for every worker).
MB/s is the payload size (sent each way) divided by the median latency; req/s is requests
completed per second of measuring; worker CPU is the worker process's user+system time per
request (10 ms clock ticks, so it is coarse for short runs).

Set PYTHONPATH to another copy of worker_sdk to bench that copy (its path comes first).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from worker_sdk.testing import WireServer, WorkerLink

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKERS = HERE / "workers"
BASELINE = "verda-io 0.4.4 (WARNING)"
BARE = "bare loop"


@dataclass
class Contender:
    label: str
    command: list[str]  # argv before the socket flags
    plain_server: bool = False
    proc: subprocess.Popen[bytes] | None = None
    link: WorkerLink | None = None


@dataclass
class Series:
    """The samples of one contender at one payload size."""

    samples: list[float] = field(default_factory=list)  # µs
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@dataclass
class Result:
    label: str
    size: int
    n: int
    median_us: float
    p99_us: float
    req_per_s: float
    mb_per_s: float
    cpu_us: float


def contenders(include_info: bool) -> list[Contender]:
    py = sys.executable
    ours = [py, "-m", "worker_sdk", str(WORKERS / "echo_ours.py")]
    out = [
        Contender("ours", ours),
        Contender(BASELINE, [py, str(WORKERS / "verda_quiet.py"), str(WORKERS / "echo_verda.py")]),
    ]
    if include_info:
        out.append(Contender("verda-io 0.4.4 (INFO)",
                             [py, "-m", "verda_io", str(WORKERS / "echo_verda.py")]))
    out.append(Contender(BARE, [py, str(WORKERS / "bare_loop.py")]))
    out.append(Contender("ours, plain server", ours, plain_server=True))
    return out


def start(c: Contender, server: WireServer, name: str, log_dir: Path) -> None:
    env = dict(os.environ)
    # The caller's PYTHONPATH first (to bench another copy of worker_sdk), then this checkout.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
    with open(log_dir / f"{name}.log", "wb") as log:
        c.proc = subprocess.Popen(
            [*c.command, "--control-socket", server.control_path,
             "--data-socket", server.data_path, "--name", name],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
        )
    c.link = server.wait_worker(name, timeout=30)


def stop(c: Contender) -> None:
    if c.proc is not None and c.proc.poll() is None:
        c.proc.terminate()
        try:
            c.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def cpu_seconds(proc: psutil.Process) -> float:
    """On-CPU time of every thread of ``proc`` (user + kernel), in seconds.

    Read from /proc/PID/task/*/schedstat (nanoseconds) where it exists; psutil's user+system
    times (10 ms ticks) elsewhere.
    """
    total = 0
    try:
        for task in os.listdir(f"/proc/{proc.pid}/task"):
            with open(f"/proc/{proc.pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, ValueError, IndexError):
        times = proc.cpu_times()
        return times.user + times.system


def warm_up(c: Contender, payload: bytes, n: int) -> None:
    assert c.link is not None
    for _ in range(n):
        reply = c.link.request(payload, timeout=30)
        if reply.data != payload:
            raise RuntimeError(f"{c.label}: echo mismatch ({reply.kind}, {len(reply.data)} B)")


def block(c: Contender, payload: bytes, n: int, series: Series) -> None:
    """``n`` timed sequential requests, added to ``series``."""
    assert c.link is not None and c.proc is not None
    link, size, clock = c.link, len(payload), time.perf_counter_ns
    proc = psutil.Process(c.proc.pid)
    cpu0 = cpu_seconds(proc)
    start_ns = clock()
    for _ in range(n):
        t0 = clock()
        reply = link.request(payload, timeout=30)
        series.samples.append((clock() - t0) / 1000)
        if len(reply.data) != size:
            raise RuntimeError(f"{c.label}: short reply ({len(reply.data)} of {size} B)")
    series.seconds += (clock() - start_ns) / 1e9
    series.cpu_seconds += cpu_seconds(proc) - cpu0


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def summarise(label: str, size: int, s: Series) -> Result:
    samples = sorted(s.samples)
    median = statistics.median(samples)
    n = len(samples)
    return Result(label, size, n, median, percentile(samples, 0.99), n / s.seconds,
                  size / (median / 1e6) / 1e6, s.cpu_seconds / n * 1e6)


def human(size: int) -> str:
    return f"{size // (1024 * 1024)} MiB" if size >= 1024 * 1024 else f"{size} B"


def print_table(results: list[Result]) -> None:
    head = (f"{'worker':<26} {'payload':>7} {'n':>5} {'median µs':>10} {'p99 µs':>8} "
            f"{'req/s':>7} {'MB/s':>7} {'worker CPU µs/req':>18} {'ours/verda median':>18}")
    print(head)
    print("-" * len(head))
    base = {r.size: r for r in results if r.label == BASELINE}
    for size in sorted({r.size for r in results}):
        for r in (r for r in results if r.size == size):
            ours = r.label.startswith("ours")
            ratio = f"{r.median_us / base[size].median_us:.2f}" if ours else ""
            print(f"{r.label:<26} {human(r.size):>7} {r.n:>5} {r.median_us:>10.0f} "
                  f"{r.p99_us:>8.0f} {r.req_per_s:>7.0f} {r.mb_per_s:>7.1f} {r.cpu_us:>18.0f} "
                  f"{ratio:>18}")
        print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000, help="100 B requests (2000)")
    parser.add_argument("--large", type=int, default=500, help="1 MiB requests (500)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests per size")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (4)")
    parser.add_argument("--no-info", action="store_true", help="skip verda-io at INFO")
    args = parser.parse_args()
    sizes = [(100, args.small), (1024 * 1024, args.large)]
    work = Path(tempfile.mkdtemp(prefix="vt-bench-", dir="/tmp"))
    (work / "ext").mkdir()
    (work / "plain").mkdir()
    servers = {
        False: WireServer(work / "ext").start(),
        True: WireServer(work / "plain", features=frozenset()).start(),
    }
    field_ = contenders(not args.no_info)
    series = {(c.label, size): Series() for c in field_ for size, _ in sizes}
    try:
        for i, c in enumerate(field_):
            start(c, servers[c.plain_server], f"bench-{i}", work)
        for size, n in sizes:
            payload = os.urandom(size)
            for c in field_:
                warm_up(c, payload, min(args.warmup, max(n // 2, 1)))
            per_round = [n // args.rounds + (1 if r < n % args.rounds else 0)
                         for r in range(args.rounds)]
            for count in per_round:
                for c in field_:
                    block(c, payload, count, series[(c.label, size)])
    finally:
        for c in field_:
            stop(c)
        for server in servers.values():
            server.close()
        shutil.rmtree(work, ignore_errors=True)
    results = [summarise(c.label, size, series[(c.label, size)])
               for size, _ in sizes for c in field_]
    load = os.getloadavg()[0]
    print(f"sequential echo round trips; {os.cpu_count()} CPUs (load average {load:.1f}); "
          f"Python {sys.version.split()[0]}; {args.small} x 100 B and {args.large} x 1 MiB "
          f"(fewer 1 MiB: slow) per worker, in {args.rounds} interleaved rounds after a warm-up")
    print("MB/s = payload bytes each way / median latency; ratio < 1: ours is faster\n")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
