"""bench/trace.py's lower bounds: never above what a policy achieves, and tight where they
should be (the bench's ratios are only as honest as the bound under them)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

from supervisor.tracesim import Trace, TraceBackend, TraceJob, simulate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_trace", ROOT / "bench" / "trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def small_card(seed: int) -> Trace:
    """A few models on a 6 GiB card, jobs arriving over a minute (as the stream trace)."""
    rng = random.Random(seed)
    backends = tuple(
        TraceBackend(f"m{i}", rng.uniform(0.5, 4.0), rng.randint(800, 3_500),
                     rng.randint(200, 1_000), safety_mib=384,
                     concurrency=rng.choice((1, 1, 2)))
        for i in range(rng.randint(2, 5)))
    jobs, t = [], 0.0
    for k in range(rng.randint(4, 14)):
        t += rng.expovariate(0.5)
        jobs.append(TraceJob(f"j{k}", round(t, 3), rng.choice(backends).name,
                             rng.uniform(0.5, 4.0)))
    return Trace(f"seed {seed}", (6 * 1024,), backends, tuple(jobs))


@pytest.mark.parametrize("seed", range(40))
def test_no_policy_beats_the_bounds(bench: ModuleType, seed: int) -> None:
    trace = small_card(seed)
    conflict = bench.conflict_bound(trace)
    bound = bench.lower_bound(trace)
    assert bound >= conflict
    for name, policy in bench.POLICIES:
        r = simulate(trace, name=name) if policy is None else \
            simulate(trace, policy=policy, name=name)
        assert not r.unfinished and not r.overcommitted, (name, r.unfinished)
        assert r.makespan_s >= bound - 1e-6, (name, r.makespan_s, bound, conflict)


def test_jobs_that_cannot_share_the_card_are_counted_one_after_another(
        bench: ModuleType) -> None:
    # Each job takes 4 GiB of 6: no two run at once, and both models' loads conflict with
    # the other's jobs (the two loads fit together). The packing bound halves each job
    # (1/3 < 4 GiB/6 GiB < 2/3); this one counts them whole, and one load before them.
    a = TraceBackend("a", 3.0, 3_000, 700, safety_mib=300)
    b = TraceBackend("b", 2.0, 3_000, 700, safety_mib=300)
    jobs = tuple(TraceJob(f"j{k}", 0.0, ("a", "b")[k % 2], 2.0) for k in range(6))
    trace = Trace("two", (6 * 1024,), (a, b), jobs)
    assert bench.packing_bound(trace) < 12.0
    assert bench.conflict_bound(trace) == pytest.approx(12.0 + 3.0)
    r = simulate(trace)
    assert r.makespan_s >= bench.conflict_bound(trace)


def test_jobs_that_fit_together_are_not_counted_one_after_another(bench: ModuleType) -> None:
    a = TraceBackend("a", 1.0, 1_000, 500, safety_mib=100)
    b = TraceBackend("b", 1.0, 1_000, 500, safety_mib=100)
    jobs = tuple(TraceJob(f"j{k}", 0.0, ("a", "b")[k % 2], 5.0) for k in range(2))
    trace = Trace("beside", (6 * 1024,), (a, b), jobs)
    assert bench.conflict_bound(trace) == pytest.approx(5.0 + 1.0)  # a load, then one job
    assert simulate(trace).makespan_s == pytest.approx(6.0, abs=0.5)


def test_the_reloads_that_arrivals_force_are_counted(bench: ModuleType) -> None:
    # Two models whose loads cannot run beside the other's job (nor stay beside it): a job of
    # each now, and of each again at 5 s. Best: load a (3 s), a's jobs at 3 and 5, load b
    # (2 s) from 6, b's two jobs: 10 s; any other order reloads a model or waits longer. The
    # pairwise bound counts the jobs and one load (the two loads could share the card: 7 s);
    # this one finds the 10 s.
    a = TraceBackend("a", 3.0, 3_000, 700, safety_mib=300)
    b = TraceBackend("b", 2.0, 3_000, 700, safety_mib=300)
    jobs = tuple(TraceJob(f"{n}{at}", float(at), n, 1.0) for at in (0, 5) for n in "ab")
    trace = Trace("turns", (6 * 1024,), (a, b), jobs)
    assert bench.conflict_bound(trace) == pytest.approx(7.0)
    assert bench.reload_bound(trace) == pytest.approx(10.0)
    assert bench.lower_bound(trace) == pytest.approx(10.0)
    for name, policy in bench.POLICIES:
        r = simulate(trace, name=name) if policy is None else \
            simulate(trace, policy=policy, name=name)
        assert r.makespan_s >= 10.0 - 1e-6, (name, r.makespan_s)


def test_no_policy_beats_the_reload_bound_where_it_is_the_tightest(bench: ModuleType) -> None:
    tighter = 0
    for seed in range(40, 200):
        trace = small_card(seed)
        bound = bench.reload_bound(trace)
        if bound <= max(bench.conflict_bound(trace), bench.packing_bound(trace)):
            continue
        tighter += 1
        for name, policy in bench.POLICIES:
            r = simulate(trace, name=name) if policy is None else \
                simulate(trace, policy=policy, name=name)
            assert r.makespan_s >= bound - 1e-6, (seed, name, r.makespan_s, bound)
    assert tighter >= 10  # (the seeds must exercise it)


def test_the_served_bound_counts_the_work_that_must_come_before_the_big_model(
        bench: ModuleType) -> None:
    # Issue 28's models: a chat stream of five requests (to 6.3 s) that keeps its model; a
    # batch at 3 s of a model that fits beside it (16 s of work) and one that fits beside
    # nothing, nor beside the first (4 s load, 12 s of work). The big model cannot start
    # until the small one's work is done (at 20 s), however short the stream: 36 s, not the
    # stream's end then the big model's work (22.3 s).
    chat = TraceBackend("chat", 2.0, 11 * 1024, 1024, safety_mib=128, priority=10)
    small = TraceBackend("small", 1.0, 7 * 1024, 3 * 1024, safety_mib=128)
    big = TraceBackend("big", 4.0, 16 * 1024, 4 * 1024, safety_mib=128)
    jobs = tuple(TraceJob(f"c{k}", 1.5 * k, "chat", 0.3, 10) for k in range(5))
    jobs += tuple(TraceJob(f"s{k}", 3.0, "small", 2.0) for k in range(8))
    jobs += tuple(TraceJob(f"b{k}", 3.0, "big", 3.0) for k in range(4))
    trace = Trace("small first", (24 * 1024,), (chat, small, big), jobs)
    assert bench.served_bound(trace) == pytest.approx(36.0)
    r = simulate(trace)
    assert not r.unfinished
    assert 36.0 - 1e-6 <= r.makespan_s <= 1.1 * 36.0
