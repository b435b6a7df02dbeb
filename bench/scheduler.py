"""Micro benchmark: how long one ``plan()`` decision takes with a large queue.

Not a test. Run: ``.venv/bin/python bench/scheduler.py [--runs N]``. Builds snapshots with
10,000 queued jobs over 50 backends on 4 GPUs, in a few shapes, and prints the median (and
p90) wall time of one ``plan()`` call per shape, measured with ``time.perf_counter``. The
bar is 1 ms per decision.

Shapes:
- typical: some workers busy, some idle, a cold job blocked for memory near the head;
- aged: the same, with four priority bands submitted over two hours, so aging reorders the
  queue and the merge of bands is exercised;
- deep: the worst case for the early stop: every queued job waits for a busy worker except
  the very last one in queue order, which can start on an idle worker, so the walk must reach
  the end of the queue;
- deep-aged: deep with the aged queue (the last job is the newest of the lowest band).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from supervisor.scheduler import (
    BackendInfo,
    GpuState,
    QueuedJob,
    SchedulerConfig,
    Snapshot,
    WorkerInfo,
    plan,
    queue_sort_key,
)

N_JOBS = 10_000
N_BACKENDS = 50
GPU_MIB = 81_920
NOW = 10_000.0


def _backends(rng: random.Random) -> dict[str, BackendInfo]:
    out = {}
    for i in range(N_BACKENDS):
        peak = rng.randrange(4_000, 40_000, 256)
        out[f"model{i:02d}"] = BackendInfo(
            name=f"model{i:02d}",
            peak_mib=peak,
            activation_mib=peak // 4,
            safety_mib=512,
            priority=0,
            allowed_gpus=None,
            concurrency=rng.choice((1, 1, 2)),
            pinned=False,
            reload_cost_s=rng.uniform(2.0, 30.0),
        )
    return out


def _workers(backends: dict[str, BackendInfo], walk_all: bool) -> dict[str, WorkerInfo]:
    """Eight workers per GPU-ish: busy ones fill each GPU; two idle ones; no room left."""
    names = sorted(backends)
    workers = {}
    for i, name in enumerate(names[:12]):
        info = backends[name]
        gpu = i % 4
        busy = i >= 2
        active = info.concurrency if busy else 0
        reserved = info.holds_mib(active)
        workers[name] = WorkerInfo(
            backend=name,
            gpu=gpu,
            state="busy" if busy else "ready",
            active_jobs=active,
            reserved_mib=reserved,
            idle_since=None if busy else NOW - 30.0 * (i + 1),
        )
    if walk_all:
        # A hot worker with a free slot and room, whose only job is the last one.
        name = names[12]
        info = backends[name]
        workers[name] = WorkerInfo(name, 3, "ready", 0, info.idle_mib, NOW - 5.0)
    return workers


def _queue(backends: dict[str, BackendInfo], rng: random.Random, aged: bool, walk_all: bool):
    names = sorted(backends)
    # deep: only backends whose workers are busy, so every job but the last waits.
    queued_names = names[2:12] if walk_all else [n for n in names if n != names[12]]
    jobs = []
    for seq in range(N_JOBS):
        prio = rng.choice((0, 1, 2, 3)) if aged else 0
        submitted = NOW - 7_200.0 + seq * (7_200.0 / N_JOBS) if aged else NOW - 1.0
        jobs.append(QueuedJob(f"j{seq}", rng.choice(queued_names), prio, seq, submitted, 0))
    if walk_all:
        last = jobs[-1]
        jobs[-1] = QueuedJob(last.job_id, names[12], 0, last.seq, last.submitted_at, 0)
    jobs.sort(key=queue_sort_key)
    return tuple(jobs)


def _snapshot(aged: bool, walk_all: bool) -> Snapshot:
    rng = random.Random(7)
    backends = _backends(rng)
    workers = _workers(backends, walk_all)
    gpus = []
    for g in range(4):
        held = sum(w.reserved_mib for w in workers.values() if w.gpu == g)
        # Make every GPU nearly full so cold jobs block and the idle ones are evictable.
        total = max(GPU_MIB, held + 1_000)
        gpus.append(GpuState(g, total, total - held, 457))
    return Snapshot(gpus, backends, workers, _queue(backends, rng, aged, walk_all))


def _time(snapshot: Snapshot, runs: int) -> tuple[float, float, int, int]:
    config = SchedulerConfig()
    samples = []
    result = plan(snapshot, NOW, config)
    for _ in range(runs):
        t0 = time.perf_counter()
        result = plan(snapshot, NOW, config)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    p90 = samples[int(0.9 * (len(samples) - 1))]
    return statistics.median(samples), p90, len(result.starts), len(result.evictions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    shapes = {
        "typical": (False, False),
        "aged": (True, False),
        "deep": (False, True),
        "deep-aged": (True, True),
    }
    print(
        f"plan() with {N_JOBS} queued jobs, {N_BACKENDS} backends, 4 GPUs; "
        f"median of {args.runs} runs"
    )
    print(f"{'shape':<16}{'median µs':>12}{'p90 µs':>10}{'starts':>8}{'evicts':>8}")
    for label, (aged, walk_all) in shapes.items():
        med, p90, starts, evicts = _time(_snapshot(aged, walk_all), args.runs)
        print(f"{label:<16}{med * 1e6:>12.1f}{p90 * 1e6:>10.1f}{starts:>8}{evicts:>8}")
    # Building the snapshot is the engine's side of the bill; counting the queue per backend
    # is what the engine avoids by keeping ``queued_counts`` incrementally.
    snap = _snapshot(False, False)
    counts = dict(snap.queued_counts or {})
    queue_list = list(snap.queue)
    for label, kwargs in (("given", {"queued_counts": counts}), ("counted", {})):
        samples = []
        for _ in range(max(10, args.runs // 10)):
            t0 = time.perf_counter()
            Snapshot(snap.gpus, snap.backends, snap.workers, queue_list, **kwargs)
            samples.append(time.perf_counter() - t0)
        print(
            f"Snapshot() from a list, counts {label:<8}{statistics.median(samples) * 1e6:>9.1f} µs"
        )


if __name__ == "__main__":
    main()
