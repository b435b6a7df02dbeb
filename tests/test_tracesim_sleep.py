"""The trace simulator with sleeping workers: the policy's sleep or stop, in milliseconds.

The same traces with and without sleep hooks: alternating requests for two models that
cannot share a card cost two loads and wakes instead of a reload each; a sleep that does not
fit the host budget, or whose residual is needed, is a stop; random traces with sleepers
never over-commit a GPU (counting what sleepers keep) and finish every job.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from supervisor.tracesim import Trace, TraceBackend, TraceJob, simulate

GIB = 1024


def alternating(wake_s: float | None, *, rounds: int = 4, gap_s: float = 5.0,
                host_mib: int = 0, budget_mib: int = 1 << 40) -> Trace:
    """Two 9 GiB models (load 3 s, asleep 300 MiB, wake 0.3 s) on a 12 GiB card; a job for
    a, then b, … every ``gap_s`` (each after the one before has ended)."""
    backends = tuple(TraceBackend(n, 3.0, 8704, 512, wake_s=wake_s, residual_mib=300,
                                  host_mib=host_mib) for n in "ab")
    jobs = tuple(TraceJob(f"j{i}", i * gap_s, "ab"[i % 2], 0.1) for i in range(rounds * 2))
    return Trace("alternating", (12 * GIB,), backends, jobs, budget_mib)


def test_alternating_models_sleep_instead_of_reloading() -> None:
    asleep, plain = simulate(alternating(0.3)), simulate(alternating(None))
    assert (asleep.loads, asleep.wakes, asleep.sleeps) == (2, 6, 7)
    assert (plain.loads, plain.wakes, plain.sleeps) == (8, 0, 0)
    for r in (asleep, plain):
        assert not r.overcommitted and not r.unfinished
    waits = sum(asleep.waits[0]), sum(plain.waits[0])
    assert waits[0] < waits[1] / 2  # six wakes of 0.3 s (and two loads) against seven loads


def test_a_sleep_over_the_host_budget_is_a_stop() -> None:
    r = simulate(alternating(0.3, host_mib=8 * GIB, budget_mib=6 * GIB))
    assert (r.loads, r.wakes, r.sleeps) == (8, 0, 0)
    # One sleeper fits, but not two: to wake a, b (awake) would sleep while a still holds its
    # host memory, so b is stopped each time, and a sleeps (b's turn) and wakes (its own).
    r = simulate(alternating(0.3, host_mib=8 * GIB, budget_mib=10 * GIB))
    assert (r.loads, r.wakes, r.sleeps) == (5, 3, 4)


def test_sleepers_are_stopped_when_even_their_residual_is_needed() -> None:
    trace = alternating(0.3, rounds=1, gap_s=1.0)
    big = TraceBackend("big", 2.0, 11_500, 400)  # beside two sleepers (600) it cannot fit
    trace = dataclasses.replace(trace, backends=(*trace.backends, big), jobs=(
        *trace.jobs, TraceJob("big0", 5.0, "big", 0.1)))
    r = simulate(trace)
    assert not r.overcommitted and not r.unfinished
    assert r.sleeps == 2 and r.loads == 3  # a and b asleep, then stopped for big


def sleepy_trace(rng: random.Random) -> Trace:
    gpus = tuple(rng.choice((8, 16, 24)) * GIB for _ in range(rng.randint(1, 2)))
    smallest = min(gpus)
    backends = []
    for i in range(rng.randint(2, 6)):
        resident = rng.randint(512, smallest // 2)
        backends.append(TraceBackend(
            f"b{i}", rng.uniform(0.5, 6.0), resident, rng.randint(64, smallest // 4),
            safety_mib=rng.choice((0, 256)), concurrency=rng.choice((1, 1, 2)),
            wake_s=rng.choice((None, rng.uniform(0.05, 1.0))), sleep_s=rng.uniform(0.0, 0.3),
            residual_mib=rng.randint(100, resident - 100), host_mib=rng.randint(0, resident),
            keep_alive_s=rng.choice((5.0, 300.0))))
    jobs = []
    t = 0.0
    for k in range(rng.randint(5, 50)):
        t += rng.expovariate(1.0)
        jobs.append(TraceJob(f"j{k}", round(t, 3), rng.choice(backends).name,
                             rng.uniform(0.05, 2.0)))
    return Trace("random sleepers", gpus, tuple(backends), tuple(jobs),
                 rng.choice((1 << 40, 4 * GIB)))


@pytest.mark.parametrize("seed", range(40))
def test_random_traces_with_sleepers_never_overcommit_and_finish(seed: int) -> None:
    r = simulate(sleepy_trace(random.Random(seed)), max_time=1e5)
    assert not r.overcommitted
    assert not r.unfinished
