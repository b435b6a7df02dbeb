"""Unit tests for the pure scheduler: one rule per test, on hand-built snapshots."""

from __future__ import annotations

import importlib
import math
import os
import pathlib
import subprocess
import sys
from dataclasses import replace

import pytest

from supervisor.scheduler import (
    BackendInfo,
    Evict,
    GpuState,
    Plan,
    QueuedJob,
    SchedulerConfig,
    Snapshot,
    Start,
    WorkerInfo,
    aging_bonus,
    check_submit,
    effective_priority,
    ordered,
    plan,
    queue_sort_key,
    validate_queue,
)

# The package re-exports the function ``plan``, which shadows the module of the same name.
plan_module = importlib.import_module("supervisor.scheduler.plan")

NOW = 1_000.0


# --------------------------------------------------------------------------- builders


def gpu(index: int, total: int = 24_000, free: int | None = None, reserve: int = 0) -> GpuState:
    return GpuState(index, total, free, reserve)


def be(
    name: str,
    peak: int | None = 10_000,
    act: int | None = 2_000,
    *,
    safety: int = 0,
    allowed: tuple[int, ...] | None = None,
    conc: int = 1,
    pinned: bool = False,
    reload: float = 10.0,
    priority: int = 0,
) -> BackendInfo:
    return BackendInfo(name, peak, act, safety, priority, allowed, conc, pinned, reload)


def wk(
    backend: str,
    gpu_index: int = 0,
    state: str = "ready",
    active: int = 0,
    reserved: int = 0,
    idle_since: float | None = None,
) -> WorkerInfo:
    return WorkerInfo(backend, gpu_index, state, active, reserved, idle_since)


def idle(info: BackendInfo, gpu_index: int = 0, idle_for: float = 0.0) -> WorkerInfo:
    """An idle worker holding its resident memory."""
    return wk(info.name, gpu_index, "ready", 0, info.idle_mib, NOW - idle_for)


def busy(info: BackendInfo, gpu_index: int = 0, jobs: int = 1) -> WorkerInfo:
    return wk(info.name, gpu_index, "busy", jobs, info.holds_mib(jobs), None)


_seq = iter(range(1, 1_000_000))


def job(
    job_id: str,
    backend: str,
    priority: int = 0,
    *,
    seq: int | None = None,
    at: float = NOW,
    passed: int = 0,
    blocked_since: float | None = None,
) -> QueuedJob:
    return QueuedJob(job_id, backend, priority, next(_seq) if seq is None else seq, at, passed,
                     blocked_since=blocked_since)


def snap(
    gpus: list[GpuState],
    backends: list[BackendInfo],
    workers: list[WorkerInfo] = (),  # type: ignore[assignment]
    queue: list[QueuedJob] = (),  # type: ignore[assignment]
) -> Snapshot:
    return Snapshot(
        gpus,
        {b.name: b for b in backends},
        {w.backend: w for w in workers},
        sorted(queue, key=queue_sort_key),
    )


def started(p: Plan) -> list[str]:
    return [s.job_id for s in p.starts]


def evicted(p: Plan) -> list[str]:
    return [e.backend for e in p.evictions]


# --------------------------------------------------------------------------- model


def test_needs_from_backend_info() -> None:
    b = be("a", 10_000, 2_000, safety=500)
    assert (b.idle_mib, b.cold_need_mib, b.need_mib(0), b.need_mib(1)) == (
        8_000, 10_500, 2_500, 2_500)
    assert [b.holds_mib(n) for n in range(3)] == [8_000, 10_500, 13_000]
    # The split unknown: an idle worker holds the whole peak (never 0), the first job adds
    # only its safety, each further concurrent job may need a whole peak more.
    unknown = be("b", 10_000, None, safety=500)
    assert [unknown.holds_mib(n) for n in range(3)] == [10_000, 10_500, 21_000]
    assert (unknown.idle_mib, unknown.cold_need_mib, unknown.need_mib(0),
            unknown.need_mib(1)) == (10_000, 10_500, 500, 10_500)
    unmeasured = be("c", None, None)
    assert (unmeasured.cold_need_mib, unmeasured.need_mib(0), unmeasured.idle_mib) == (
        None, 0, 0)


def test_model_validation() -> None:
    with pytest.raises(ValueError, match="activation_mib 5 exceeds peak_mib 4"):
        be("a", 4, 5)
    with pytest.raises(ValueError, match="concurrency"):
        be("a", conc=0)
    with pytest.raises(ValueError, match="state"):
        wk("a", state="sleeping")
    with pytest.raises(ValueError, match="aging_interval_s"):
        SchedulerConfig(aging_interval_s=0)
    with pytest.raises(ValueError, match="two workers"):
        Snapshot([gpu(0)], {}, {"x": wk("a"), "y": wk("a")})
    with pytest.raises(ValueError, match="unique"):
        Snapshot([gpu(0), gpu(0)], {})


# --------------------------------------------------------------------------- needs


def test_cold_job_spawns_with_peak_plus_safety() -> None:
    a = be("a", 10_000, 2_000, safety=512)
    p = plan(snap([gpu(0)], [a], [], [job("j1", "a")]), NOW)
    assert p.starts == (Start("j1", "a", 0, True, 10_512),)
    assert p.evictions == () and dict(p.waiting) == {}


def test_hot_job_needs_activation_plus_safety_only() -> None:
    a = be("a", 10_000, 2_000, safety=512)
    # 8,000 resident held; 3,000 left: a cold start (10,512) would not fit, a hot one does.
    s = snap([gpu(0, 11_000)], [a], [idle(a)], [job("j1", "a")])
    assert plan(s, NOW).starts == (Start("j1", "a", 0, False, 2_512),)


def test_hot_job_with_unknown_activation_is_held_whole_and_a_second_one_needs_a_peak() -> None:
    a = be("a", 10_000, None, safety=0, conc=2)
    s = snap([gpu(0, 19_999)], [a], [wk("a", 0, "ready", 0, 10_000)], [job("j1", "a")])
    assert plan(s, NOW).starts == (Start("j1", "a", 0, False, 0),)  # the peak is held already
    s2 = snap([gpu(0, 19_999)], [a], [wk("a", 0, "busy", 1, 10_000)], [job("j2", "a")])
    p = plan(s2, NOW)
    assert p.starts == ()
    assert p.waiting["j2"] == "needs 10000 MiB, 9999 free on GPU0"


def test_hot_includes_starting_and_initializing_workers() -> None:
    a = be("a", 10_000, 2_000, conc=2)
    for state in ("starting", "initializing", "busy"):
        s = snap([gpu(0)], [a], [wk("a", 0, state, 1, 12_000)], [job("j1", "a")])
        assert plan(s, NOW).starts == (Start("j1", "a", 0, False, 2_000),), state


# --------------------------------------------------------------------------- budget


def test_budget_trusts_the_lower_of_measured_free_and_reservations() -> None:
    a = be("a", 10_000, 2_000)
    q = [job("j1", "a")]
    # The driver says 9,999 free although nothing is reserved (a foreign process).
    assert plan(snap([gpu(0, 24_000, free=9_999)], [a], [], q), NOW).starts == ()
    # The driver lags: it still says 24,000 free, but 14,001 MiB are reserved.
    other = be("o", 14_001, 0)
    lagging = snap([gpu(0, 24_000, free=24_000)], [a, other], [busy(other)], q)
    assert plan(lagging, NOW).starts == ()
    ok = snap([gpu(0, 24_000, free=24_000)], [a, other], [busy(be("o", 14_000, 0))], q)
    assert started(plan(ok, NOW)) == ["j1"]


def test_budget_keeps_the_reserve() -> None:
    a = be("a", 10_000, 2_000, safety=0)
    q = [job("j1", "a")]
    assert plan(snap([gpu(0, 10_456, reserve=457)], [a], [], q), NOW).starts == ()
    assert started(plan(snap([gpu(0, 10_457, reserve=457)], [a], [], q), NOW)) == ["j1"]


def test_no_reading_uses_reservations_never_admits_everything() -> None:
    huge = be("huge", 99_999_999, 1)
    small = be("small", 10_000, 2_000)
    other = be("o", 10_000, 0)
    q = [job("j1", "huge"), job("j2", "small")]
    s = snap([gpu(0, 24_000, free=None)], [huge, small, other], [busy(other)], q)
    p = plan(s, NOW)
    assert "j1" not in started(p)
    assert p.evictions == ()
    assert "needs 99999999 MiB" in p.waiting["j1"]
    # The small job fits in total - reservations (14,000) and the huge one is no barrier.
    assert started(p) == ["j2"]
    tight = snap([gpu(0, 19_999, free=None)], [small, other], [busy(other)], [job("j3", "small")])
    assert plan(tight, NOW).starts == ()


def test_starts_in_one_plan_share_the_budget() -> None:
    a, b, c = be("a", 10_000, 2_000), be("b", 10_000, 2_000), be("c", 10_000, 2_000)
    q = [job("ja", "a", 2), job("jb", "b", 1), job("jc", "c", 0)]
    p = plan(snap([gpu(0, 20_000), gpu(1, 10_000)], [a, b, c], [], q), NOW)
    assert [(s.job_id, s.gpu) for s in p.starts] == [("ja", 0), ("jb", 0), ("jc", 1)]
    p2 = plan(snap([gpu(0, 25_000)], [a, b, c], [], q), NOW)
    assert started(p2) == ["ja", "jb"] and p2.waiting["jc"] == "needs 10000 MiB, 5000 free on GPU0"


# --------------------------------------------------------------------------- unmeasured


def test_unmeasured_backend_takes_an_empty_gpu_whole() -> None:
    u = be("u", None, None)
    a = be("a")
    s = snap([gpu(0), gpu(1, 30_000, reserve=500)], [u, a], [busy(a, 0)], [job("j1", "u")])
    assert plan(s, NOW).starts == (Start("j1", "u", 1, True, 29_500),)


def test_unmeasured_waits_when_no_gpu_is_empty_and_evicts_idle_ones() -> None:
    u = be("u", None, None)
    a, b = be("a"), be("b")
    s = snap([gpu(0), gpu(1)], [u, a, b], [busy(a, 0), idle(b, 1)], [job("j1", "u")])
    p = plan(s, NOW)
    assert p.starts == ()
    assert evicted(p) == ["b"] and p.evictions[0].gpu == 1
    assert p.waiting["j1"] == "runs alone: 1 worker leaves GPU1 for it"
    # Both GPUs busy: nothing to evict now, it waits for one of them to finish.
    s2 = snap([gpu(0), gpu(1)], [u, a, b], [busy(a, 0), busy(b, 1)], [job("j1", "u")])
    p2 = plan(s2, NOW)
    assert p2.evictions == () and "1 worker leaves GPU0 for it" in p2.waiting["j1"]


def test_nothing_else_is_admitted_beside_an_unmeasured_worker() -> None:
    u = be("u", None, None, conc=2)
    a = be("a", 1_000, 100)
    # Even if the engine's reservation for it were small, the GPU stays its own.
    s = snap([gpu(0)], [u, a], [wk("u", 0, "busy", 1, 1_000)], [job("j1", "a"), job("j2", "u")])
    p = plan(s, NOW)
    assert p.starts == (Start("j2", "u", 0, False, 0),)  # its own jobs add nothing
    assert "j1" in p.waiting


def test_two_unmeasured_spawns_never_share_a_gpu() -> None:
    u, v = be("u", None, None), be("v", None, None)
    p = plan(snap([gpu(0), gpu(1)], [u, v], [], [job("j1", "u"), job("j2", "v")]), NOW)
    assert {s.gpu for s in p.starts} == {0, 1}
    p1 = plan(snap([gpu(0)], [u, v], [], [job("j1", "u"), job("j2", "v")]), NOW)
    assert started(p1) == ["j1"] and "j2" in p1.waiting


def test_measured_cold_job_skips_the_gpu_of_a_planned_unmeasured_spawn() -> None:
    u, a = be("u", None, None), be("a")
    p = plan(snap([gpu(0), gpu(1)], [u, a], [], [job("j1", "u"), job("j2", "a")]), NOW)
    assert [(s.job_id, s.gpu) for s in p.starts] == [("j1", 0), ("j2", 1)]


# --------------------------------------------------------------------------- placement


def test_cold_placement_prefers_most_room_left() -> None:
    a = be("a", 10_000, 2_000)
    o1, o2, o3 = be("o1", 5_000, 0), be("o2", 1_000, 0), be("o3", 3_000, 0)
    gpus = [gpu(0), gpu(1), gpu(2), gpu(3, 12_000)]
    s = snap(gpus, [a, o1, o2, o3], [busy(o1, 0), busy(o2, 1), busy(o3, 2)], [job("j1", "a")])
    assert plan(s, NOW).starts[0].gpu == 1


def test_cold_placement_ties_go_to_the_lowest_index() -> None:
    a = be("a")
    assert plan(snap([gpu(2), gpu(1), gpu(3)], [a], [], [job("j", "a")]), NOW).starts[0].gpu == 1


def test_cold_placement_respects_allowed_gpus() -> None:
    a = be("a", allowed=(2, 9))
    s = snap([gpu(0, 80_000), gpu(1), gpu(2)], [a], [], [job("j", "a")])
    assert plan(s, NOW).starts[0].gpu == 2


def test_cold_placement_without_room_picks_least_eviction_cost() -> None:
    a = be("a", 20_000, 2_000)
    dear, cheap = be("dear", 15_000, 0, reload=60.0), be("cheap", 15_000, 0, reload=5.0)
    s = snap(
        [gpu(0), gpu(1)],
        [a, dear, cheap],
        [idle(dear, 0, idle_for=60), idle(cheap, 1, idle_for=60)],
        [job("j1", "a")],
    )
    p = plan(s, NOW)
    assert p.evictions == (Evict("cheap", 1, 15_000, p.evictions[0].reason),)
    assert "room for j1" in p.evictions[0].reason
    assert p.waiting["j1"] == "needs 20000 MiB: 1 worker leaves GPU1 for it"


def test_placement_never_picks_a_gpu_too_small_for_the_job() -> None:
    a = be("a", 20_000, 2_000)
    cheap, dear = be("cheap", 2_000, 0, reload=0.0), be("dear", 15_000, 0, reload=100.0)
    s = snap(
        [gpu(0, 16_000), gpu(1)],
        [a, cheap, dear],
        [idle(cheap, 0), idle(dear, 1)],
        [job("j1", "a")],
    )
    p = plan(s, NOW)
    assert evicted(p) == ["dear"]


def test_placement_counts_fits_now_before_evictions() -> None:
    a = be("a", 10_000, 2_000)
    idle_cheap = be("i", 20_000, 0, reload=0.0)
    s = snap([gpu(0), gpu(1, 10_000)], [a, idle_cheap], [idle(idle_cheap, 0)], [job("j", "a")])
    p = plan(s, NOW)
    assert p.starts[0].gpu == 1 and p.evictions == ()


# --------------------------------------------------------------------------- eviction


def test_eviction_cost_uses_reload_time_and_recency() -> None:
    a = be("a", 20_000, 2_000)
    # Same reload cost: the one idle longer is cheaper to evict.
    x, y = be("x", 10_000, 0), be("y", 10_000, 0)
    s = snap(
        [gpu(0, 30_000)],
        [a, x, y],
        [idle(x, 0, idle_for=10), idle(y, 0, idle_for=600)],
        [job("j", "a")],
    )
    assert evicted(plan(s, NOW)) == ["y"]
    # A much dearer reload outweighs recency: 10 s * 1/(1+10) < 100 s * 1/(1+1).
    x2, y2 = be("x", 10_000, 0, reload=10.0), be("y", 10_000, 0, reload=100.0)
    s2 = snap(
        [gpu(0, 30_000)],
        [a, x2, y2],
        [idle(x2, 0, idle_for=600), idle(y2, 0, idle_for=60)],
        [job("j", "a")],
    )
    assert evicted(plan(s2, NOW)) == ["x"]


def test_eviction_ties_free_the_larger_first() -> None:
    a = be("a", 20_000, 2_000)
    small, large = be("small", 8_000, 0), be("large", 12_000, 0)
    s = snap(
        [gpu(0, 30_000)],
        [a, small, large],
        [idle(small, 0, 60), idle(large, 0, 60)],
        [job("j", "a")],
    )
    assert evicted(plan(s, NOW)) == ["large"]


def test_evictions_are_minimal() -> None:
    a = be("a", 20_000, 2_000)
    tiny = be("tiny", 2_000, 0, reload=1.0)
    mid = be("mid", 4_000, 0, reload=2.0)
    big = be("big", 20_000, 0, reload=3.0)
    workers = [idle(tiny, 0, 60), idle(mid, 0, 60), idle(big, 0, 60)]
    # Nothing free: cheapest first would take tiny, mid, big; big alone is enough.
    s = snap([gpu(0, 26_000)], [a, tiny, mid, big], workers, [job("j", "a")])
    assert evicted(plan(s, NOW)) == ["big"]
    # 14,000 free already: tiny + mid (6,000) suffice, big is not touched.
    s2 = snap([gpu(0, 40_000)], [a, tiny, mid, big], workers, [job("j", "a")])
    assert evicted(plan(s2, NOW)) == ["tiny", "mid"]


def test_only_idle_unpinned_workers_are_evicted() -> None:
    a = be("a", 20_000, 2_000)
    pinned = be("p", 10_000, 0, pinned=True, reload=0.0)
    hot = be("h", 10_000, 0, reload=0.0)
    starting = be("s", 10_000, 0, reload=0.0)
    victim = be("v", 10_000, 0, reload=50.0)
    workers = [
        idle(pinned, 0),
        busy(hot, 0),
        wk("s", 0, "starting", 1, 0),  # loading for a job
        idle(victim, 0, 60),
    ]
    s = snap([gpu(0, 40_000)], [a, pinned, hot, starting, victim], workers, [job("j", "a")])
    assert evicted(plan(s, NOW)) == ["v"]


@pytest.mark.parametrize("state", ["starting", "initializing"])
def test_a_load_for_nobody_gives_way_to_a_job_that_needs_its_room(state: str) -> None:
    """A worker loading with no job (its job was cancelled, or a preload) and none of its
    backend queued: a job that needs its room evicts it rather than wait for the load."""
    a, s = be("a", 20_000, 2_000), be("s", 20_000, 0)
    for_nobody = [wk("s", 0, state, 0, 20_000)]
    assert evicted(plan(snap([gpu(0, 24_000)], [a, s], for_nobody, [job("j", "a")]), NOW)) \
        == ["s"]
    # A job of its own backend queued: the load is for someone again.
    q = [job("j", "a", 5), job("js", "s")]
    assert evicted(plan(snap([gpu(0, 24_000)], [a, s], for_nobody, q), NOW)) == []
    # Loading for a job: it stays.
    for_a_job = [wk("s", 0, state, 1, 20_000)]
    assert evicted(plan(snap([gpu(0, 24_000)], [a, s], for_a_job, [job("j", "a")]), NOW)) == []


def test_a_worker_given_a_job_in_this_plan_is_not_evicted() -> None:
    a = be("a", 20_000, 2_000)
    x = be("x", 10_000, 1_000, reload=0.0)  # the cheapest victim...
    y = be("y", 10_000, 0, reload=9.0)
    s = snap(
        [gpu(0, 30_000)],
        [a, x, y],
        [idle(x, 0), idle(y, 0, 60)],
        [job("jx", "x", priority=5), job("ja", "a")],
    )
    p = plan(s, NOW)
    assert started(p) == ["jx"]  # ...but it just took a job
    assert evicted(p) == ["y"]


def test_never_evict_for_a_job_that_cannot_fit_even_on_an_empty_gpu() -> None:
    huge = be("huge", 50_000, 1_000)
    a, x = be("a", 10_000, 1_000), be("x", 10_000, 0)
    s = snap([gpu(0), gpu(1)], [huge, a, x], [idle(x, 0)], [job("j1", "huge"), job("j2", "a")])
    p = plan(s, NOW)
    assert p.evictions == ()
    assert started(p) == ["j2"]  # it was no barrier
    assert "largest allowed GPU (GPU0) has 24000 MiB usable" in p.waiting["j1"]


def test_pinned_memory_is_never_counted_as_reclaimable() -> None:
    a = be("a", 20_000, 2_000)
    pin = be("pin", 10_000, 0, pinned=True)
    x = be("x", 5_000, 0)
    b = be("b", 1_000, 100)
    q = [job("j1", "a"), job("j2", "b")]
    s = snap([gpu(0)], [a, pin, x, b], [idle(pin, 0), idle(x, 0)], q)
    p = plan(s, NOW)
    assert p.evictions == ()
    assert "pinned" in p.waiting["j1"]
    assert started(p) == ["j2"]


@pytest.mark.parametrize("other_peak", [None, 5_000])
def test_a_pinned_worker_whose_footprint_is_unknown_leaves_for_room(
        other_peak: int | None) -> None:
    """Unmeasured, it holds its GPU alone; pinned there, every other job waited for ever (a
    llama-swap ``persistent`` group imported with no memory figures stalled every other
    model). Until a job of it is measured it leaves when room is needed, and says why."""
    pin = be("pin", None, None, pinned=True)
    other = be("other", other_peak, None if other_peak is None else 0)
    s = snap([gpu(0)], [pin, other], [wk("pin", 0, "ready", 0, 24_000, NOW)],
             [job("j", "other")])
    p = plan(s, NOW)
    assert evicted(p) == ["pin"], p.waiting
    assert "footprint is unknown" in p.evictions[0].reason
    # measured, its pin holds: the job waits, and never for ever unsaid
    pin = be("pin", 20_000, 0, pinned=True)
    s = snap([gpu(0)], [pin, other], [idle(pin, 0)], [job("j", "other")])
    p = plan(s, NOW)
    assert p.evictions == () and "pinned" in p.waiting["j"]


def test_two_servers_of_one_fixed_address_take_turns() -> None:
    """llama-swap's models often share a ``proxy`` port (vLLM in docker on :8000): two
    servers cannot listen on it at once. The second failed to start ("something already
    listens") three times and stayed failed; now the first leaves for it as a worker leaves
    for memory (both fit on the GPU here), and the rest waits."""
    a = replace(be("a", 4_000, 0), address="localhost:8000")
    b = replace(be("b", 4_000, 0), address="localhost:8000")
    c = replace(be("c", 4_000, 0), address="localhost:8001")
    # an idle holder with nothing queued: it goes; a job of another address starts beside it
    p = plan(snap([gpu(0), gpu(1)], [a, b, c], [idle(a, 1)], [job("jb", "b"), job("jc", "c")]),
             NOW)
    assert evicted(p) == ["a"] and started(p) == ["jc"]
    assert "localhost:8000, a's address" in p.waiting["jb"]
    assert p.evictions[0].reason == "b listens on localhost:8000 too (jb)"
    # neither runs yet: the first in line starts, the other waits for it
    p = plan(snap([gpu(0)], [a, b], [], [job("ja", "a"), job("jb", "b")]), NOW)
    assert started(p) == ["ja"] and "holds localhost:8000" in p.waiting["jb"]
    # a load asked by name (Ollama's warm-up) takes the address from an idle holder with
    # nothing queued (it waited 30 s and was given up), never from one with work waiting
    pre = QueuedJob("pb", "b", 0, 1, NOW, kind="preload")
    p = plan(snap([gpu(0)], [a, b], [idle(a, 0)], [pre]), NOW)
    assert evicted(p) == ["a"] and started(p) == []
    assert "loaded and listens on localhost:8000" in p.evictions[0].reason
    p = plan(snap([gpu(0)], [a, b], [busy(a, 0)], [job("ja", "a"), pre]), NOW)
    assert p.evictions == () and "holds localhost:8000" in p.waiting["pb"]


def test_a_holder_of_an_address_finishes_its_batch_first_then_leaves() -> None:
    """As a memory switch: the holder's queued work of the same priority goes on while the
    switch is patient (a, b, a, b queued ran a b a b, a reload per job), then it is forced
    and the holder's later jobs wait behind the switch."""
    a = replace(be("a", 4_000, 0), address="localhost:8000")
    b = replace(be("b", 4_000, 0), address="localhost:8000")
    q = [job("jb", "b", seq=1), job("ja", "a", seq=2)]
    p = plan(snap([gpu(0)], [a, b], [idle(a, 0)], q), NOW)
    assert p.evictions == () and started(p) == ["ja"]
    assert "before the switch" in p.waiting["jb"]
    q = [job("jb", "b", seq=1, blocked_since=NOW - 10_000), job("ja", "a", seq=2)]
    p = plan(snap([gpu(0)], [a, b], [idle(a, 0)], q), NOW)
    assert evicted(p) == ["a"] and started(p) == []
    assert p.waiting["ja"] == "worker stopping"
    # busy: it finishes its job first, then goes
    p = plan(snap([gpu(0)], [a, b], [busy(a, 0)], [q[0]]), NOW)
    assert p.evictions == () and "1 worker leaves GPU0" in p.waiting["jb"]


def test_an_address_is_waited_for_only_when_waiting_can_end() -> None:
    """A pinned holder never leaves: its jobs go on (they were held behind a job that could
    never start); a job that could not start once the holder left does not evict it (it was
    evicted, and reloaded for its own next job, plan after plan)."""
    pin = replace(be("a", 4_000, 0, pinned=True), address="localhost:8000")
    b = replace(be("b", 4_000, 0), address="localhost:8000")
    p = plan(snap([gpu(0)], [pin, b], [idle(pin, 0)], [job("jb", "b"), job("ja", "a")]), NOW)
    assert p.evictions == () and started(p) == ["ja"]
    assert "a is pinned: it never leaves" in p.waiting["jb"]
    a = replace(be("a", 4_000, 0), address="localhost:8000")
    for b_only, gpus in ((replace(b, allowed_gpus=(1,)), [gpu(0), replace(gpu(1),
                                                                          draining=True)]),
                         (replace(b, peak_mib=90_000), [gpu(0)])):
        p = plan(snap(gpus, [a, b_only], [idle(a, 0)], [job("jb", "b"), job("ja", "a")]), NOW)
        assert p.evictions == () and started(p) == ["ja"], p.waiting


def test_a_calibration_holds_its_address() -> None:
    """A calibration's server listens on the address as a worker's would: a job of another
    backend there started beside it (in the same plan, or while it ran)."""
    a = replace(be("a", 4_000, 0), address="localhost:8000")
    b = replace(be("b", 4_000, 0), address="localhost:8000")
    cal = QueuedJob("cb", "b", 5, 1, NOW, kind="calibration")
    p = plan(snap([gpu(0), gpu(1)], [a, b], [], [cal, job("ja", "a")]), NOW)
    assert started(p) == ["cb"] and "calibration" in p.waiting["ja"]
    running = replace(snap([gpu(0), gpu(1)], [a, b], [], [job("ja", "a")]),
                      calibrating={1: "b"})
    p = plan(running, NOW)
    assert started(p) == [] and "b's calibration" in p.waiting["ja"]


def test_hot_job_boxed_in_by_pinned_neighbours_relocates_its_idle_worker() -> None:
    a = be("a", 10_000, 6_000)
    pin = be("pin", 12_000, 0, pinned=True)
    # 4,000 resident + 6,000 activation cannot fit beside 12,000 pinned on 20,000 MiB.
    s = snap([gpu(0, 20_000), gpu(1)], [a, pin], [idle(a, 0), idle(pin, 0)], [job("j", "a")])
    p = plan(s, NOW)
    assert evicted(p) == ["a"] and "relocat" in p.waiting["j"]
    # Next time it is cold and goes where it fits.
    s2 = snap([gpu(0, 20_000), gpu(1)], [a, pin], [idle(pin, 0)], [job("j", "a")])
    assert plan(s2, NOW).starts == (Start("j", "a", 1, True, 10_000),)


def test_stopping_workers_count_as_coming_back() -> None:
    a = be("a", 20_000, 2_000)
    gone, spare = be("gone", 12_000, 0), be("spare", 10_000, 0, reload=0.0)
    workers = [wk("gone", 0, "stopping", 0, 12_000), idle(spare, 0)]
    s = snap([gpu(0, 32_000)], [a, gone, spare], workers, [job("j", "a")])
    p = plan(s, NOW)
    assert p.evictions == ()  # 10,000 free + 12,000 coming back >= 20,000
    assert p.waiting["j"] == "waiting for 1 worker to stop on GPU0"
    # Not quite enough coming back: one more eviction, and only one.
    s2 = snap([gpu(0, 29_000)], [a, gone, spare], workers, [job("j", "a")])
    p2 = plan(s2, NOW)
    assert evicted(p2) == ["spare"]
    assert p2.waiting["j"] == "needs 20000 MiB: 1 worker leaves GPU0 for it"


def test_a_job_whose_worker_is_stopping_waits() -> None:
    a = be("a")
    s = snap([gpu(0, 80_000)], [a], [wk("a", 0, "stopping", 0, 8_000)], [job("j", "a")])
    p = plan(s, NOW)
    assert p.starts == () and p.waiting["j"] == "worker stopping"


def test_evicted_worker_takes_no_job_in_the_same_plan() -> None:
    a = be("a", 20_000, 2_000)
    x = be("x", 10_000, 100)
    # ja has waited past its patience: x leaves for it, and x's own job waits.
    queue = [job("ja", "a", at=NOW - 1_000, blocked_since=NOW - 1_000), job("jx", "x")]
    s = snap([gpu(0, 25_000)], [a, x], [idle(x, 0, 600)], queue)
    p = plan(s, NOW, SchedulerConfig(aging_interval_s=math.inf))
    assert evicted(p) == ["x"] and p.starts == ()
    assert p.waiting["jx"] == "worker stopping"


# --------------------------------------------------------------------------- hot barrier


def test_hot_job_blocked_for_memory_evicts_on_its_own_gpu() -> None:
    a = be("a", 10_000, 8_000)
    x, y = be("x", 6_000, 0), be("y", 6_000, 0)
    workers = [idle(a, 0), idle(x, 0, 600), idle(y, 1, 6_000)]
    s = snap([gpu(0, 15_000), gpu(1)], [a, x, y], workers, [job("j", "a")])
    p = plan(s, NOW)
    assert p.evictions == (Evict("x", 0, 6_000, p.evictions[0].reason),)


# --------------------------------------------------------------------------- walk


def test_busy_worker_waits_without_blocking_others() -> None:
    a, b = be("a", conc=1), be("b")
    s = snap([gpu(0, 40_000)], [a, b], [busy(a, 0)], [job("ja", "a", 9), job("jb", "b")])
    p = plan(s, NOW)
    assert started(p) == ["jb"] and p.waiting["ja"] == "worker busy"
    assert p.passed == {}


def test_same_cold_backend_twice_spawns_once() -> None:
    a1 = be("a", 10_000, 2_000, conc=1)
    p = plan(snap([gpu(0, 80_000)], [a1], [], [job("j1", "a"), job("j2", "a")]), NOW)
    assert p.starts == (Start("j1", "a", 0, True, 10_000),)
    assert p.waiting["j2"] == "worker starting"
    a2 = be("a", 10_000, 2_000, conc=2)
    q = [job("j1", "a"), job("j2", "a"), job("j3", "a")]
    p2 = plan(snap([gpu(1, 80_000)], [a2], [], q), NOW)
    assert p2.starts == (Start("j1", "a", 1, True, 10_000), Start("j2", "a", 1, False, 2_000))
    assert p2.waiting["j3"] == "worker starting"


def test_priority_then_fifo() -> None:
    a = be("a", 1_000, 100, conc=10)
    q = [
        job("low", "a", 0, seq=1),
        job("hi2", "a", 5, seq=4),
        job("hi1", "a", 5, seq=3),
        job("mid", "a", 2, seq=2),
    ]
    p = plan(snap([gpu(0, 80_000)], [a], [], q), NOW)
    assert started(p) == ["hi1", "hi2", "mid", "low"]


def test_aging_lifts_waiting_jobs() -> None:
    a = be("a", 1_000, 100, conc=10)
    cfg = SchedulerConfig(aging_interval_s=60.0)
    old = job("old", "a", 0, seq=1, at=NOW - 181.0)  # 3 intervals: effective 3
    new = job("new", "a", 2, seq=2, at=NOW)
    assert effective_priority(old, NOW, 60.0) == 3
    p = plan(snap([gpu(0, 80_000)], [a], [], [old, new]), NOW, cfg)
    assert started(p) == ["old", "new"]
    # Just under two intervals waited: effective 1 < 2.
    p2 = plan(snap([gpu(0, 80_000)], [a], [], [old, new]), NOW - 62.0, cfg)
    assert started(p2) == ["new", "old"]
    # Equal effective priority (2): FIFO by seq.
    p3 = plan(snap([gpu(0, 80_000)], [a], [], [old, new]), NOW - 61.0, cfg)
    assert effective_priority(old, NOW - 61.0, 60.0) == 2
    assert started(p3) == ["old", "new"]


def test_aging_bonus_edges() -> None:
    assert aging_bonus(100.0, 100.0, 60.0) == 0
    assert aging_bonus(100.0, 159.999, 60.0) == 0
    assert aging_bonus(100.0, 160.0, 60.0) == 1
    assert aging_bonus(100.0, 50.0, 60.0) == 0  # clock skew never lowers priority
    assert aging_bonus(0.0, 1e9, math.inf) == 0


NO_AGING = SchedulerConfig(aging_interval_s=math.inf)


def _barrier_setup(*, waited: float = 0.0, barrier_priority: int = 0, hot_jobs: int = 5,
                   config: SchedulerConfig = NO_AGING) -> Plan:
    """A cold job first in line, blocked by a busy worker whose backend has queued jobs (its
    running jobs give back too little: only evicting it makes room)."""
    big = be("big", 30_000, 1_000)  # reload 10 s; the switch also reloads "hot": 20 s
    hot = be("hot", 12_000, 1_000, conc=100)
    queue = [job("barrier", "big", barrier_priority, at=NOW - waited,
                 blocked_since=NOW - waited)]
    queue += [job(f"h{i}", "hot", 0) for i in range(hot_jobs)]
    s = snap([gpu(0, 40_000)], [big, hot], [busy(hot, 0, jobs=10)], queue)
    return plan(s, NOW, config)


def test_a_patient_barrier_lets_the_hot_batch_of_its_priority_go_on() -> None:
    p = _barrier_setup(waited=10.0)  # patience: 4 x 20 s of switching
    assert started(p) == [f"h{i}" for i in range(5)]
    assert p.passed == {"barrier": 5}
    assert "goes on for up to 70 s more before the switch" in p.waiting["barrier"]


def test_a_barrier_whose_patience_is_spent_stops_the_batch() -> None:
    p = _barrier_setup(waited=80.0)
    assert p.starts == () and p.evictions == ()  # the busy victim goes once its jobs end
    assert p.waiting["h0"] == "its worker leaves GPU0 for barrier"
    assert p.waiting["barrier"] == "needs 30000 MiB: 1 worker leaves GPU0 for it"


def test_patience_is_tied_to_switch_cost_and_capped_by_max_patience() -> None:
    cfg = SchedulerConfig(patience_factor=1.0, aging_interval_s=math.inf)
    assert len(_barrier_setup(waited=19.0, config=cfg).starts) == 5
    assert len(_barrier_setup(waited=20.0, config=cfg).starts) == 0
    capped = SchedulerConfig(max_patience_s=5.0, aging_interval_s=math.inf)
    assert len(_barrier_setup(waited=4.9, config=capped).starts) == 5
    assert len(_barrier_setup(waited=5.0, config=capped).starts) == 0
    with pytest.raises(ValueError, match="patience_factor"):
        SchedulerConfig(patience_factor=-1)
    with pytest.raises(ValueError, match="max_patience_s"):
        SchedulerConfig(max_patience_s=math.inf)


def test_higher_priority_still_goes_first_lower_priority_work_waits_behind_it() -> None:
    p = _barrier_setup(barrier_priority=5)
    assert p.starts == () and p.passed == {}
    assert p.waiting["h0"] == "behind barrier (waiting for memory on GPU0)"


def test_aging_does_not_end_patience_for_work_of_its_priority_submitted_later() -> None:
    # The barrier aged one level (it waited an interval); hot jobs submitted now did not, and
    # they are of its priority: they go on until its patience (100 x 20 s, capped at 300 s).
    p = _barrier_setup(waited=61.0, config=SchedulerConfig(patience_factor=100.0))
    assert started(p) == [f"h{i}" for i in range(5)] and p.passed == {"barrier": 5}
    spent = _barrier_setup(waited=300.0, config=SchedulerConfig(patience_factor=100.0))
    assert spent.starts == ()
    assert spent.waiting["barrier"] == "needs 30000 MiB: 1 worker leaves GPU0 for it"


def test_an_aged_barrier_still_holds_back_hot_work_below_its_priority() -> None:
    # Aged by three levels, a priority-2 barrier is passed by none of the priority-0 batch.
    p = _barrier_setup(waited=181.0, barrier_priority=2,
                       config=SchedulerConfig(patience_factor=100.0))
    assert p.starts == () and p.passed == {}
    assert p.waiting["h0"] == "behind barrier (waiting for memory on GPU0)"


def test_starts_ahead_of_the_barrier_do_not_count() -> None:
    big = be("big", 30_000, 1_000)
    hot = be("hot", 2_000, 1_000, conc=100)
    queue = [job("h0", "hot", 9), job("barrier", "big", 5), job("h1", "hot", 5)]
    s = snap([gpu(0, 40_000)], [big, hot], [busy(hot, 0, jobs=10)], queue)
    p = plan(s, NOW)
    assert started(p) == ["h0", "h1"] and p.passed == {"barrier": 1}


def test_a_barrier_waits_for_running_jobs_to_give_memory_back_rather_than_evict() -> None:
    big = be("big", 30_000, 1_000)
    hot = be("hot", 2_000, 1_000, conc=100)  # ten jobs running: 10,000 MiB come back
    queue = [job("barrier", "big", 5, blocked_since=NOW)]
    s = snap([gpu(0, 40_000)], [big, hot], [busy(hot, 0, jobs=10)], queue)
    p = plan(s, NOW)
    assert p.evictions == () and p.starts == ()
    assert "give their memory back, rather than evict" in p.waiting["barrier"]
    assert p.revisit_at == NOW + 4 * 10.0  # then the eviction's cost is no longer worth it
    later = plan(snap([gpu(0, 40_000)], [big, hot], [busy(hot, 0, jobs=10)],
                      [job("barrier", "big", 5, blocked_since=NOW - 40)]), NOW)
    assert "1 worker leaves GPU0 for it" in later.waiting["barrier"]


def test_work_above_every_running_job_waits_for_them_no_longer_than_its_target() -> None:
    # As above, but the ten running jobs are of priority 0 and the barrier of 5: waiting out
    # lower-priority work for want of an eviction is an inversion. It waits at most its
    # target wait (1 s by default), then evicts; running work of its own priority keeps the
    # patience of a batch.
    big = be("big", 30_000, 1_000)
    hot = be("hot", 2_000, 1_000, conc=100)
    other = be("other", 10_000, 0)

    def plan_at(running: int, waited: float) -> Plan:
        workers = [replace(busy(hot, 0, jobs=10), running_priority=running), idle(other, 0)]
        return plan(snap([gpu(0, 50_000)], [big, hot, other], workers,
                         [job("barrier", "big", 5, blocked_since=NOW - waited)]), NOW)

    p = plan_at(0, 0.0)
    assert "give their memory back, rather than evict" in p.waiting["barrier"]
    assert p.revisit_at == NOW + 1.0
    assert evicted(plan_at(0, 1.0)) == ["other"]
    assert "rather than evict" in plan_at(5, 1.0).waiting["barrier"]


def test_cold_jobs_pass_a_barrier_only_in_room_it_does_not_need() -> None:
    big = be("big", 30_000, 1_000)  # 15,000 held by other, 25,000 free: other must go
    other = be("other", 15_000, 0)
    q = [job("b", "big", 1), job("s", "small", 0), job("m", "medium", 0)]
    small, medium = be("small", 10_000, 100), be("medium", 10_001, 100)
    s = snap([gpu(0, 40_000)], [big, small, medium, other], [busy(other, 0)], q)
    p = plan(s, NOW)
    # Once other has left, big takes 30,000 of 40,000: 10,000 it never needs.
    assert started(p) == ["s"]
    assert p.waiting["m"] == "behind b (waiting for memory on GPU0)"


def test_hot_jobs_that_do_not_fit_behind_the_barrier_wait() -> None:
    big = be("big", 30_000, 1_000)
    hot = be("hot", 20_000, 15_000)
    s = snap([gpu(0, 30_000)], [big, hot], [idle(hot, 0)], [job("b", "big", 1), job("h", "hot")])
    p = plan(s, NOW)
    # The idle hot worker is evicted for the barrier: its job waits for it to stop.
    assert evicted(p) == ["hot"] and p.waiting["h"] == "worker stopping"


def test_one_barrier_per_gpu() -> None:
    a, b, c = be("a", 20_000, 1_000), be("b", 20_000, 1_000), be("c", 20_000, 1_000)
    x, y = be("x", 10_000, 0), be("y", 10_000, 0)
    s = snap(
        [gpu(0, 25_000), gpu(1, 25_000)],
        [a, b, c, x, y],
        [idle(x, 0, 60), idle(y, 1, 60)],
        [job("ja", "a", 2), job("jb", "b", 1), job("jc", "c", 0)],
    )
    p = plan(s, NOW)
    # Each GPU gets its first blocked job (the cheapest way to make it fit there); the third
    # finds a barrier on every GPU and waits behind the first.
    assert sorted((e.backend, e.gpu) for e in p.evictions) == [("x", 0), ("y", 1)]
    assert p.waiting["jc"] == "behind ja (waiting for memory on GPU0)"


def test_waiting_view_covers_every_unstarted_job() -> None:
    big = be("big", 30_000, 1_000)
    hot = be("hot", 12_000, 1_000, conc=100)
    ghost_job = job("g", "ghost", 0)
    queue = [job("barrier", "big", 5)] + [job(f"h{i}", "hot", 5) for i in range(3)]
    queue += [job(f"h{i}", "hot", 0) for i in range(3, 6)] + [ghost_job]
    s = snap([gpu(0, 40_000)], [big, hot], [busy(hot, 0, jobs=10)], queue)
    p = plan(s, NOW)
    assert len(p.waiting) == len(queue) - 3
    assert set(p.waiting) == {"barrier", "h3", "h4", "h5", "g"}
    assert p.waiting["g"] == "unknown backend 'ghost'"
    with pytest.raises(KeyError):
        p.waiting["h0"]  # started
    with pytest.raises(KeyError):
        p.waiting["nope"]


def test_worker_on_a_missing_gpu_is_reported() -> None:
    a = be("a")
    p = plan(snap([gpu(0)], [a], [wk("a", 5, "ready", 0, 8_000)], [job("j", "a")]), NOW)
    assert p.starts == () and "GPU5, which is not present" in p.waiting["j"]


# --------------------------------------------------------------------------- determinism


def test_same_snapshot_same_plan_regardless_of_mapping_order() -> None:
    backends = [be(f"b{i}", 5_000 + 1_000 * i, 1_000, reload=float(i % 3)) for i in range(8)]
    workers = [idle(backends[i], i % 2, idle_for=30.0 * i) for i in range(0, 8, 2)]
    queue = [job(f"j{i}", f"b{i % 8}", i % 3, seq=i, at=NOW - 10 * i) for i in range(40)]
    s1 = snap([gpu(0), gpu(1)], backends, workers, queue)
    s2 = snap([gpu(1), gpu(0)], backends[::-1], workers[::-1], queue[::-1])
    p1, p2 = plan(s1, NOW), plan(s2, NOW)
    assert p1 == p2 and p1 == plan(s1, NOW)
    assert p1.starts or p1.evictions


_HASH_SEED_SCRIPT = """
import json
from supervisor.scheduler import (
    BackendInfo, GpuState, QueuedJob, Snapshot, WorkerInfo, plan, queue_sort_key,
)
names = [f"model-{i}" for i in range(12)]
backends = {
    n: BackendInfo(n, 4_000 + 1_500 * i, 1_000, 256, 0, None, 1 + i % 3, False, 1.0 + i % 4)
    for i, n in enumerate(names)
}
workers = {
    n: WorkerInfo(n, i % 3, "ready" if i % 2 else "busy", 0 if i % 2 else 1,
                  backends[n].holds_mib(0 if i % 2 else 1), 900.0 - 10 * i)
    for i, n in enumerate(names[:8])
}
queue = sorted(
    (QueuedJob(f"j{k}", names[(k * 5) % 12], k % 3, k, 700.0 + k, k % 2) for k in range(200)),
    key=queue_sort_key,
)
gpus = [GpuState(g, 30_000, None, 457) for g in range(3)]
p = plan(Snapshot(gpus, backends, workers, queue), 1_000.0)
print(json.dumps([repr(p.starts), repr(p.evictions), sorted(p.passed.items()),
                  sorted(p.waiting.items())]))
"""


@pytest.mark.process
def test_plan_does_not_depend_on_hash_seed() -> None:
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _HASH_SEED_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=pathlib.Path(__file__).resolve().parents[1],
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_narrowing_the_walk_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    backends = [be(f"b{i}", 3_000, 1_000, conc=1) for i in range(6)]
    workers = [busy(b, 0) for b in backends[:5]] + [idle(backends[5], 1)]
    queue = [job(f"j{i}", f"b{i % 5}", i % 4, seq=i, at=NOW - 7 * i) for i in range(3_000)]
    queue.append(job("last", "b5", 0, seq=10_000, at=NOW))
    s = snap([gpu(0, 80_000), gpu(1)], backends, workers, queue)
    wide = plan(s, NOW)
    monkeypatch.setattr(plan_module, "_NARROW_AFTER", 1)
    narrow = plan(s, NOW)
    assert wide == narrow and started(wide) == ["last"]


# --------------------------------------------------------------------------- order


def test_ordered_matches_a_full_sort() -> None:
    queue = [job(f"j{i}", "a", (i * 7) % 4, seq=i, at=100.0 + 13.0 * i) for i in range(200)]
    queue.sort(key=queue_sort_key)
    assert validate_queue(queue) is None
    now = 100.0 + 13.0 * 200
    expect = sorted(queue, key=lambda j: (-effective_priority(j, now, 60.0), j.seq))
    assert list(ordered(queue, now, 60.0)) == expect


def test_validate_queue_reports_contract_breaks() -> None:
    a, b = job("a", "x", 1, seq=1), job("b", "x", 0, seq=2)
    assert validate_queue([b, a]) == "queue not sorted by (-priority, seq) at 1"
    assert validate_queue([a, a]) == "duplicate job id 'a' at 1"
    late = job("c", "x", 1, seq=0, at=NOW + 5)
    assert validate_queue([late, a]) == "submitted_at decreases with seq at 1"


# --------------------------------------------------------------------------- check_submit


def test_refuses_a_backend_bigger_than_every_allowed_gpu() -> None:
    sdxl = be("sdxl", 30_000, 5_000, safety=512)
    s = snap([gpu(0, 24_576), gpu(1, 16_384)], [sdxl])
    assert check_submit(s, "sdxl") == (
        "sdxl needs 30000 MiB at peak (+512 safety) but the largest allowed GPU has 24576 MiB"
    )
    reserved = snap([gpu(0, 30_000, reserve=457)], [sdxl])
    assert check_submit(reserved, "sdxl") == (
        "sdxl needs 30000 MiB at peak (+512 safety) but the largest allowed GPU has 30000 MiB "
        "(29543 usable after its 457 MiB reserve)"
    )
    only_small = snap([gpu(0, 16_000), gpu(1, 80_000)], [be("m", 20_000, allowed=(0,))])
    assert "largest allowed GPU has 16000 MiB" in (check_submit(only_small, "m") or "")
    assert check_submit(snap([gpu(0, 80_000)], [sdxl]), "sdxl") is None


def test_refuses_when_the_queue_is_full() -> None:
    a = be("a")
    s = snap([gpu(0)], [a], [], [job(f"j{i}", "a") for i in range(3)])
    assert check_submit(s, "a", SchedulerConfig(max_queue_depth=4)) is None
    assert check_submit(s, "a", SchedulerConfig(max_queue_depth=3)) == (
        "queue full: 3 jobs waiting; try again later or raise max_queue_depth"
    )


def test_refuses_a_backend_that_allows_no_present_gpu() -> None:
    a = be("a", allowed=(4, 5))
    reason = check_submit(snap([gpu(0), gpu(1)], [a]), "a")
    assert reason == "a allows GPU4, GPU5 but none of them is present (present: GPU0, GPU1)"
    none = be("n", allowed=())
    assert "allows no GPU" in (check_submit(snap([gpu(0)], [none]), "n") or "")


def test_refuses_unknown_backends_and_accepts_unmeasured_ones() -> None:
    s = snap([gpu(0, 8_000)], [be("u", None, None)])
    assert check_submit(s, "zz") == "unknown backend 'zz' (known: u)"
    assert check_submit(s, "u") is None
