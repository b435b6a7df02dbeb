"""The engine's rules, against in-process fake workers (``tests/fake_worker.py``): milliseconds.

Admission, eviction, queue order, cancel, timeouts, start failures, liars, liveness,
idleness, draining and the journal's recovery, each through the real facade and the real
engine, with the fake GPU as the truth of what is held (the engine computes none of it).
The real paths these rules run on (worker processes, sockets, signals, venvs, the journal on
disk under kill -9) are proved by the process tests.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import tempfile
from pathlib import Path

import pytest
from fake_worker import FakeEngine, Script, fake_engine
from waiting import wait_until

from supervisor.engine import EngineConfig
from supervisor.errors import (
    BackendFailed,
    InvalidRequest,
    NothingToDo,
    Refused,
    UnknownBackend,
    UnknownGpu,
    UnknownJob,
)
from supervisor.jobs import JobState, JobView


def mib(weights: int, activation: int, **extra: object) -> dict[str, object]:
    """A descriptor that declares ``weights`` + ``activation`` MiB (no safety margin)."""
    return {"vram": {"weights": f"{weights}MiB", "activation": f"{activation}MiB"},
            "safety": "0MiB", **extra}


def honest(weights: int, activation: int, **kw: object) -> Script:
    return Script(weights_mib=weights, activation_mib=activation, **kw)  # type: ignore[arg-type]


def admitted_at(view: JobView) -> float:
    """When the job left the queue (its worker starting, or straight to running)."""
    return next(t for t, state, _note in view.history if state in ("starting", "running"))


def state_of(fe: FakeEngine, backend: str) -> str:
    b = fe.sup.snapshot().backend(backend)
    assert b is not None
    return b.state


# -- admission -------------------------------------------------------------------------------

def test_two_backends_that_cannot_share_a_gpu_take_turns_and_never_overcommit() -> None:
    scripts = {"a": honest(4096, 1024, job_s=0.01), "b": honest(4096, 1024, job_s=0.01)}
    with fake_engine({"a": mib(4096, 1024), "b": mib(4096, 1024)}, scripts=scripts) as fe:
        jobs = [fe.sup.submit("ab"[i % 2], b"%d" % i) for i in range(8)]
        views = [fe.sup.wait(j, 10) for j in jobs]
        assert all(v.state is JobState.SUCCEEDED for v in views)
        assert [v.data for v in views] == [b"%d" % i for i in range(8)]
    assert fe.gpu.overcommits == [] and fe.gpu.peak[0] <= 8192
    assert {w.backend for w in fe.workers.made} == {"a", "b"}
    # one idle (4096) beside the other running (5120) is over 8 GiB: one at a time
    assert all(w.exited for w in fe.workers.made[:-1])


def test_two_gpus_place_two_backends_side_by_side() -> None:
    scripts = {n: honest(5000, 1000, manual=True) for n in "ab"}
    with fake_engine({"a": mib(5000, 1000), "b": mib(5000, 1000)}, gpus=[8192, 8192],
                     scripts=scripts) as fe:
        ja, jb = fe.sup.submit("a", b"1"), fe.sup.submit("b", b"2")
        for name in "ab":
            wait_until(lambda n=name: fe.workers.live(n), what=f"{name}'s worker")
            fe.on_loop(fe.worker(name).ready)
        wait_until(lambda: fe.sup.job(ja).state is fe.sup.job(jb).state is JobState.RUNNING,
                 what="both running at once")
        assert {fe.worker("a").gpu, fe.worker("b").gpu} == {0, 1}
        fe.on_loop(lambda: fe.worker("a").reply(ja, b"x"))
        fe.on_loop(lambda: fe.worker("b").reply(jb, b"y"))
        assert fe.sup.wait(ja, 5).data == b"x" and fe.sup.wait(jb, 5).data == b"y"


def test_a_backend_too_big_for_every_gpu_is_refused_with_both_numbers() -> None:
    with fake_engine({"huge": mib(100_000, 1000)}) as fe:
        with pytest.raises(Refused) as err:
            fe.sup.submit("huge", b"")
        assert "101000" in str(err.value) and "8192" in str(err.value)
        with pytest.raises(UnknownBackend, match="huge"):
            fe.sup.submit("nope", b"")
        with pytest.raises(UnknownJob):
            fe.sup.job("j-0000000000")
        # a preload of it is refused the same way (it said "starts when it fits", and gave
        # up half a minute later): loaded, it could never run a job
        with pytest.raises(Refused, match=r"not preloaded: huge needs 101000 MiB"):
            fe.sup.preload("huge")
        assert fe.workers.made == []


def test_metadata_that_cannot_travel_is_refused_at_submit() -> None:
    with fake_engine({"a": mib(512, 256)}) as fe:
        with pytest.raises(InvalidRequest, match="plain data"):
            fe.sup.submit("a", b"", metadata={"when": object()})
        assert fe.sup.snapshot().queued == () and fe.workers.made == []


def test_a_cold_job_never_takes_the_room_a_job_waiting_for_evictions_needs() -> None:
    # a and b are idle and hold 3000 each; c needs both evicted and then 7000, leaving 1192
    # it never needs.  d (1300) came later and fits in the 2192 free now, but not in those
    # 1192: it must wait until c is in; e (700) fits in them, so it starts at once.
    backends = {"a": mib(3000, 0), "b": mib(3000, 0), "c": mib(6000, 1000),
                "d": mib(1000, 300), "e": mib(500, 200)}
    scripts = {"a": honest(3000, 0, stop_s=0.2), "b": honest(3000, 0, stop_s=0.2),
               "c": honest(6000, 1000), "d": honest(1000, 300), "e": honest(500, 200, job_s=0.3)}
    with fake_engine(backends, scripts=scripts) as fe:
        fe.sup.preload("a")
        fe.sup.preload("b")
        wait_until(lambda: state_of(fe, "a") == state_of(fe, "b") == "ready", what="a, b ready")
        big, large, tiny = (fe.sup.submit(n, b"") for n in "cde")
        r_big, r_large, r_tiny = (fe.sup.wait(j, 10) for j in (big, large, tiny))
        assert r_big.state is r_large.state is r_tiny.state is JobState.SUCCEEDED
        assert admitted_at(r_big) <= admitted_at(r_large)
        assert admitted_at(r_tiny) <= admitted_at(r_big)
        assert r_big.started_at is not None and r_tiny.finished_at is not None
        assert r_big.started_at < r_tiny.finished_at
    assert fe.gpu.overcommits == []


def test_an_unmeasured_backend_runs_alone_until_a_job_of_it_is_measured() -> None:
    scripts = {"mystery": Script(weights_mib=2000, activation_mib=1000, job_s=0.2),
               "small": honest(500, 200)}
    with fake_engine({"mystery": {"safety": "0MiB"}, "small": mib(500, 200)},
                     scripts=scripts) as fe:
        job = fe.sup.submit("mystery", b"")
        wait_until(lambda: fe.sup.job(job).state is JobState.RUNNING, what="mystery running")
        other = fe.sup.submit("small", b"")
        wait_until(lambda: fe.sup.job(other).waiting, what="small waiting for the GPU")
        assert fe.sup.job(other).state is JobState.QUEUED
        assert fe.sup.wait(job, 5).state is JobState.SUCCEEDED
        assert fe.sup.wait(other, 5).state is JobState.SUCCEEDED
        view = wait_until(lambda: (b := fe.sup.snapshot().backend("mystery"))
                        and b.learned_resident_mib is not None and b, what="resident learned")
        assert view.learned_resident_mib == 2000 and view.learned_peak_mib == 3000
        assert view.admission_peak_mib == 3000
        # measured: it now shares the GPU with small
        a, b = fe.sup.submit("mystery", b""), fe.sup.submit("small", b"")
        wait_until(lambda: fe.sup.job(a).state is fe.sup.job(b).state is JobState.RUNNING
                 or fe.sup.job(b).finished, what="small beside mystery")
        assert fe.sup.wait(a, 5).state is fe.sup.wait(b, 5).state is JobState.SUCCEEDED


def test_higher_priority_runs_first_when_one_at_a_time() -> None:
    with fake_engine({"a": mib(512, 256)}, scripts={"a": honest(512, 256, manual=True)}) as fe:
        first = fe.sup.submit("a", b"first")
        wait_until(lambda: fe.workers.live("a"), what="a's worker")
        later = [fe.sup.submit("a", b"%d" % p, priority=p) for p in (0, 5, -3, 9, 5)]
        fe.on_loop(fe.worker("a").ready)

        def drive() -> bool:
            w = fe.worker("a")
            for job_id in list(w.requests):
                fe.on_loop(lambda j=job_id: w.reply(j, b"ok"))
            return all(fe.sup.job(j).finished for j in (first, *later))

        wait_until(drive, what="every job")
        order = [fe.sup.job(j).data for j in fe.worker("a").sent]
        assert fe.worker("a").sent[0] == first
        assert [fe.sup.job(j).priority for j in fe.worker("a").sent[1:]] == [9, 5, 5, 0, -3]
        assert order[1:].count(b"ok") == 5


# -- cancel and time ---------------------------------------------------------------------------

def test_cancel_a_queued_and_a_running_job() -> None:
    with fake_engine({"a": mib(512, 256)}, scripts={"a": honest(512, 256, manual=True)}) as fe:
        running = fe.sup.submit("a", b"1")
        queued = fe.sup.submit("a", b"2", priority=-1)
        wait_until(lambda: fe.workers.live("a"), what="a's worker")
        fe.on_loop(fe.worker("a").ready)
        wait_until(lambda: fe.sup.job(running).state is JobState.RUNNING, what="running")
        assert fe.sup.cancel(queued).state is JobState.CANCELLED
        fe.sup.cancel(running)
        assert fe.sup.wait(running, 5).state is JobState.CANCELLED
        assert fe.worker("a").sent == [running]  # the queued one never reached the worker


def test_a_worker_that_ignores_cancel_is_killed_and_the_job_is_still_cancelled() -> None:
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, cancel_grace_s=0.2)
    scripts = {"a": honest(512, 256, job_s=30.0, honours_cancel=False)}
    with fake_engine({"a": mib(512, 256)}, scripts=scripts, config=cfg) as fe:
        job = fe.sup.submit("a", b"")
        wait_until(lambda: fe.sup.job(job).state is JobState.RUNNING, what="running")
        worker = fe.worker("a")
        fe.sup.cancel(job)
        result = fe.sup.wait(job, 5)
        assert result.state is JobState.CANCELLED
        assert worker.exited and worker.exit_code == -9  # killed after the grace


def test_a_job_timeout_counts_from_dispatch_and_ends_it_as_timed_out() -> None:
    scripts = {"a": honest(512, 256, job_s=0.3), "slow": honest(512, 256, job_s=30.0)}
    with fake_engine({"a": mib(512, 256, concurrency=1), "slow": mib(512, 256)},
                     scripts=scripts) as fe:
        first = fe.sup.submit("a", b"", timeout=0.5)
        waited = fe.sup.submit("a", b"", timeout=0.5)  # waits ~0.3 s, then runs 0.3 s
        assert fe.sup.wait(first, 5).state is JobState.SUCCEEDED
        assert fe.sup.wait(waited, 5).state is JobState.SUCCEEDED
        late = fe.sup.wait(fe.sup.submit("slow", b"", timeout=0.2), 5)
        assert late.state is JobState.TIMED_OUT and "timed out after 0.2 s" in (late.error or "")


def test_the_descriptors_timeouts_request_counts_from_dispatch_too() -> None:
    with fake_engine({"b": mib(512, 256, timeouts={"request": "0.5s"})},
                     scripts={"b": honest(512, 256, job_s=0.3)}) as fe:
        jobs = [fe.sup.submit("b", b"") for _ in range(2)]  # the second waits ~0.3 s first
        assert [fe.sup.wait(j, 5).state for j in jobs] == [JobState.SUCCEEDED] * 2


def test_progress_chunks_and_metadata_reach_the_job() -> None:
    with fake_engine({"a": mib(512, 256, stream=True)},
                     scripts={"a": honest(512, 256, manual=True)}) as fe:
        sub = fe.sup.subscribe(kinds=["job"])
        job = fe.sup.submit("a", b"", metadata={"user": "ada"})
        wait_until(lambda: fe.workers.live("a"), what="a's worker")
        w = fe.worker("a")
        fe.on_loop(w.ready)
        wait_until(lambda: job in w.requests, what="the request")
        for i in range(1, 5):
            fe.on_loop(lambda i=i: w.progress(job, i / 4, f"step {i}"))
        fe.on_loop(lambda: w.chunk(job, b"one"))
        fe.on_loop(lambda: w.chunk(job, b"two"))
        fe.on_loop(lambda: w.reply(job, b""))
        result = fe.sup.wait(job, 5)
        assert result.metadata == {"user": "ada"} and result.chunks == (b"one", b"two")
        assert w.metadata[job] == {"user": "ada"}  # it travelled with the request
        fractions = []
        while (event := sub.get(timeout=0.2)) is not None:
            if event.job is not None and event.job.id == job and event.job.progress is not None:
                fractions.append(event.job.progress)
        sub.close()
        assert fractions[:4] == [0.25, 0.5, 0.75, 1.0] and fractions == sorted(fractions)


# -- workers that fail -------------------------------------------------------------------------

def test_three_failed_starts_mark_the_backend_failed_until_respawned() -> None:
    script = Script(weights_mib=256, fail_start="weights file is corrupt")
    with fake_engine({"flaky": mib(256, 0)}, scripts={"flaky": script}) as fe:
        queued = fe.sup.submit("flaky", b"x")
        result = fe.sup.wait(queued, 10)
        assert result.state is JobState.FAILED
        assert "weights file is corrupt" in (result.error or "")
        backend = fe.sup.snapshot().backend("flaky")
        assert backend.state == "failed" and backend.init_failures == 3
        assert len(fe.workers.of("flaky")) == 3  # requeued twice: it never ran
        with pytest.raises(BackendFailed):
            fe.sup.submit("flaky", b"x")
        script.fail_start = None
        fe.sup.respawn("flaky")
        wait_until(lambda: state_of(fe, "flaky") == "ready", what="respawned")
        assert fe.sup.wait(fe.sup.submit("flaky", b"x"), 5).data == b"x"


def test_a_worker_that_dies_mid_job_fails_that_job_and_the_backend_restarts() -> None:
    with fake_engine({"a": mib(512, 256)}, scripts={"a": honest(512, 256, job_s=30.0)}) as fe:
        job = fe.sup.submit("a", b"")
        wait_until(lambda: fe.sup.job(job).state is JobState.RUNNING, what="running")
        fe.on_loop(lambda: fe.worker("a").crash(3))
        result = fe.sup.wait(job, 5)
        assert result.state is JobState.FAILED and "exited with code 3" in (result.error or "")
        fe.workers.scripts["a"] = honest(512, 256)
        assert fe.sup.wait(fe.sup.submit("a", b"again"), 5).data == b"again"
        assert len(fe.workers.of("a")) == 2


def test_a_hung_worker_is_killed_by_its_missed_pings_and_its_job_fails_saying_so() -> None:
    with fake_engine({"a": mib(512, 256, timeouts={"ping": "0.3s"})},
                     scripts={"a": honest(512, 256, job_s=30.0)}) as fe:
        job = fe.sup.submit("a", b"")
        wait_until(lambda: fe.sup.job(job).state is JobState.RUNNING, what="running")
        fe.on_loop(fe.worker("a").hang)
        result = fe.sup.wait(job, 5)
        assert result.state is JobState.FAILED
        assert "hung" in (result.error or "") and "timeouts.ping" in (result.error or "")


# -- backends: evict, respawn, preload, zero, keep-alive, drain --------------------------------

def test_evict_respawn_preload_and_zero() -> None:
    with fake_engine({"a": mib(1024, 256), "b": mib(1024, 256)},
                     scripts={"a": honest(1024, 256), "b": honest(1024, 256)}) as fe:
        fe.sup.preload("a")
        first = wait_until(lambda: (b := fe.sup.snapshot().backend("a")).state == "ready"
                         and b.pid, what="a preloaded")
        fe.sup.respawn("a")
        second = wait_until(lambda: (b := fe.sup.snapshot().backend("a")).state == "ready"
                          and b.pid != first and b.pid, what="a respawned")
        assert second != first
        fe.sup.evict("a")
        wait_until(lambda: state_of(fe, "a") == "cold", what="a evicted")
        assert fe.workers.of("a")[-1].exited
        fe.sup.preload("a")
        fe.sup.preload("b")
        wait_until(lambda: state_of(fe, "a") == state_of(fe, "b") == "ready", what="both ready")
        assert sorted(fe.sup.zero()) == ["a", "b"]
        wait_until(lambda: state_of(fe, "a") == state_of(fe, "b") == "cold", what="all cold")
        assert fe.gpu.used(0) == 0


def test_a_respawn_asked_again_while_one_is_under_way_restarts_once() -> None:
    # From the CLI or HTTP as from the TUI: a second respawn while the first is under way
    # (its old worker stopping, its new one starting) would stop the worker it just started.
    with fake_engine({"a": mib(512, 0)},
                     scripts={"a": honest(512, 0, load_s=0.3, stop_s=0.1)}) as fe:
        fe.sup.preload("a")
        first = wait_until(lambda: (b := fe.sup.snapshot().backend("a")).state == "ready"
                           and b.pid, what="a preloaded")
        fe.sup.respawn("a")
        with pytest.raises(NothingToDo, match="already being respawned"):
            fe.sup.respawn("a")  # the old worker still stopping
        wait_until(lambda: fe.sup.snapshot().backend("a").pid not in (None, first),
                   what="a new worker")
        with pytest.raises(NothingToDo, match="already being respawned"):
            fe.sup.respawn("a")  # the new one still starting
        wait_until(lambda: state_of(fe, "a") == "ready", what="a ready again")
        assert len(fe.workers.of("a")) == 2  # one restart
        fe.sup.respawn("a")  # done: a respawn is asked afresh
        wait_until(lambda: len(fe.workers.of("a")) == 3
                   and state_of(fe, "a") == "ready", what="a respawned again")


def test_a_respawn_whose_preload_gave_up_does_not_refuse_a_later_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import supervisor.engine.engine as engine_module

    monkeypatch.setattr(engine_module, "PRELOAD_PATIENCE_S", 0.3)
    scripts = {"a": honest(512, 0, load_s=1.0), "b": honest(7900, 0, job_s=1.5)}
    with fake_engine({"a": mib(512, 0), "b": mib(7900, 0)}, scripts=scripts) as fe:
        job = fe.sup.submit("b", b"x")
        wait_until(lambda: fe.sup.job(job).state is JobState.RUNNING, what="b running")
        fe.sup.respawn("a")  # no worker: its respawn is a preload, and there is no room
        wait_until(lambda: any("gave up preloading a" in line.text
                               for line in fe.sup.snapshot().log), what="the preload to give up")
        fe.sup.wait(job, 10)
        fe.sup.evict("b")
        wait_until(lambda: state_of(fe, "b") == "cold", what="b gone")
        fe.sup.preload("a")  # an ordinary start: no respawn is under way
        wait_until(lambda: state_of(fe, "a") in ("starting", "initializing"), what="a starting")
        fe.sup.respawn("a")  # not refused as "already being respawned"
        wait_until(lambda: len(fe.workers.of("a")) == 2 and state_of(fe, "a") == "ready",
                   what="a respawned")


def test_evicting_a_ready_worker_never_fails_a_job_admitted_in_the_same_instant() -> None:
    with fake_engine({"a": mib(512, 256)}, scripts={"a": honest(512, 256)}) as fe:
        fe.sup.preload("a")
        wait_until(lambda: state_of(fe, "a") == "ready", what="a ready")

        def submit_then_evict() -> str:  # on the engine loop: one instant for both
            job = fe.engine.submit("a", b"x")
            fe.engine.evict("a")
            return job.id

        job_id = fe.on_loop(submit_then_evict)
        assert fe.sup.wait(job_id, 5).state is JobState.SUCCEEDED


def test_an_idle_worker_is_unloaded_after_its_keep_alive() -> None:
    with fake_engine({"a": mib(512, 0, keep_alive="0.2s"), "pinned": mib(512, 0, pinned=True,
                                                                          keep_alive="0.2s")},
                     scripts={"a": honest(512, 0), "pinned": honest(512, 0)}) as fe:
        assert fe.sup.wait(fe.sup.submit("a", b""), 5).state is JobState.SUCCEEDED
        assert fe.sup.wait(fe.sup.submit("pinned", b""), 5).state is JobState.SUCCEEDED
        wait_until(lambda: state_of(fe, "a") == "cold", what="a unloaded")
        assert state_of(fe, "pinned") == "ready"  # pinned: never unloaded for idleness
        assert any("keep_alive" in line.text for line in fe.sup.snapshot().log)


def test_the_scheduler_is_told_when_a_keep_alive_may_unload_a_worker_at_the_soonest() -> None:
    """``BackendRuntime.leaves_in_s`` (the scheduler's ``WorkerInfo.leaves_at``): an idle
    worker's keep-alive left; a busy one's whole keep-alive, which counts from its jobs'
    end; none while nothing unloads it."""
    import dataclasses

    from supervisor.backends.schema import BackendSpec, VramSpec
    from supervisor.engine import BackendRuntime

    spec = BackendSpec(name="m", command=("true",), vram=VramSpec(peak_mib=1000),
                       keep_alive_s=20.0)
    rt = BackendRuntime(spec)
    assert rt.leaves_in_s(100.0) is None  # no worker
    worker = object()
    rt.worker = worker  # type: ignore[assignment]
    rt.usage.idle_since = 95.0
    assert rt.leaves_in_s(100.0) == 15.0
    rt.admitted.append("j-1")  # busy
    assert rt.leaves_in_s(100.0) == 20.0
    rt.admitted.clear()
    rt.usage.unload_after = worker  # type: ignore[assignment]  # keep_alive 0 while it worked
    assert rt.leaves_in_s(100.0) == 0.0
    rt.usage.unload_after = None
    rt.usage.tunnels = 1
    assert rt.leaves_in_s(100.0) is None
    rt.usage.tunnels = 0
    for kept in (dataclasses.replace(spec, keep_alive_s=math.inf),
                 dataclasses.replace(spec, pinned=True)):
        rt.spec = kept
        assert rt.leaves_in_s(100.0) is None, kept


def test_a_draining_gpu_finishes_its_work_and_admits_nothing_new() -> None:
    scripts = {"a": honest(1024, 0, manual=True), "b": honest(1024, 0)}
    with fake_engine({"a": mib(1024, 0, gpus=[0]), "b": mib(1024, 0, gpus=[0])},
                     gpus=[8192, 8192], scripts=scripts) as fe:
        running = fe.sup.submit("a", b"")
        wait_until(lambda: fe.workers.live("a"), what="a's worker")
        fe.on_loop(fe.worker("a").ready)
        wait_until(lambda: fe.sup.job(running).state is JobState.RUNNING, what="a running")
        assert fe.sup.drain(0) == (0,)
        waiting = fe.sup.submit("b", b"")
        wait_until(lambda: fe.sup.job(waiting).waiting, what="b waiting")
        assert fe.sup.job(waiting).state is JobState.QUEUED and not fe.workers.of("b")
        fe.on_loop(lambda: fe.worker("a").reply(running, b"done"))
        assert fe.sup.wait(running, 5).state is JobState.SUCCEEDED
        wait_until(lambda: state_of(fe, "a") == "cold", what="a evicted from the drained GPU")
        with pytest.raises(UnknownGpu, match="no GPU7"):
            fe.sup.drain(7)
        assert fe.sup.drain(0, on=False) == ()
        assert fe.sup.wait(waiting, 5).state is JobState.SUCCEEDED


# -- models that lie ---------------------------------------------------------------------------

def test_an_idle_liar_is_evicted_and_distrusted() -> None:
    scripts = {"liar": Script(weights_mib=3000, activation_mib=0)}  # declares 1 GiB
    with fake_engine({"liar": mib(1024, 256, on_overuse="evict")}, scripts=scripts) as fe:
        assert fe.sup.wait(fe.sup.submit("liar", b""), 5).state is JobState.SUCCEEDED
        wait_until(lambda: state_of(fe, "liar") == "cold", what="the liar evicted")
        b = fe.sup.snapshot().backend("liar")
        assert b.distrusted and b.learned_resident_mib == 3000
        assert any("above what it was admitted with" in x.text for x in fe.sup.snapshot().log)


def test_a_liar_that_overcommits_its_gpu_is_killed_and_runs_alone_next_time() -> None:
    scripts = {"liar": Script(weights_mib=500, activation_mib=6000, job_s=30.0),
               "honest": honest(3000, 0)}
    with fake_engine({"liar": mib(500, 500, on_overuse="warn"), "honest": mib(3000, 0)},
                     scripts=scripts) as fe:
        fe.sup.preload("honest")
        wait_until(lambda: state_of(fe, "honest") == "ready", what="honest ready")
        job = fe.sup.submit("liar", b"")
        result = fe.sup.wait(job, 5)  # warn is its policy, but the GPU is over: killed
        assert result.state is JobState.FAILED and "over-committed" in (result.error or "")
        b = fe.sup.snapshot().backend("liar")
        assert b.distrusted and b.learned_peak_mib == 6500
        assert state_of(fe, "honest") == "ready"  # the honest one was not the victim



def test_an_over_user_whose_jobs_end_together_is_evicted_counted_and_told_once() -> None:
    desc = mib(1024, 256, on_overuse="evict", concurrency=2)
    # Honest while idle (1000 of its 1024), 3000 once a job runs: caught only while both run
    # (both are queued before it is ready, so one step sends both; caught idle, or with one
    # job sent, it would take no second).
    scripts = {"liar": Script(weights_mib=1000, activation_mib=2000, manual=True)}
    with fake_engine({"liar": desc}, scripts=scripts) as fe:
        fe.sup.preload("liar")
        wait_until(lambda: fe.workers.live("liar") is not None, what="a worker")
        w = fe.worker("liar")
        a, b = fe.sup.submit("liar", b"a"), fe.sup.submit("liar", b"b")
        fe.on_loop(w.ready)
        wait_until(lambda: len(w.requests) == 2, what="both jobs running")
        wait_until(lambda: not fe.engine.backends["liar"].conduct.accepting,
                   what="the liar caught")

        def both_end() -> None:  # (in one callback: nothing runs between the two ends)
            w.reply(a, b"A")
            w.reply(b, b"B")

        fe.on_loop(both_end)
        assert fe.sup.wait(a, 5).state is JobState.SUCCEEDED
        assert fe.sup.wait(b, 5).state is JobState.SUCCEEDED
        wait_until(lambda: state_of(fe, "liar") == "cold", what="the liar evicted")
        told = [x.text for x in fe.sup.snapshot().log if x.text.startswith("evicting liar")]
        counted = fe.on_loop(lambda: dict(fe.engine.counters.evictions))
        assert counted == {("liar", "overuse"): 1} and len(told) == 1, (counted, told)


# -- the journal ---------------------------------------------------------------------------------

def test_queued_jobs_come_back_after_a_restart_with_their_ids_and_order() -> None:
    root = Path(tempfile.mkdtemp(prefix="vt-fake-", dir="/tmp"))
    try:
        with fake_engine({"a": mib(512, 0, timeouts={"stop_grace": "0.1s"})},
                         scripts={"a": honest(512, 0, manual=True)}, journal=True,
                         root=root) as fe:
            ids = [fe.sup.submit("a", json.dumps({"n": i}).encode(), priority=i % 2)
                   for i in range(4)]
            wait_until(lambda: fe.workers.live("a"), what="a's worker")
        with fake_engine({"a": mib(512, 0)}, scripts={"a": honest(512, 0)}, journal=True,
                         root=root) as again:
            views = [again.sup.wait(j, 5) for j in ids]
            assert all(v.state is JobState.SUCCEEDED for v in views)
            assert [json.loads(v.data or b"{}")["n"] for v in views] == [0, 1, 2, 3]
            sent = again.worker("a").sent
            assert sent == [ids[1], ids[3], ids[0], ids[2]]  # by priority, then by age
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- many random runs --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_random_work_keeps_every_rule(seed: int) -> None:
    """Random submits, cancels, crashes, evictions and priorities over three backends that
    cannot all fit: every job ends once, in a final state; none is queued and finished;
    the fake GPU (the truth) is never over its size; nothing is left behind."""
    rng = random.Random(seed)
    sizes = {"a": (3000, 1000), "b": (2500, 1000), "c": (4000, 500)}
    backends = {n: mib(*size) for n, size in sizes.items()}
    scripts = {n: honest(*size, job_s=rng.choice([0.0, 0.005, 0.02]))
               for n, size in sizes.items()}
    with fake_engine(backends, scripts=scripts) as fe:
        jobs: list[str] = []
        for _ in range(40):
            op = rng.random()
            if op < 0.6 or not jobs:
                jobs.append(fe.sup.submit(rng.choice("abc"), b"", priority=rng.randint(-2, 2)))
            elif op < 0.75:
                fe.sup.cancel(rng.choice(jobs))
            elif op < 0.85:
                name = rng.choice("abc")
                fe.on_loop(lambda n=name: (w := fe.workers.live(n)) and w.hot and w.crash())
            elif op < 0.95:
                with _refused_is_fine():
                    fe.sup.evict(rng.choice("abc"))
            else:
                queued = [v.id for v in fe.sup.snapshot().queued]
                if queued:
                    with _refused_is_fine():  # it may have started since the snapshot
                        fe.sup.set_priority(rng.choice(queued), rng.randint(-5, 5))
            snap = fe.sup.snapshot()
            queued_ids = {v.id for v in snap.queued}
            assert not queued_ids & {v.id for v in snap.recent}
        ends = [fe.sup.wait(j, 10) for j in jobs]
        assert all(v.finished for v in ends)
        assert all(v.state is not JobState.SUCCEEDED or v.data == b"" for v in ends)
        assert fe.sup.snapshot().queued == ()
    assert fe.gpu.overcommits == []
    assert fe.workers.running == set()  # every worker launched was told to have exited


class _refused_is_fine:
    """Accept a refusal (a busy backend cannot be evicted), nothing else."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: object, tb: object) -> bool:
        return kind is None or (isinstance(kind, type) and issubclass(kind, Refused))


def test_a_stop_that_runs_out_of_time_kills_every_worker_it_started() -> None:
    """The facade's last resort: the engine did not stop within the time given (a worker
    that no longer answers), so every worker it started is killed, none outlives it."""
    with fake_engine({"a": mib(512, 0, timeouts={"stop_grace": "30s"})},
                     scripts={"a": honest(512, 0)}) as fe:
        fe.sup.preload("a")
        wait_until(lambda: state_of(fe, "a") == "ready", 5, "a ready")
        worker = fe.worker("a")
        fe.on_loop(worker.hang)  # it will not exit when asked
        fe.sup.stop(timeout=0.5)
        wait_until(lambda: worker.exited, 5, "the hung worker killed")
        assert worker.exit_code == -9 and fe.gpu.used(0) == 0


def test_a_preload_backend_is_started_with_the_engine() -> None:
    """``preload: true`` (llama-swap's hooks.on_startup.preload): loaded before any job."""
    with fake_engine({"warm": mib(512, 0, preload=True), "cold": mib(512, 0)},
                     scripts={"warm": honest(512, 0), "cold": honest(512, 0)}) as fe:
        wait_until(lambda: state_of(fe, "warm") == "ready", what="warm preloaded")
        assert state_of(fe, "cold") == "cold"


def test_a_tick_that_fails_does_not_end_the_ticker() -> None:
    """One pass of the periodic work raising (a bug somewhere in it) is logged, and the next
    passes still unload idle workers at their keep-alive, expire yields, ping workers."""
    with fake_engine({"a": mib(512, 0, keep_alive="0.3s")},
                     scripts={"a": honest(512, 0)}) as fe:
        watch = fe.engine.watch
        real, failed = watch.expire_ghosts, []

        def once_broken() -> None:
            if not failed:
                failed.append(True)
                raise RuntimeError("a bug in one pass")
            real()

        fe.on_loop(lambda: setattr(watch, "expire_ghosts", once_broken))
        wait_until(lambda: failed, 5, "the broken pass")
        assert fe.sup.wait(fe.sup.submit("a", b""), 5).state is JobState.SUCCEEDED
        wait_until(lambda: state_of(fe, "a") == "cold", what="a unloaded after the bad pass")
