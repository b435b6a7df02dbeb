"""Strangers on a GPU: the pure hysteresis (an injected clock), the plan's evictions for them,
and the engine's answer on fake workers (a stranger is a pid the fake GPU holds for nobody)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fake_worker import FakeEngine, Script, fake_engine
from waiting import wait_until

from supervisor.engine import EngineConfig
from supervisor.engine.others import Others
from supervisor.ledger import Book, GpuBook
from supervisor.scheduler.model import BackendInfo, Evict, GpuState, Snapshot, WorkerInfo
from supervisor.scheduler.plan import plan
from supervisor.scheduler.strangers import StrangerWatch

GIB = 1024


def feed(watch: StrangerWatch, times: list[float], mib: int, held: int = 0,
         total: int = 24 * GIB) -> int:
    out = 0
    for t in times:
        out = watch.observe(t, 0, mib, held, total).counted_mib
    return out


def ticks(start: float, end: float, step: float = 0.1) -> list[float]:
    return [round(start + i * step, 3) for i in range(int(round((end - start) / step)) + 1)]


def test_a_stranger_is_counted_only_once_it_stayed_and_given_back_once_gone_a_while() -> None:
    w = StrangerWatch(arrive_s=3.0, leave_s=3.0, urgent_s=0.3)
    assert feed(w, [0.0], 0) == 0
    assert feed(w, ticks(0.1, 2.9), 4 * GIB) == 0  # not yet 3 s
    assert feed(w, ticks(3.0, 3.2), 4 * GIB) == 4 * GIB
    assert feed(w, ticks(3.3, 6.1), 0) == 4 * GIB  # gone, but not for 3 s yet
    assert feed(w, ticks(6.2, 6.4), 0) == 0


def test_a_one_second_spike_below_the_device_changes_nothing() -> None:
    w = StrangerWatch()
    feed(w, ticks(0.0, 1.0), 0, held=18 * GIB)
    assert feed(w, ticks(1.1, 2.1), 5 * GIB, held=18 * GIB) == 0
    assert feed(w, ticks(2.2, 10.0), 0, held=18 * GIB) == 0


def test_an_over_committed_device_counts_the_stranger_at_once() -> None:
    w = StrangerWatch(urgent_s=0.3)
    feed(w, ticks(0.0, 1.0), 0, held=18 * GIB)
    v = w.observe(1.1, 0, 10 * GIB, 18 * GIB, 24 * GIB)
    assert v.counted_mib == 0 and v.over_mib == 0  # one reading is not enough
    assert feed(w, ticks(1.2, 1.3), 10 * GIB, held=18 * GIB) == 0
    v = w.observe(1.4, 0, 10 * GIB, 18 * GIB, 24 * GIB)
    assert v.urgent and v.counted_mib == 10 * GIB and v.over_mib == 4 * GIB


def test_what_was_there_before_the_engine_looked_is_counted_at_once() -> None:
    w = StrangerWatch()
    assert w.observe(0.0, 0, 3 * GIB, 0, 24 * GIB).counted_mib == 3 * GIB


def test_a_level_that_dips_is_counted_at_its_lowest() -> None:
    w = StrangerWatch(arrive_s=1.0, leave_s=1.0)
    feed(w, [0.0], 0)
    for t in ticks(0.1, 2.0):
        w.observe(t, 0, 2 * GIB if int(t * 10) % 2 else 3 * GIB, 0, 24 * GIB)
    assert w.counted()[0] == 2 * GIB


def test_bad_hysteresis_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="arrive_s"):
        StrangerWatch(arrive_s=-1)


# -- the plan ------------------------------------------------------------------------------

def info(name: str, weights: int, reload_s: float) -> BackendInfo:
    return BackendInfo(name=name, peak_mib=weights + GIB, activation_mib=GIB,
                       reload_cost_s=reload_s)


def test_the_plan_evicts_idle_workers_cheapest_first_until_the_device_fits() -> None:
    backends = {"sdxl": info("sdxl", 9 * GIB, 20.0), "llm": info("llm", 8 * GIB, 5.0),
                "busy": info("busy", 2 * GIB, 1.0)}
    workers = {
        "sdxl": WorkerInfo("sdxl", 0, "ready", 0, 9 * GIB, idle_since=0.0),
        "llm": WorkerInfo("llm", 0, "ready", 0, 8 * GIB, idle_since=0.0),
        "busy": WorkerInfo("busy", 0, "busy", 1, 3 * GIB),
    }
    gpu = GpuState(0, 24 * GIB, None, foreign_mib=6 * GIB)  # 20 + 6 > 24: 2 GiB over
    p = plan(Snapshot(gpus=(gpu,), backends=backends, workers=workers), 10.0)
    assert [(e.backend, e.others) for e in p.evictions] == [("llm", True)]
    assert "others hold" in p.evictions[0].reason
    fits = GpuState(0, 24 * GIB, None, foreign_mib=4 * GIB)
    assert not plan(Snapshot(gpus=(fits,), backends=backends, workers=workers), 10.0).evictions


def test_the_plan_never_touches_a_running_job_for_strangers() -> None:
    backends = {"busy": info("busy", 10 * GIB, 1.0)}
    workers = {"busy": WorkerInfo("busy", 0, "busy", 1, 11 * GIB)}
    gpu = GpuState(0, 24 * GIB, None, foreign_mib=20 * GIB)
    assert not plan(Snapshot(gpus=(gpu,), backends=backends, workers=workers), 1.0).evictions


# -- the engine on fakes -------------------------------------------------------------------

STRANGER = 4_242


def test_the_engine_evicts_for_a_stranger_and_says_who_took_the_memory() -> None:
    def honest(w: int, a: int) -> Script:
        return Script(weights_mib=w, activation_mib=a, job_s=0.01)

    descs = {n: {"vram": {"weights": "3GiB", "activation": "512MiB"}, "safety": "0MiB"}
             for n in "ab"}
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_leave_s=0.5)
    with fake_engine(descs, scripts={"a": honest(3 * GIB, 512), "b": honest(3 * GIB, 512)},
                     config=cfg) as fe:
        fe.sup.preload("a")
        fe.sup.preload("b")
        wait_until(lambda: all(fe.sup.snapshot().backend(n).state == "ready" for n in "ab"),
                   what="both loaded")
        fe.gpu.hold(STRANGER, 0, GIB)  # 6 + 1 of 8 GiB: it fits, nothing moves
        fe.gpu.hold(STRANGER + 1, 0, 3 * GIB)  # 6 + 4 > 8 GiB: one of them must go
        wait_until(lambda: fe.gpu.used(0) <= 8 * GIB, deadline=5, what="the device fits")
        states = {n: fe.sup.snapshot().backend(n).state for n in "ab"}
        gone = [n for n, s in states.items() if s != "ready"]
        assert len(gone) == 1, states  # one was enough
        lines = [line.text for line in fe.sup.snapshot().log]
        assert any(t.startswith(f"evicted {gone[0]}: 4.0 GiB taken by pid 4243")
                   for t in lines), lines
        fe.gpu.hold(STRANGER, 0, 3 * GIB)  # now 6 GiB of others beside 3 of ours
        wait_until(lambda: all(fe.sup.snapshot().backend(n).state == "cold" for n in "ab"),
                   deadline=5, what="both evicted")
        job = fe.sup.submit(gone[0], b"x")  # 3.5 GiB does not fit beside 6: it waits
        assert fe.sup.job(job).state == "queued"
        fe.gpu.release(STRANGER)
        fe.gpu.release(STRANGER + 1)
        assert fe.sup.wait(job, 10).state == "succeeded"
        assert all(used <= 8 * GIB for _g, used in fe.gpu.overcommits[2:])


def test_how_long_a_device_stays_over_is_told() -> None:
    w = StrangerWatch(urgent_s=0.0)
    assert w.observe(0.0, 0, 0, 20 * GIB, 24 * GIB).over_for_s == 0
    assert w.observe(0.1, 0, 6 * GIB, 20 * GIB, 24 * GIB).over_for_s == 0  # over from now
    assert w.observe(1.1, 0, 6 * GIB, 20 * GIB, 24 * GIB).over_for_s == pytest.approx(1.0)
    assert w.observe(1.2, 0, 6 * GIB, 18 * GIB, 24 * GIB).over_for_s == 0  # it fits


def test_the_clock_of_an_over_committed_device_stops_when_the_stranger_leaves() -> None:
    """Hysteresis keeps a stranger's memory held back ``leave_s`` after it left; the device
    it over-committed fits again meanwhile, so the cancel policy's clock stops at once (it
    ran on to 4 s before and cancelled a job for a stranger gone 1.5 s)."""
    w = StrangerWatch(arrive_s=3.0, leave_s=3.0, urgent_s=0.3)
    held = 3 * GIB + 256  # a running job: nothing idle to evict
    feed(w, ticks(0.0, 0.4), 0, held=held)
    over = [w.observe(t, 0, 22 * GIB, held, 24 * GIB) for t in ticks(0.5, 2.4)]
    assert over[-1].over_mib and over[-1].over_for_s == pytest.approx(1.6)  # counted from 0.8
    after = [w.observe(t, 0, 0, held, 24 * GIB) for t in ticks(2.5, 5.3)]
    assert all(v.counted_mib == 22 * GIB and v.over_mib for v in after)  # still held back
    assert [v.over_for_s for v in after] == [0.0] * len(after)
    back = [w.observe(t, 0, 22 * GIB, held, 24 * GIB) for t in ticks(5.4, 5.9)]
    assert back[0].over_for_s == 0 and back[-1].over_for_s == pytest.approx(0.5)  # afresh


@pytest.mark.parametrize("policy", ["wait", "cancel"])
def test_a_running_job_is_cancelled_for_others_only_when_the_policy_says_so(policy: str
                                                                            ) -> None:
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_policy=policy, others_cancel_after_s=0.3)
    descs = {"a": {"vram": {"weights": "3GiB", "activation": "512MiB"}, "safety": "0MiB"}}
    with fake_engine(descs, scripts={"a": Script(weights_mib=3 * GIB, activation_mib=512,
                                                 job_s=1.2)}, config=cfg) as fe:
        job = fe.sup.submit("a", b"x")
        wait_until(lambda: fe.sup.job(job).state == "running", what="running")
        fe.gpu.hold(STRANGER, 0, 6 * GIB)  # 3.5 + 6 > 8 GiB, and nothing idle to evict
        if policy == "cancel":
            assert fe.sup.wait(job, 5).state == "cancelled"
            assert "others need its GPU" in (fe.sup.job(job).error or "")
        else:
            assert fe.sup.wait(job, 5).state == "succeeded"


@contextlib.contextmanager
def _a_stranger_came_and_left(cfg: EngineConfig, job_s: float) -> Iterator[FakeEngine]:
    """A 3.5 GiB job runs while a stranger over-commits the GPU (6 GiB beside it, nothing
    idle to evict), is counted, and leaves; the job ends well: the engine, for the rest."""
    descs = {"a": {"vram": {"weights": "3GiB", "activation": "512MiB"}, "safety": "0MiB"}}
    with fake_engine(descs, scripts={"a": Script(weights_mib=3 * GIB, activation_mib=512,
                                                 job_s=job_s)}, config=cfg) as fe:
        job = fe.sup.submit("a", b"x")
        wait_until(lambda: fe.sup.job(job).state == "running", what="running")
        fe.gpu.hold(STRANGER, 0, 6 * GIB)
        wait_until(lambda: fe.sup.snapshot().gpus[0].others_mib, what="the stranger counted")
        fe.gpu.release(STRANGER)
        assert fe.sup.wait(job, 10).state == "succeeded", fe.sup.job(job).error
        yield fe


def test_a_running_job_is_not_cancelled_for_a_stranger_that_left() -> None:
    """The stranger over-commits the GPU, is counted, and leaves well before
    ``others_cancel_after_s``; its memory stays held back ``others_leave_s`` after, which
    must not count as the GPU staying over-committed: the job finishes."""
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_policy="cancel", others_cancel_after_s=1.0, others_leave_s=30.0)
    with _a_stranger_came_and_left(cfg, job_s=2.5) as fe:
        assert fe.sup.snapshot().gpus[0].others_mib == 6 * GIB  # still held back meanwhile
        lines = [line.text for line in fe.sup.snapshot().log]
        assert not [t for t in lines if "cancelling" in t], lines


def test_that_others_left_a_gpu_is_said_once() -> None:
    """Nothing idle to evict, so the GPU stays over until the stranger's memory stops being
    held back: then "others left" says it all, with no "fits again beside 0 MiB" beside it."""
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_leave_s=0.3)
    with _a_stranger_came_and_left(cfg, job_s=1.0) as fe:
        wait_until(lambda: any(line.text.startswith("others left GPU0")
                               for line in fe.sup.snapshot().log), 5, "others left, said")
        lines = [line.text for line in fe.sup.snapshot().log]
        assert not [t for t in lines if "(0 MiB held back" in t], lines


def test_a_model_evicted_for_others_that_left_says_so() -> None:
    """A job holds the GPU while a stranger over-commits it, then the stranger leaves; its
    memory stays held back (``others_leave_s``), so the model, idle once its job ends, is
    evicted for it: the event says for whom it was held back, not that it is taken."""
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_leave_s=30.0)
    with _a_stranger_came_and_left(cfg, job_s=1.0) as fe:

        def evicted() -> list[str]:
            return [t.text for t in fe.sup.snapshot().log if t.text.startswith("evicted a")]

        line = wait_until(evicted, deadline=5, what="a evicted")[0]
        assert line.startswith(f"evicted a: 6.0 GiB held back on GPU0 for pid {STRANGER} ("), \
            line
        assert " s ago (frees " in line and "taken" not in line, line


def test_with_the_cancel_policy_idle_models_go_first_even_when_they_are_slow_to_go() -> None:
    """An idle model still letting go (its stop takes 1 s) is the room a running job waits
    for: ``cancel`` is for a GPU with nothing idle left, not a race against a slow stop."""
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_policy="cancel", others_cancel_after_s=0.3)
    descs = {"a": {"vram": {"weights": "2GiB", "activation": "512MiB"}, "safety": "0MiB"},
             "idle": {"vram": {"weights": "3GiB", "activation": "0MiB"}, "safety": "0MiB"}}
    scripts = {"a": Script(weights_mib=2 * GIB, activation_mib=512, job_s=1.5),
               "idle": Script(weights_mib=3 * GIB, stop_s=1.0)}
    with fake_engine(descs, scripts=scripts, config=cfg) as fe:
        assert fe.sup.wait(fe.sup.submit("idle", b""), 5).state == "succeeded"
        job = fe.sup.submit("a", b"x")
        wait_until(lambda: fe.sup.job(job).state == "running", what="running")
        fe.gpu.hold(STRANGER, 0, 3 * GIB)  # 2.5 + 3 + 3 > 8 GiB: the idle model must go
        assert fe.sup.wait(job, 10).state == "succeeded"  # it went; the job was not cancelled


def sample(strangers: dict[int, int], unlisted: int = 0) -> SimpleNamespace:
    """A monitor's last sample of GPU0 (24 GiB, none of ours on it): ``strangers`` pid -> MiB
    the driver lists, and ``unlisted`` MiB the device counts as used that no process holds."""
    foreign = sum(strangers.values()) + unlisted
    reading = SimpleNamespace(used_mib=foreign, total_mib=24 * GIB)
    return SimpleNamespace(readings={0: reading}, foreign={0: foreign}, owners={},
                           elsewhere={}, strangers_mib=lambda _index: foreign,
                           per_gpu=lambda: {0: dict(strangers)})


def no_book() -> Book:
    return Book({0: GpuBook(0, 24 * GIB, 0, None, None, 0)})


def test_memory_held_back_for_others_that_left_is_not_said_to_be_taken() -> None:
    """Once strangers let go, hysteresis holds their memory back a while: an eviction then
    names who left and when, not "taken by processes the driver does not list"."""
    notes: list[str] = []
    others = Others(lambda _level, text: notes.append(text), EngineConfig(others_leave_s=3.0))
    evict = Evict("long", 0, 2 * GIB, "others hold it", others=True)
    others.observe(0.0, sample({STRANGER: 6 * GIB}), no_book)  # counted at once: it was there
    assert others.counted[0] == 6 * GIB
    assert others.evicted(evict).startswith(f"evicted long: 6.0 GiB taken by pid {STRANGER} (")
    others.observe(1.0, sample({}), no_book)
    others.observe(2.5, sample({}), no_book)
    assert others.counted[0] == 6 * GIB  # held back
    line = others.evicted(evict)
    assert line.startswith(f"evicted long: 6.0 GiB held back on GPU0 for pid {STRANGER} ("), line
    assert line.endswith("), gone 1.5 s ago (frees 2.0 GiB)"), line
    assert "taken" not in line and "driver does not list" not in line

    others.observe(2.6, sample({}, unlisted=5 * GIB), no_book)  # nobody listed holds it
    assert others.who(0) == "processes the driver does not list"
    others.observe(3.0, sample({}), no_book)
    assert others.who(0) == "others gone 0.0 s ago"


def test_what_is_counted_stays_between_what_lasted_and_what_was_seen_lately() -> None:
    """A fixed-seed walk: after every reading, once the windows are covered, the counted
    figure is at least the least seen over ``arrive_s`` and at most the most seen over
    ``leave_s`` (an over-committed device only lifts it to what is there now)."""
    rng = random.Random(26)
    for _ in range(20):
        arrive, leave = rng.choice([0.5, 1.0, 3.0]), rng.choice([0.5, 1.0, 3.0])
        w = StrangerWatch(arrive, leave, urgent_s=rng.choice([0.0, 0.3]))
        seen: list[tuple[float, int]] = []
        t, mib = 0.0, 0
        for _ in range(300):
            t = round(t + rng.choice([0.05, 0.1, 0.25]), 3)
            mib = max(0, mib + rng.choice([-4, -1, 0, 0, 0, 1, 4]) * GIB)
            held = rng.choice([0, 8, 16, 20]) * GIB
            v = w.observe(t, 0, mib, held, 24 * GIB)
            seen.append((t, mib))
            if t < max(arrive, leave) + 0.3:
                continue

            assert v.counted_mib <= max(window(seen, t, leave)), (t, v)
            if not v.urgent:
                assert v.counted_mib >= min(window(seen, t, arrive)), (t, v)


def window(seen: list[tuple[float, int]], t: float, span: float) -> list[int]:
    """What was seen from ``span`` before ``t`` (the reading in force then included)."""
    start = max(s for s, _ in seen if s <= t - span + 1e-6)
    return [m for s, m in seen if s >= start]


def test_a_job_whose_model_loaded_while_others_took_its_room_starts_once_it_fits() -> None:
    """A stranger comes while the model loads and takes the room its job was admitted with:
    once loaded, the job is not sent (its activation would over-commit the GPU; the fake
    GPU's own count says whether it did); it starts when the stranger leaves."""
    desc = {"vram": {"weights": "1GiB", "activation": "512MiB"}, "safety": "0MiB"}
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_leave_s=0.2)
    with fake_engine({"a": desc}, scripts={"a": Script(weights_mib=GIB, activation_mib=512,
                                                       load_s=0.5, job_s=0.05)},
                     config=cfg) as fe:
        job = fe.sup.submit("a", b"x")
        wait_until(lambda: fe.workers.of("a"), 5, "a's worker started")
        fe.gpu.hold(STRANGER, 0, 7 * GIB - 256)  # fits beside the weights, not the job's too
        wait_until(lambda: any("start once it fits" in line.text
                               for line in fe.sup.snapshot().log), 5, "the job held")
        (worker,) = fe.workers.of("a")
        assert fe.sup.job(job).state == "starting" and worker.sent == []
        fe.gpu.release(STRANGER)
        assert fe.sup.wait(job, 10).state == "succeeded"
    assert all(used <= 8 * GIB for _g, used in fe.gpu.overcommits), fe.gpu.overcommits
