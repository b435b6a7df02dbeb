"""The engine end to end: real worker processes, real sockets, the simulated GPU.

These prove the real paths (processes, signals, the journal on disk, the lock file, the
simulated device's own ledger as the truth); the engine's rules themselves are tested on
fakes in test_engine_rules.py.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from engine_support import ROOT, UsageWatcher, engine, sim_backend
from waiting import wait_until

from supervisor import (
    EngineRunning,
    JobState,
    Supervisor,
)
from supervisor.engine import EngineConfig

pytestmark = pytest.mark.process


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


def test_worker_killed_mid_job_fails_that_job_and_the_backend_restarts() -> None:
    with engine([sim_backend("a", 1024, 512)]) as sup:
        job = sup.submit("a", req(steps=200, step_s=0.05))
        wait_until(lambda: sup.job(job).state is JobState.RUNNING, what="job running")
        pid = wait_until(lambda: sup.snapshot().backend("a").pid, what="worker pid")
        os.kill(pid, signal.SIGKILL)
        result = sup.wait(job, 20)
        assert result.state is JobState.FAILED
        assert "code -9" in (result.error or "")
        assert "a.log" in (result.error or "")
        wait_until(lambda: sup.snapshot().backend("a").state == "cold", what="backend cold")
        again = sup.wait(sup.submit("a", req(steps=1)), 30)
        assert again.state is JobState.SUCCEEDED
        assert json.loads(again.data or b"{}")["pid"] != pid


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
    assert "demo" in (sup.engine.notice() or "")
    assert (ROOT / "examples" / "demo" / "backends.yaml").exists()


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
    wait_until(lambda: sup.job(blocker).state is JobState.RUNNING, what="blocker running")
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


def test_a_worker_that_cannot_even_be_spawned_fails_its_job(tmp_path: Path) -> None:
    spec = sim_backend("broken", 256, 128)
    spec["env"]["BAD"] = "nul\0inside"  # exec refuses it: not an OSError
    with engine([spec]) as sup:
        result = sup.wait(sup.submit("broken", req(steps=1)), 60)
        assert result.state is JobState.FAILED
        assert "cannot start" in (result.error or "")




def test_the_event_stream_never_shows_a_one_at_a_time_backend_running_two_jobs() -> None:
    """Jobs queued back to back on a backend of concurrency 1: in the engine's own event
    stream (what the TUI and SSE clients follow), each job ends before the next one runs, and
    its end's log line comes before the next one's admission."""
    events: list[tuple[str, str | None, str | None, str]] = []
    with engine([sim_backend("one", 256, 64, steps=1, step_s=0.005)]) as sup:
        sup.engine.events.subscribe(
            kinds=frozenset({"job", "log"}), maxsize=100_000,
            callback=lambda e: events.append((e.kind, e.job_id, e.state, e.message)))
        ids = [sup.submit("one", json.dumps({"steps": 1, "step_s": 0.005}).encode())
               for _ in range(20)]
        for job_id in ids:
            assert sup.wait(job_id, 60).state is JobState.SUCCEEDED
    running: set[str] = set()
    started: list[str] = []
    for kind, job_id, state, _message in events:
        if kind != "job" or job_id is None:
            continue
        if state == "running" and job_id not in started:
            assert not running, f"{job_id} runs while {running} has not ended"
            started.append(job_id)
            running.add(job_id)
        elif state in ("succeeded", "failed", "cancelled", "timed_out"):
            running.discard(job_id)
    assert sorted(started) == sorted(ids)
    lines = [m for kind, _j, _s, m in events if kind == "log"
             and (m.startswith("admitted") or " succeeded after " in m)]
    for before, after in itertools.pairwise(lines):
        assert not (before.startswith("admitted") and after.startswith("admitted")), lines
