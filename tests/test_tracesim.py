"""The trace simulator (the real scheduler on simulated time), its properties, and the engine.

Properties checked on traces: the real memory of a GPU never exceeds its total, every job
finishes, a job first in line is never passed longer than its patience bound allows, higher
priority goes first; the interleaved trace of issue 11 is served in batches; and the real
engine, on the simulated GPU with real workers, makes the decisions the simulator makes.
"""

from __future__ import annotations

import json
import math
import random
import time

import pytest
from engine_support import engine, sim_backend

from supervisor.scheduler.model import SchedulerConfig
from supervisor.tracesim import Trace, TraceBackend, TraceJob, simulate

GIB = 1024


def interleaved(load_s: float = 1.0, job_s: float = 0.3, n: int = 10) -> Trace:
    backends = (TraceBackend("A", load_s, 12 * GIB, 512), TraceBackend("B", load_s, 12 * GIB, 512),
                TraceBackend("C", load_s, 4 * GIB + 512, 256),
                TraceBackend("D", load_s, 4 * GIB + 512, 256))
    jobs = tuple(TraceJob(f"{b}{i}", 0.0, b, job_s) for i in range(n) for b in "ABCD")
    return Trace("interleaved", (24 * GIB,), backends, jobs)


def test_the_interleaved_trace_is_served_in_batches() -> None:
    result = simulate(interleaved())
    # The bound: load A, its 10 jobs, load B, its 10 jobs (C and D run beside): 8 s.
    assert result.loads == 4 and not result.overcommitted and not result.unfinished
    assert result.makespan_s <= 1.15 * 8.0, result.makespan_s
    spawned = [b for _t, _j, b, _g, spawn in result.starts if spawn]
    assert spawned[:3] == ["A", "C", "D"] and spawned[3] == "B"


def random_trace(rng: random.Random) -> Trace:
    gpus = tuple(rng.choice((8, 16, 24)) * GIB for _ in range(rng.randint(1, 3)))
    smallest = min(gpus)
    backends = tuple(
        TraceBackend(f"b{i}", rng.uniform(0.1, 5.0), rng.randint(256, smallest // 2),
                     rng.randint(64, smallest // 4), safety_mib=rng.choice((0, 256)),
                     concurrency=rng.choice((1, 1, 2)), priority=rng.choice((0, 0, 5)),
                     keep_alive_s=rng.choice((5.0, 300.0)))
        for i in range(rng.randint(2, 8)))
    jobs = []
    t = 0.0
    for k in range(rng.randint(5, 60)):
        t += rng.expovariate(2.0) if rng.random() < 0.8 else 0.0
        b = rng.choice(backends)
        jobs.append(TraceJob(f"j{k}", round(t, 3), b.name, rng.uniform(0.05, 3.0),
                             rng.choice((b.priority, 0, 5))))
    return Trace("random", gpus, backends, tuple(jobs))


@pytest.mark.parametrize("seed", range(40))
def test_random_traces_never_overcommit_and_every_job_ends(seed: int) -> None:
    trace = random_trace(random.Random(seed))
    result = simulate(trace, max_time=1e5)
    assert not result.overcommitted
    assert result.unfinished == []
    assert sum(len(w) for w in result.waits.values()) == len(trace.jobs)


def banded_trace(rng: random.Random) -> tuple[Trace, SchedulerConfig]:
    """One GPU, loads of up to 30 s, jobs of two to four priority bands that age fast (an
    interval of 2 to 30 s): aged jobs overtake the younger ones of the band above while
    loads are under way."""
    size = rng.choice((12, 16, 24)) * GIB
    bands = rng.sample((0, 2, 5, 10), rng.randint(2, 4))
    backends = tuple(
        TraceBackend(f"b{i}", rng.uniform(0.5, 30.0), rng.randint(size // 8, size * 2 // 3),
                     rng.randint(64, size // 6), concurrency=rng.choice((1, 1, 2)),
                     priority=rng.choice(bands), keep_alive_s=rng.choice((5.0, 300.0)))
        for i in range(rng.randint(2, 6)))
    jobs, t = [], 0.0
    for k in range(rng.randint(10, 60)):
        t += rng.expovariate(rng.choice((0.2, 1.0, 3.0)))
        b = rng.choice(backends)
        jobs.append(TraceJob(f"j{k}", round(t, 3), b.name, rng.uniform(0.1, 20.0),
                             rng.choice((b.priority, rng.choice(bands)))))
    config = SchedulerConfig(aging_interval_s=rng.choice((2.0, 5.0, 30.0)))
    return Trace("banded", (size,), backends, tuple(jobs)), config


@pytest.mark.parametrize("seed", [*range(140, 166), 554, 716])
def test_loads_are_seldom_given_up_across_aging_priority_bands(seed: int) -> None:
    """A load given up throws its loading away, and its jobs start it again later: for a
    request that the walk then serves before them, it is worth it, but when the walk serves
    those jobs first (they aged above the request, or a job ahead of the request takes the
    room) the load starts again at once and is given up again, at every step. Over 1,000
    such traces at most one load in six jobs was given up; the loops gave up to 8 per job
    (seed 154, aged from when they were blocked: 381 for 46 jobs; seeds 554 and 716, behind
    a job that waits: 56 for 59 and 46 for 45)."""
    trace, config = banded_trace(random.Random(seed))
    result = simulate(trace, config=config, max_time=1e5)
    assert not result.overcommitted and result.unfinished == []
    assert len(result.given_up) <= len(trace.jobs) / 4, result.given_up


def test_a_job_first_in_line_is_passed_at_most_for_its_patience() -> None:
    # A is hot and gets a new job every 0.5 s for 100 s; B arrives at t=1 and needs A gone.
    hot = TraceBackend("A", 1.0, 14 * GIB, GIB)
    cold = TraceBackend("B", 2.0, 14 * GIB, GIB)
    jobs = [TraceJob(f"a{k}", 0.5 * k, "A", 0.4) for k in range(200)]
    jobs.append(TraceJob("b", 1.0, "B", 0.4))
    trace = Trace("starve", (24 * GIB,), (hot, cold), tuple(jobs))
    for limit in (5.0, 20.0):
        cfg = SchedulerConfig(patience_factor=100.0, max_patience_s=limit,
                              aging_interval_s=math.inf)
        result = simulate(trace, config=cfg)
        started = {j: t for t, j, *_ in result.starts}
        # Its patience, then A's running job (0.4 s) and its eviction come on top.
        assert started["b"] - 1.0 <= limit + 0.4 + 0.5, (limit, started["b"])
        # Meanwhile A's batch went on (B was patient, not forced at once).
        passed = [j for t, j, *_ in result.starts if j.startswith("a") and 1.0 < t < started["b"]]
        assert len(passed) >= 4, (limit, passed)


def test_higher_priority_goes_first_whatever_the_batch() -> None:
    hot = TraceBackend("A", 1.0, 14 * GIB, GIB)
    urgent = TraceBackend("U", 1.0, 14 * GIB, GIB)
    jobs = [TraceJob(f"a{k}", 0.0, "A", 1.0) for k in range(20)]
    jobs.append(TraceJob("u", 2.5, "U", 0.5, priority=10))
    result = simulate(Trace("urgent", (24 * GIB,), (hot, urgent), tuple(jobs)))
    started = {j: t for t, j, *_ in result.starts}
    # It waits for A's running job only: no new A job starts once it is queued.
    assert started["u"] <= 2.5 + 1.0 + 0.1
    assert not any(2.5 < t < started["u"] for t, j, *_ in result.starts if j.startswith("a"))


@pytest.mark.process
def test_the_engine_decides_as_the_simulator_does() -> None:
    # The interleaved trace, smaller, through the real engine with simulated workers.
    trace = interleaved(load_s=0.3, job_s=0.1, n=4)
    specs = []
    for b in trace.backends:
        spec = sim_backend(b.name, b.resident_mib - 256, b.activation_mib, load_s=0.3,
                           steps=2, step_s=0.05)
        spec.update(safety="0MiB", keep_alive="10m")
        specs.append(spec)
    payload = json.dumps({"steps": 2, "step_s": 0.05}).encode()
    with engine(specs, gpus="sim:24GiB") as sup:
        started = time.monotonic()
        ids = [sup.submit(j.backend, payload) for j in trace.jobs]
        views = [sup.wait(i, 120) for i in ids]
        makespan = time.monotonic() - started
        log = [line.text for line in sup.snapshot().log]
    spawned = [text.split()[1] for text in log if text.startswith("starting ")]
    loads = {}
    for v in views:
        marks = {state: t for t, state, _ in v.history}
        if "starting" in marks and "running" in marks:
            loads.setdefault(v.backend, marks["running"] - marks["starting"])
    measured = tuple(TraceBackend(b.name, loads.get(b.name, 0.3), b.resident_mib,
                                  b.activation_mib) for b in trace.backends)
    sim = simulate(Trace(trace.name, trace.gpus, measured, trace.jobs))
    sim_spawned = [b for _t, _j, b, _g, spawn in sim.starts if spawn]
    assert spawned == sim_spawned, (spawned, sim_spawned)
    assert len(spawned) == sim.loads == 4
    assert abs(makespan - sim.makespan_s) <= 0.35 * sim.makespan_s + 0.5, (makespan, sim)
