"""Worker CPU and round-trip latency of our worker SDK against the verda-io 0.4.4 worker.

Run: ``.venv/bin/python bench/protocol.py [--small N] [--large N] [--rounds R] [--no-info]``.

One :class:`worker_sdk.testing.WireServer` (advertising our extensions, as the engine does)
serves, side by side in one run:

- ``ours``: our worker (``python -m worker_sdk``), negotiated: request envelopes, no
  per-request status events;
- ``verda-io 0.4.4 (WARNING)``: the unmodified verda-io worker with its logging lowered to
  WARNING (bench/workers/verda_quiet.py) — the baseline of the ratios;
- ``verda-io 0.4.4 (INFO)``: the same at its default INFO logging (to a file, as a supervisor
  would keep it);
- ``bare loop``: bench/workers/bare_loop.py, recv -> msgpack decode -> encode -> send and
  nothing else (registered as a plain worker, so it gets plain DATA frames): the floor;
- ``ours, plain server``: our worker under a second WireServer that advertises no
  extensions (it then behaves as verda-io does: busy/ready status events around each request).

Each worker echoes sequential requests of 100 B and 1 MiB after a warm-up, in interleaved
rounds (each worker in turn, then again), so that load from elsewhere on the machine falls on
all of them alike.  **Worker CPU** is the on-CPU time of the worker process, all its threads,
user and kernel, from /proc/PID/task/*/schedstat (nanoseconds), per request; the table gives
the median over rounds (robust against a round that another process disturbed) and
``verda/x``: how many times less CPU than verda-io at WARNING.  Latency is the client's wall
time from sending a request to holding the whole reply (the same blocking client for all).
MB/s is the payload size (sent each way) divided by the median latency.

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
OURS = "ours"
BASELINE = "verda-io 0.4.4 (WARNING)"
BARE = "bare loop"
SMALL = 100
TARGET = 3.0  # issue 11: at least 3x less worker CPU per 100 B request than verda-io


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

    samples: list[float] = field(default_factory=list)  # latency, µs
    cpu_per_round: list[float] = field(default_factory=list)  # worker CPU µs per request
    seconds: float = 0.0


@dataclass
class Result:
    label: str
    size: int
    n: int
    median_us: float
    p99_us: float
    req_per_s: float
    mb_per_s: float
    cpu_us: float  # median over rounds of worker CPU per request
    cpu_min_us: float


def contenders(include_info: bool) -> list[Contender]:
    py = sys.executable
    ours = [py, "-m", "worker_sdk", str(WORKERS / "echo_ours.py")]
    out = [
        Contender(OURS, ours),
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
    series.cpu_per_round.append((cpu_seconds(proc) - cpu0) / n * 1e6)


def percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def summarise(label: str, size: int, s: Series) -> Result:
    samples = sorted(s.samples)
    median = statistics.median(samples)
    n = len(samples)
    return Result(label, size, n, median, percentile(samples, 0.99), n / s.seconds,
                  size / (median / 1e6) / 1e6, statistics.median(s.cpu_per_round),
                  min(s.cpu_per_round))


def human(size: int) -> str:
    return f"{size // (1024 * 1024)} MiB" if size >= 1024 * 1024 else f"{size} B"


def print_table(results: list[Result]) -> None:
    head = (f"{'worker':<26} {'payload':>7} {'n':>5} {'CPU µs/req':>10} {'(min)':>7} "
            f"{'verda/x':>7} {'median µs':>9} {'p99 µs':>7} {'req/s':>7} {'MB/s':>7}")
    print(head)
    print("-" * len(head))
    base = {r.size: r for r in results if r.label == BASELINE}
    for size in sorted({r.size for r in results}):
        for r in (r for r in results if r.size == size):
            ratio = base[size].cpu_us / r.cpu_us if r.cpu_us else float("inf")
            print(f"{r.label:<26} {human(r.size):>7} {r.n:>5} {r.cpu_us:>10.1f} "
                  f"{r.cpu_min_us:>7.1f} {ratio:>6.2f}x {r.median_us:>9.0f} {r.p99_us:>7.0f} "
                  f"{r.req_per_s:>7.0f} {r.mb_per_s:>7.1f}")
        print()


def verdict(results: list[Result]) -> str:
    by = {r.label: r for r in results if r.size == SMALL}
    ours, base, bare = by[OURS], by[BASELINE], by.get(BARE)
    ratio = base.cpu_us / ours.cpu_us
    line = (f"worker CPU per {SMALL} B request: ours {ours.cpu_us:.1f} µs, verda-io (WARNING) "
            f"{base.cpu_us:.1f} µs: {ratio:.2f}x less (bar {TARGET:g}x: "
            f"{'met' if ratio >= TARGET else 'NOT met'})")
    if bare is not None:
        line += (f"; the bare loop {bare.cpu_us:.1f} µs, so ours spends "
                 f"{ours.cpu_us - bare.cpu_us:.1f} µs per request beyond the wire format")
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=4000, help="100 B requests (4000)")
    parser.add_argument("--large", type=int, default=200, help="1 MiB requests (200)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up requests per size")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (10)")
    parser.add_argument("--no-info", action="store_true", help="skip verda-io at INFO")
    args = parser.parse_args()
    sizes = [(SMALL, args.small), (1024 * 1024, args.large)]
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
            rounds = max(1, min(args.rounds, n))
            per_round = [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]
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
          f"per worker, in {args.rounds} interleaved rounds after a warm-up")
    print("CPU µs/req: the worker process's on-CPU time (all threads, user + kernel) per "
          "request, median over rounds; verda/x: verda-io (WARNING) CPU / this CPU\n")
    print_table(results)
    print(verdict(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
