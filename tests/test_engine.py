"""The engine end to end: real worker processes, real sockets, the simulated GPU."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from engine_support import ROOT, UsageWatcher, engine, sim_backend, wait_for

from supervisor import (
    BackendFailed,
    EngineRunning,
    JobState,
    JobView,
    Refused,
    Supervisor,
    UnknownBackend,
    UnknownJob,
)
from supervisor.engine import EngineConfig


def req(**kw: object) -> bytes:
    return json.dumps(kw).encode()


def test_three_backends_that_cannot_all_fit_thirty_jobs() -> None:
    # 8 GiB: a and b fit together (2x(2+1 GiB)+safety), c (4+2 GiB) needs both gone.
    backends = [
        sim_backend("a", 2048, 1024, priority=0),
        sim_backend("b", 2048, 1024, priority=5),
        sim_backend("c", 4096, 2048, priority=0),
    ]
    with engine(backends) as sup, UsageWatcher(sup, "sim:8GiB") as watch:
        names = ["a", "b", "c"]
        ids = []
        for i in range(30):
            backend = names[(i * 7) % 3]
            ids.append(sup.submit(backend, req(steps=2, step_s=0.01), priority=i % 3))
        results = [sup.wait(j, timeout=90) for j in ids]
        assert [r.state for r in results] == [JobState.SUCCEEDED] * 30
        assert all(r.passed <= 3 for r in results), [r.passed for r in results]
        log = [line.text for line in sup.snapshot().log]
    assert watch.samples > 20
    assert watch.overcommits == []
    assert watch.max_used[0] <= 8192
    assert any(text.startswith("evicting") for text in log), log


def test_higher_priority_runs_first_when_one_at_a_time() -> None:
    # One GPU that holds one model at a time: order is priority, then FIFO.
    backends = [sim_backend(n, 3000, 1000) for n in ("x", "y", "z")]
    with engine(backends, gpus="sim:5GiB") as sup:
        blocker = sup.submit("x", req(steps=20, step_s=0.02))
        wait_for(lambda: sup.job(blocker).state is JobState.RUNNING, what="blocker running")
        low = sup.submit("y", req(steps=1), priority=0)
        high = sup.submit("z", req(steps=1), priority=5)
        r_low, r_high = sup.wait(low, 60), sup.wait(high, 60)
        assert r_low.state is r_high.state is JobState.SUCCEEDED
        assert r_high.started_at is not None and r_low.started_at is not None
        assert r_high.started_at < r_low.started_at


def test_worker_killed_mid_job_fails_that_job_and_the_backend_restarts() -> None:
    with engine([sim_backend("a", 1024, 512)]) as sup:
        job = sup.submit("a", req(steps=200, step_s=0.05))
        wait_for(lambda: sup.job(job).state is JobState.RUNNING, what="job running")
        pid = wait_for(lambda: sup.snapshot().backend("a").pid, what="worker pid")
        os.kill(pid, signal.SIGKILL)
        result = sup.wait(job, 20)
        assert result.state is JobState.FAILED
        assert "code -9" in (result.error or "")
        assert "a.log" in (result.error or "")
        wait_for(lambda: sup.snapshot().backend("a").state == "cold", what="backend cold")
        again = sup.wait(sup.submit("a", req(steps=1)), 30)
        assert again.state is JobState.SUCCEEDED
        assert json.loads(again.data or b"{}")["pid"] != pid


def test_cancel_queued_and_running_jobs() -> None:
    with engine([sim_backend("a", 1024, 512)]) as sup:
        running = sup.submit("a", req(steps=500, step_s=0.02))
        queued = sup.submit("a", req(steps=1))
        wait_for(lambda: sup.job(running).state is JobState.RUNNING, what="job running")
        pid = sup.snapshot().backend("a").pid
        view = sup.cancel(queued)
        assert view.state is JobState.CANCELLED  # a queued job leaves at once
        sup.cancel(running)
        result = sup.wait(running, 10)
        assert result.state is JobState.CANCELLED
        # The worker cancelled cooperatively: it is still the same process and serves again.
        after = sup.wait(sup.submit("a", req(steps=1)), 20)
        assert after.state is JobState.SUCCEEDED
        assert json.loads(after.data or b"{}")["pid"] == pid


def test_a_worker_that_ignores_cancel_is_killed_and_the_job_is_still_cancelled(
        tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent("""
        import time, worker_sdk

        @worker_sdk.predict
        def predict(payload):
            time.sleep(60)  # never looks at cancellation
            return b"late"
    """))
    spec = {"name": "stubborn", "script": str(script), "vram": "256MiB",
            "timeouts": {"stop_grace": "1s"}}
    with engine([spec], config=EngineConfig(reserve_mib=0, cancel_grace_s=0.5)) as sup:
        job = sup.submit("stubborn", b"x")
        wait_for(lambda: sup.job(job).state is JobState.RUNNING, what="job running")
        sup.cancel(job)
        assert sup.wait(job, 15).state is JobState.CANCELLED


def test_two_gpus_place_backends_side_by_side() -> None:
    backends = [sim_backend("a", 4096, 1024), sim_backend("b", 4096, 1024)]
    with engine(backends, gpus="sim:8GiB,sim:8GiB") as sup:
        ja = sup.submit("a", req(steps=30, step_s=0.02))
        jb = sup.submit("b", req(steps=30, step_s=0.02))
        wait_for(lambda: sup.job(ja).state is JobState.RUNNING
                 and sup.job(jb).state is JobState.RUNNING, what="both running at once")
        ra, rb = sup.wait(ja, 30), sup.wait(jb, 30)
        assert {ra.gpu, rb.gpu} == {0, 1}
        # A second job of a prefers a's GPU, where it is already hot.
        again = sup.wait(sup.submit("a", req(steps=1)), 30)
        assert again.gpu == ra.gpu


def test_a_backend_too_big_for_every_gpu_is_refused_with_both_numbers() -> None:
    with engine([sim_backend("huge", 100_000, 1000)]) as sup:
        with pytest.raises(Refused) as err:
            sup.submit("huge", b"")
        assert "101256" in str(err.value) and "8192" in str(err.value)
        with pytest.raises(UnknownBackend) as unknown:
            sup.submit("nope", b"")
        assert "huge" in str(unknown.value)
        with pytest.raises(UnknownJob):
            sup.job("j-0000000000")


def test_init_failures_three_times_mark_the_backend_failed_until_respawned(
        tmp_path: Path) -> None:
    flag = tmp_path / "broken"
    flag.write_text("yes")
    script = tmp_path / "flaky.py"
    script.write_text(textwrap.dedent(f"""
        import os, worker_sdk

        @worker_sdk.initialize
        def load():
            if os.path.exists({str(flag)!r}):
                raise RuntimeError("weights file is corrupt")

        @worker_sdk.predict
        def predict(payload):
            return b"ok"
    """))
    spec = {"name": "flaky", "script": str(script), "vram": "256MiB"}
    with engine([spec]) as sup:
        job = sup.submit("flaky", b"x")
        result = sup.wait(job, 60)
        assert result.state is JobState.FAILED
        assert "weights file is corrupt" in (result.error or "")
        backend = sup.snapshot().backend("flaky")
        assert backend.state == "failed" and backend.init_failures == 3
        with pytest.raises(BackendFailed):
            sup.submit("flaky", b"x")
        flag.unlink()
        sup.respawn("flaky")
        wait_for(lambda: sup.snapshot().backend("flaky").state == "ready", what="respawned")
        assert sup.wait(sup.submit("flaky", b"x"), 30).data == b"ok"


def test_evict_respawn_preload_and_zero() -> None:
    with engine([sim_backend("a", 1024, 256), sim_backend("b", 1024, 256)]) as sup:
        sup.preload("a")
        first = wait_for(lambda: sup.snapshot().backend("a").pid, what="preloaded a")
        wait_for(lambda: sup.snapshot().backend("a").state == "ready", what="a ready")
        sup.respawn("a")
        second = wait_for(lambda: (b := sup.snapshot().backend("a")).state == "ready"
                          and b.pid != first and b.pid, what="a respawned")
        assert second != first
        sup.evict("a")
        wait_for(lambda: sup.snapshot().backend("a").state == "cold", what="a evicted")
        with pytest.raises(ProcessLookupError):
            os.kill(second, 0)
        sup.preload("a")
        sup.preload("b")
        wait_for(lambda: all(b.state == "ready" for b in sup.snapshot().backends),
                 what="both ready")
        assert sorted(sup.zero()) == ["a", "b"]
        wait_for(lambda: all(b.state == "cold" for b in sup.snapshot().backends),
                 what="all cold")


def test_an_unmeasured_backend_runs_alone_until_measured(tmp_path: Path) -> None:
    unmeasured = sim_backend("mystery", 2048, 1024)
    del unmeasured["vram"]
    backends = [unmeasured, sim_backend("small", 512, 256)]
    with engine(backends) as sup:
        job = sup.submit("mystery", req(steps=60, step_s=0.02))
        wait_for(lambda: sup.job(job).state is JobState.RUNNING, what="mystery running")
        other = sup.submit("small", req(steps=1))
        wait_for(lambda: sup.job(other).waiting, what="small waiting for the GPU")
        assert sup.job(other).state is JobState.QUEUED
        assert sup.wait(job, 30).state is JobState.SUCCEEDED
        assert sup.wait(other, 30).state is JobState.SUCCEEDED


def test_a_job_timeout_ends_it_as_timed_out() -> None:
    with engine([sim_backend("a", 512, 256)]) as sup:
        job = sup.submit("a", req(steps=500, step_s=0.02), timeout=0.5)
        result = sup.wait(job, 20)
        assert result.state is JobState.TIMED_OUT
        assert "timed out" in (result.error or "")


def test_progress_and_metadata_reach_the_job() -> None:
    with engine([sim_backend("a", 512, 256)]) as sup:
        sub = sup.subscribe(kinds=["job"])
        job = sup.submit("a", req(steps=4, step_s=0.02), metadata={"user": "ada"})
        result = sup.wait(job, 20)
        body = json.loads(result.data or b"{}")
        assert body["metadata"] == {"user": "ada"}
        fractions = []
        while (event := sub.get(timeout=0.5)) is not None:
            if event.job is not None and event.job.id == job and event.job.progress is not None:
                fractions.append(event.job.progress)
        sub.close()
        assert fractions and fractions == sorted(fractions)


def test_an_unmodified_verda_io_worker_runs_as_a_backend(tmp_path: Path) -> None:
    script = tmp_path / "verda_echo.py"
    script.write_text(textwrap.dedent("""
        import verda_io

        @verda_io.predict
        def predict(payload: bytes):
            if payload.startswith(b"stream"):
                return (bytes([c]) for c in b"abc")
            return verda_io.Response(payload.upper(), headers={"X-Peer": "verda"},
                                     status_code=201)
    """))
    plain = {"name": "verda", "command": [sys.executable, "-m", "verda_io", str(script)],
             "vram": "256MiB"}
    streaming = dict(plain, name="verda-stream", stream=True)
    with engine([plain, streaming]) as sup:
        result = sup.wait(sup.submit("verda", b"hello"), 30)
        assert result.state is JobState.SUCCEEDED
        assert (result.data, result.status_code) == (b"HELLO", 201)
        assert result.headers == {"X-Peer": "verda"}
        streamed = sup.wait(sup.submit("verda-stream", b"stream"), 30)
        assert streamed.chunks == (b"a", b"b", b"c")


def test_a_second_engine_on_the_same_runtime_directory_is_refused() -> None:
    with engine([sim_backend("a", 512, 256)]) as sup:
        twin = Supervisor(sup.engine, sup.paths)
        with pytest.raises(EngineRunning) as err:
            twin.start_in_thread()
        assert str(os.getpid()) in str(err.value)


def test_demo_backends_load_when_nothing_is_configured(tmp_path: Path) -> None:
    env = dict(os.environ, VRAMTUI_RUNTIME_DIR=str(tmp_path / "r"),
               VRAMTUI_STATE_DIR=str(tmp_path / "s"), VRAMTUI_CONFIG_DIR=str(tmp_path / "c"))
    env.pop("VRAMTUI_BACKENDS", None)
    sup = Supervisor.from_config(gpus="sim:24GiB", environ=env)
    names = set(sup.engine.backends)
    assert {"sdxl-sim", "llm-8b-sim", "flux-sim", "echo"} <= names
    assert "demo" in (sup.engine.monitor.notice or "")
    assert (ROOT / "examples" / "demo" / "backends.yaml").exists()


def test_a_cold_job_never_takes_the_room_a_job_waiting_for_evictions_needs() -> None:
    # a and b are idle and hold the GPU (3256 MiB each with their context); c needs both
    # evicted and then 7408 MiB, leaving 784 MiB it never needs. d (1112 MiB) came later and
    # fits in the 1680 MiB free now, but not in those 784: it must wait until c is in; e
    # (612 MiB) fits in them, so it starts at once, beside the switch (packing).
    backends = [sim_backend("a", 3000, 256), sim_backend("b", 3000, 256),
                sim_backend("c", 6000, 1024), sim_backend("d", 600, 128),
                sim_backend("e", 100, 128)]
    with engine(backends) as sup, UsageWatcher(sup, "sim:8GiB") as watch:
        sup.preload("a")
        sup.preload("b")
        wait_for(lambda: all(sup.snapshot().backend(n).state == "ready" for n in "ab"),
                 what="a and b ready")
        big = sup.submit("c", req(steps=1))
        large = sup.submit("d", req(steps=1))
        tiny = sup.submit("e", req(steps=20, step_s=0.05))
        r_big, r_large, r_tiny = sup.wait(big, 60), sup.wait(large, 60), sup.wait(tiny, 60)
        assert r_big.state is r_large.state is r_tiny.state is JobState.SUCCEEDED
        assert admitted_at(r_big) <= admitted_at(r_large)
        assert admitted_at(r_tiny) <= admitted_at(r_big)
        assert r_tiny.started_at is not None and r_tiny.finished_at is not None
        assert r_big.started_at is not None and r_big.started_at < r_tiny.finished_at
    assert watch.overcommits == []


def admitted_at(view: JobView) -> float:
    """When the job left the queue (its worker starting, or straight to running)."""
    return next(t for t, state, _note in view.history if state in ("starting", "running"))


def test_queued_jobs_survive_an_engine_restart_with_their_ids(tmp_path: Path) -> None:
    env = dict(os.environ, VRAMTUI_RUNTIME_DIR=str(tmp_path / "r"),
               VRAMTUI_STATE_DIR=str(tmp_path / "s"), VRAMTUI_CONFIG_DIR=str(tmp_path / "c"))
    env.pop("VRAMTUI_BACKENDS", None)
    desc = tmp_path / "b.yaml"
    import yaml

    short_grace = {"stop_grace": "0.3s", "start": "20s"}  # b is interrupted by the stop
    desc.write_text(yaml.safe_dump({"backends": [
        sim_backend("a", 512, 256), sim_backend("b", 7000, 256, timeouts=short_grace)]}))

    def start() -> Supervisor:
        return Supervisor.from_config(gpus="sim:8GiB", backends=[desc], environ=env,
                                      config=EngineConfig(reserve_mib=0)).start_in_thread()

    sup = start()
    blocker = sup.submit("b", req(steps=200, step_s=0.01))
    wait_for(lambda: sup.job(blocker).state is JobState.RUNNING, what="blocker running")
    waiting = [sup.submit("a", req(steps=1)) for _ in range(5)]
    sup.stop()
    sup = start()
    try:
        for job_id in waiting:
            assert sup.wait(job_id, 60).state is JobState.SUCCEEDED
        history = [state for _t, state, _note in sup.wait(blocker, 60).history]
        assert "interrupted" in history
        # Results stay retrievable by id from the journal after another restart.
        sup.stop()
        sup = start()
        assert sup.job(waiting[0]).state is JobState.SUCCEEDED
    finally:
        sup.stop()


def test_metadata_that_cannot_travel_is_refused_at_submit() -> None:
    from supervisor import InvalidRequest

    with engine([sim_backend("a", 512, 256)]) as sup:
        with pytest.raises(InvalidRequest) as err:
            sup.submit("a", b"", metadata={"when": object()})
        assert "plain data" in str(err.value)
        assert sup.snapshot().queued == ()


def test_evicting_a_ready_worker_never_fails_a_job_admitted_in_the_same_instant() -> None:
    with engine([sim_backend("a", 512, 256)]) as sup:
        sup.preload("a")
        wait_for(lambda: sup.snapshot().backend("a").state == "ready", what="a ready")

        def submit_then_evict() -> str:  # on the engine loop: one instant for both
            job = sup.engine.submit("a", req(steps=2))
            sup.engine.evict("a")
            return job.id

        job_id = sup._call(submit_then_evict)
        assert sup.wait(job_id, 30).state is JobState.SUCCEEDED


def test_a_worker_that_cannot_even_be_spawned_fails_its_job(tmp_path: Path) -> None:
    spec = sim_backend("broken", 256, 128)
    spec["env"]["BAD"] = "nul\0inside"  # exec refuses it: not an OSError
    with engine([spec]) as sup:
        result = sup.wait(sup.submit("broken", req(steps=1)), 60)
        assert result.state is JobState.FAILED
        assert "cannot start" in (result.error or "")


def test_an_unmeasured_backend_learns_its_resident_footprint_while_idle() -> None:
    mystery = sim_backend("mystery", 2000, 3000, steps=20, step_s=0.1)
    del mystery["vram"]
    with engine([mystery]) as sup:
        assert sup.wait(sup.submit("mystery", req(steps=20, step_s=0.1)), 60).state \
            is JobState.SUCCEEDED
        view = wait_for(lambda: (b := sup.snapshot().backend("mystery")).learned_resident_mib
                        is not None and b, what="resident learned")
        # 256 MiB of simulated CUDA context + 2000 of weights; the 3000 of activation went.
        assert view.learned_resident_mib == 2256
        assert view.learned_peak_mib is not None and view.learned_peak_mib >= 5256
        assert view.admission_peak_mib == view.learned_peak_mib
