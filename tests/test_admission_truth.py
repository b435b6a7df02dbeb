"""Admission checked against the simulated device itself, not the engine's own accounts.

Every test here reads the truth from outside the code under test: the simulated GPU's
per-process ledger (``UsageWatcher`` reads it on its own thread at 100 Hz), the processes in
/proc, marker files the workers write. The cases are the ones that broke the first landing:
peak-only descriptors, models that lie, a stopped worker, a killed engine, calibration of a
worker that never allocated.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_support import ROOT, UsageWatcher, engine, sim_backend
from escaping import Escaper
from proc_state import gone
from serve_support import Served, make_env, new_root, reap, start_serve
from waiting import wait_until

from supervisor import JobState, Supervisor
from supervisor.engine import EngineConfig
from supervisor.paths import Paths

EXECUTIONS = ROOT / "tests" / "workers" / "executions.py"
MODEL_SERVER = ROOT / "tests" / "model_server.py"
NOSIM = ROOT / "tests" / "workers" / "nosim.py"


def req(**kw: object) -> bytes:
    return json.dumps(kw).encode()


def real(name: str, weights: int, activation: int, vram: Any, **extra: Any) -> dict[str, Any]:
    """The simulated model really holding ``weights`` (+ 256 MiB context) and ``activation``
    MiB more per job, described by ``vram`` (honest or not)."""
    spec = sim_backend(name, weights, activation, **extra)
    if vram is None:
        del spec["vram"]
    else:
        spec["vram"] = vram
    return spec


# --------------------------------------------------------------------------- honest forms

# 4.5 GiB resident (with the context) and 0.5 GiB more per job, as the issue saw it: two of
# them can never be resident together with a job running on an 8 GiB GPU... but can idle.
W, A = 4608 - 256, 512
FORMS = {
    "peak only": "5300MiB",
    "peak + weights": {"peak": "5300MiB", "weights": f"{W + 256}MiB"},
    "weights + activation + context": {"weights": f"{W}MiB", "activation": f"{A}MiB",
                                       "context": "256MiB"},
    "peak + activation": {"peak": "5300MiB", "activation": f"{A}MiB"},
}


@pytest.mark.process
@pytest.mark.parametrize("form", sorted(FORMS))
def test_alternating_jobs_of_two_backends_never_overcommit_nor_stall(form: str) -> None:
    vram = FORMS[form]
    backends = [real("x", W, A, vram, steps=3, step_s=0.05),
                real("y", W, A, vram, steps=3, step_s=0.05)]
    with engine(backends, gpus="sim:8GiB") as sup, UsageWatcher(sup, "sim:8GiB", hz=100) as watch:
        ids = [sup.submit("xy"[i % 2], req(steps=3, step_s=0.05)) for i in range(6)]
        started = time.monotonic()
        results = [sup.wait(j, 60) for j in ids]
        took = time.monotonic() - started
    assert [r.state for r in results] == [JobState.SUCCEEDED] * 6, [r.error for r in results]
    assert watch.samples > 50
    assert watch.overcommits == [], watch.overcommits[:5]
    assert took < 30  # no stall until keep-alive (5 min) expires


@pytest.mark.process
def test_a_backend_learned_in_production_is_never_sized_as_zero() -> None:
    # No vram at all: it runs alone until a job was sampled enough, then shares by what it
    # was seen to hold (never by 0, the bug of the first landing).
    backends = [real("x", W, A, None, steps=6, step_s=0.1),
                real("y", W, A, None, steps=6, step_s=0.1)]
    with engine(backends, gpus="sim:8GiB") as sup, UsageWatcher(sup, "sim:8GiB", hz=100) as watch:
        ids = [sup.submit("xy"[i % 2], req(steps=6, step_s=0.1)) for i in range(6)]
        results = [sup.wait(j, 90) for j in ids]
        view = sup.snapshot().backend("x")
    assert all(r.state is JobState.SUCCEEDED for r in results)
    assert watch.overcommits == []
    assert view is not None and view.admission_peak_mib is not None
    assert view.admission_peak_mib >= W + 256 + A


# --------------------------------------------------------------------------- models that lie


@pytest.mark.process
def test_a_liar_that_overcommits_is_killed_within_a_sample_and_never_again() -> None:
    # h honestly needs 12.25 GiB at peak; the liar declares 2.2 GiB and really holds 13.2 GiB
    # (+ context) while it works: beside h, the 24 GiB GPU is over-committed.
    honest = sim_backend("h", 10_240, 2_048, steps=40, step_s=0.05)
    liar = real("liar", 1_024, 12_288, {"weights": "1GiB", "activation": "1200MiB"},
                steps=12, step_s=0.1)
    with engine([honest, liar], gpus="sim:24GiB") as sup, \
            UsageWatcher(sup, "sim:24GiB", hz=100) as watch:
        long_honest = sup.submit("h", req(steps=40, step_s=0.05))
        wait_until(lambda: sup.job(long_honest).state is JobState.RUNNING, what="h running")
        first = sup.wait(sup.submit("liar", req(steps=12, step_s=0.1)), 60)
        assert sup.wait(long_honest, 60).state is JobState.SUCCEEDED
        assert first.state is JobState.FAILED
        assert "over-committed" in (first.error or "") and "13" in (first.error or "")
        first_episodes = watch.episodes()
        # From now on it is admitted at what it was seen to hold: alone first, then as measured.
        again = [sup.submit(name, req(steps=12, step_s=0.1)) for name in ("liar", "h", "liar")]
        results = [sup.wait(j, 90) for j in again]
        log = [line.text for line in sup.snapshot().log]
    assert [r.state for r in results] == [JobState.SUCCEEDED] * 3, [r.error for r in results]
    episodes = watch.episodes()
    # It never recurred. The first one may be too short for the watcher to see at all: the
    # engine's sample can fall within 10 ms of the liar's allocation, and then the kill too.
    assert episodes == first_episodes, episodes
    liars = {pid for e in episodes for name, pid in e.workers if name == "liar"}
    assert len(liars) <= 1, episodes  # one worker, one incident
    if episodes:
        # It ended within one sampling period of the engine (10 Hz) plus the kill's latency.
        span = max(e.start + e.duration_s for e in episodes) - min(e.start for e in episodes)
        assert span < 0.6, episodes
    assert any("liar measured alone" in text for text in log), log


@pytest.mark.process
def test_a_liar_caught_idle_runs_alone_next_time_even_if_its_peak_was_never_seen() -> None:
    # Found by scripts/admission-soak (seed 905): the liar's first job is over before the
    # engine's 10 Hz sampler sees its 6.6 GiB of activation; only its idle 2.6 GiB (it
    # declared 1.3 GiB) is caught, and it is evicted. Sized by that idle figure plus its
    # declared activation, its next worker fitted beside h and over-committed the GPU.
    liar = real("liar", 2_400, 6_600, {"weights": "1GiB", "activation": "128MiB",
                                       "context": "256MiB"})
    honest = sim_backend("h", 5_000, 256, steps=20, step_s=0.05)
    with engine([liar, honest], gpus="sim:12GiB") as sup, \
            UsageWatcher(sup, "sim:12GiB", hz=100) as watch:
        assert sup.wait(sup.submit("liar", req(steps=1, step_s=0.005)), 60).state \
            is JobState.SUCCEEDED
        wait_until(lambda: sup.snapshot().backend("liar").state == "cold", 20,
                 "the liar evicted for holding more than it declared")
        long_honest = sup.submit("h", req(steps=20, step_s=0.05))
        wait_until(lambda: sup.job(long_honest).state is JobState.RUNNING, what="h running")
        second = sup.wait(sup.submit("liar", req(steps=6, step_s=0.05)), 60)
        assert sup.wait(long_honest, 60).state is JobState.SUCCEEDED
        log = [line.text for line in sup.snapshot().log]
    assert second.state is JobState.SUCCEEDED, second.error
    assert watch.overcommits == [], watch.episodes()
    assert any("starting liar" in text and "runs alone" in text for text in log), log


@pytest.mark.process
def test_an_idle_worker_above_its_declaration_is_the_first_to_evict() -> None:
    # "fat" says 2.25 GiB but holds 16 GiB idle (on_overuse: warn keeps it loaded); "lean" is
    # honest. A job needing 10 GiB must evict fat — by what it holds, which frees enough.
    fat = real("fat", 16_384, 256, {"weights": "2GiB", "activation": "256MiB"},
               on_overuse="warn")
    lean = sim_backend("lean", 2_048, 256)
    big = sim_backend("big", 9_000, 1_000)
    with engine([fat, lean, big], gpus="sim:24GiB") as sup, \
            UsageWatcher(sup, "sim:24GiB", hz=100) as watch:
        sup.preload("fat")
        sup.preload("lean")
        wait_until(lambda: all(sup.snapshot().backend(n).state == "ready" for n in ("fat", "lean"))
                 and (sup.snapshot().backend("fat").over_mib or 0) > 10_000,
                 what="fat and lean ready, fat seen above its figures")
        result = sup.wait(sup.submit("big", req(steps=1)), 60)
        snap = sup.snapshot()
    assert result.state is JobState.SUCCEEDED
    assert snap.backend("lean").state == "ready"  # not evicted: fat alone made room
    assert snap.backend("fat").state == "cold"
    assert watch.overcommits == []
    assert any("evicting fat" in line.text for line in snap.log)


@pytest.mark.process
def test_on_overuse_kill_and_evict(tmp_path: Path) -> None:
    killer = real("killer", 512, 4_096, {"weights": "512MiB", "activation": "256MiB",
                                          "context": "256MiB"}, on_overuse="kill",
                  steps=20, step_s=0.05)
    evictee = real("evictee", 512, 4_096, {"weights": "512MiB", "activation": "256MiB",
                                            "context": "256MiB"}, steps=10, step_s=0.05)
    with engine([killer, evictee], gpus="sim:24GiB") as sup:
        killed = sup.wait(sup.submit("killer", req(steps=20, step_s=0.05)), 60)
        assert killed.state is JobState.FAILED and "on_overuse: kill" in (killed.error or "")
        # evict (the default): its job finishes, then it goes; the next one is sized right.
        done = sup.wait(sup.submit("evictee", req(steps=10, step_s=0.05)), 60)
        assert done.state is JobState.SUCCEEDED
        wait_until(lambda: sup.snapshot().backend("evictee").state == "cold", what="evicted")
        view = sup.snapshot().backend("evictee")
        assert view.admission_peak_mib is not None and view.admission_peak_mib >= 512 + 4096
        log = [line.text for line in sup.snapshot().log]
    assert any("on_overuse: evict" in text for text in log), log


@pytest.mark.process
def test_a_caught_backend_is_distrusted_until_its_descriptor_changes() -> None:
    liar = real("liar", 512, 4_096, {"weights": "512MiB", "activation": "256MiB",
                                      "context": "256MiB"}, steps=10, step_s=0.05)
    with engine([liar], gpus="sim:24GiB") as sup:
        assert sup.wait(sup.submit("liar", req(steps=10, step_s=0.05)), 60).state \
            is JobState.SUCCEEDED
        wait_until(lambda: sup.snapshot().backend("liar").state == "cold", what="evicted")
        view = sup.snapshot().backend("liar")
        assert view is not None and view.distrusted
        # what was measured of it sizes it, never less than it was seen to hold
        assert view.admission_peak_mib is None or view.admission_peak_mib >= 512 + 4_096
        source = Path(sup.descriptor("liar").layers[0].file)
        honest = dict(liar, vram={"weights": "512MiB", "activation": "4GiB", "context": "256MiB"})
        source.write_text(yaml.safe_dump({"backends": [honest]}))
        result = sup.reload()
        view = sup.snapshot().backend("liar")
    notes = [n for ch in result.changed for n in ch.notes]
    assert any("vram figures are used again" in n for n in notes), result
    assert view is not None and not view.distrusted


# --------------------------------------------------------------------------- liveness


SPAWNING_WORKER = """
import os, subprocess, sys
import worker_sdk

HOLD = "import sys, worker_sdk.sim as s; s.allocate(int(sys.argv[1])); sys.stdin.read()"
kids = []

@worker_sdk.predict
def predict(payload: bytes) -> bytes:
    # a child holding 1000 MiB, which starts a grandchild holding 2000 MiB
    nest = ("import subprocess, sys; "
            f"g = subprocess.Popen([sys.executable, '-c', {HOLD!r}, '2000'], stdin=sys.stdin); "
            f"exec({HOLD!r})")
    kids.append(subprocess.Popen([sys.executable, "-c", nest, "1000"], stdin=subprocess.PIPE))
    return os.environ["VRAMTUI_SIM_DIR"].encode()
"""


@pytest.mark.process
def test_memory_of_a_workers_descendants_is_its_own_and_a_strangers_is_foreign(
        tmp_path: Path) -> None:
    # The truth: /proc says who descends from the worker; the sim ledger, who holds what.
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNING_WORKER)
    backend = {"name": "spawner", "script": str(script), "vram": {"peak": "4GiB"},
               "on_overuse": "warn", "timeouts": {"stop_grace": "3s"}}
    with engine([backend], gpus="sim:16GiB") as sup:
        sim_dir = sup.wait(sup.submit("spawner", b""), 30).data.decode()
        stranger = subprocess.Popen(  # a process of ours, but no worker's descendant
            [sys.executable, "-c", "import sys, worker_sdk.sim as s; s.allocate(1500); "
             "sys.stdin.read()"], stdin=subprocess.PIPE, cwd=ROOT,
            env=dict(os.environ, VRAMTUI_SIM_DIR=sim_dir, VRAMTUI_SIM_GPU="0",
                     PYTHONPATH=str(ROOT)))
        try:
            def settled() -> Any:
                snap = sup.snapshot()
                gpu = snap.gpus[0]
                return snap if len(gpu.processes) == 4 and gpu.foreign_mib else None

            snap = wait_until(settled, 20, "the worker, its two descendants and the stranger")
            view = snap.backend("spawner")
            assert view is not None and view.pid is not None
            lineage = {p.pid: _ancestors(p.pid) for p in snap.gpus[0].processes}
        finally:
            stranger.stdin.close()  # type: ignore[union-attr]
            stranger.wait(10)
    owners = {p.pid: p.backend for p in snap.gpus[0].processes}
    truth = {pid: "spawner" if pid == view.pid or view.pid in up else None
             for pid, up in lineage.items()}
    assert owners == truth and sorted(truth.values(), key=str) == [None] + ["spawner"] * 3
    assert view.observed_mib is not None
    assert view.observed_mib >= 3000 + 3 * 256  # the two allocations and three contexts
    assert 1500 <= (snap.gpus[0].foreign_mib or 0) < 3000


def _ancestors(pid: int) -> set[int]:
    """The pids above ``pid``, read from /proc (field 4 of stat), not from the engine."""
    up: set[int] = set()
    while pid > 1:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        pid = int(stat[stat.rindex(b")") + 2:].split()[1])
        up.add(pid)
    return up


@pytest.mark.process
def test_a_stopped_worker_is_declared_hung_and_its_job_fails_with_that_reason() -> None:
    spec = sim_backend("s", 256, 128, steps=400, step_s=0.05)
    spec["timeouts"] = {"ping": "1s", "stop_grace": "2s"}
    with engine([spec], config=EngineConfig(reserve_mib=0, tick_s=0.1,
                                            ping_interval_s=0.2)) as sup:
        job = sup.submit("s", req(steps=400, step_s=0.05))
        wait_until(lambda: sup.job(job).state is JobState.RUNNING, what="job running")
        pid = sup.snapshot().backend("s").pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            result = sup.wait(job, 20)
        finally:
            with pytest.raises(ProcessLookupError):  # killed, not just abandoned
                wait_until(lambda: gone(pid), 10, "the stopped worker to be killed")
                os.kill(pid, signal.SIGCONT)
        assert result.state is JobState.FAILED
        assert "hung" in (result.error or "") and "ping" in (result.error or "")
        # The backend restarts on its next job.
        assert sup.wait(sup.submit("s", req(steps=1)), 30).state is JobState.SUCCEEDED


@pytest.mark.process
def test_request_timeout_counts_from_dispatch_not_from_submission() -> None:
    slow_start = sim_backend("t", 256, 128, load_s=1.5, steps=2, step_s=0.05)
    slow_start["timeouts"] = {"request": "1s", "stop_grace": "2s"}
    with engine([slow_start]) as sup:
        # 1.5 s to load, then 0.1 s of work: within a 1 s request timeout counted from dispatch.
        result = sup.wait(sup.submit("t", req(steps=2, step_s=0.05)), 30)
    assert result.state is JobState.SUCCEEDED, result.error


# --------------------------------------------------------------------------- no orphans


def _executions(marker_dir: Path) -> list[tuple[str, str, int, float]]:
    path = marker_dir / "executions"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        what, job_id, pid, t = line.split()
        out.append((what, job_id, int(pid), float(t)))
    return out


def _executions_root() -> tuple[Path, dict[str, str]]:
    """A fresh root whose backend ``ex`` notes each start and end of a job in it."""
    root = new_root()
    spec = {"name": "ex", "script": str(EXECUTIONS), "vram": {"peak": "1GiB"},
            "env": {"SIM_WEIGHTS_MIB": "256", "SIM_ACTIVATION_MIB": "128"},
            "timeouts": {"stop_grace": "2s"}}
    env = make_env(root, [spec])
    env["WORKER_MARKER_DIR"] = str(root)
    return root, env


@pytest.mark.process
@pytest.mark.parametrize("kill_watcher", [False, True], ids=["engine", "engine+lifeline"])
def test_kill_9_of_the_engine_runs_the_interrupted_job_exactly_once(kill_watcher: bool) -> None:
    root, env = _executions_root()
    served = start_serve(env, root)
    try:
        with served.client() as client:
            job_id = client.submit("ex", req(seconds=4))
            wait_until(lambda: _executions(root), 30, "the job to start on its worker")
            worker_pid = _executions(root)[0][2]
        watcher = _lifeline_of(env) if kill_watcher else None
        if watcher is not None:
            os.kill(watcher, signal.SIGKILL)
        os.kill(served.proc.pid, signal.SIGKILL)
        served.proc.wait(10)
        if not kill_watcher:
            # The lifeline kills the worker at once: it does not go on running the job.
            wait_until(lambda: gone(worker_pid), 5, "the worker to die with the engine")
        else:
            assert not gone(worker_pid)  # an orphan, until the next engine starts
        again = start_serve(env, root)
        try:
            with again.client() as client:
                # Before anything was requeued the orphan was gone.
                assert gone(worker_pid)
                result = client.wait(job_id, 60)
            assert result.state is JobState.SUCCEEDED, result.error
            runs = _executions(root)
            starts = [r for r in runs if r[0] == "start"]
            ends = [r for r in runs if r[0] == "end"]
            assert [r[1] for r in ends] == [job_id]  # one complete execution
            assert len(starts) == 2 and starts[1][2] != worker_pid
            log = again.stderr()
            if kill_watcher:
                assert "leftover process" in log, log[-2000:]
        finally:
            reap(again)
    finally:
        reap(served)


@pytest.mark.process
def test_a_lifeline_killed_by_someone_is_started_again_and_still_kills_the_workers() -> None:
    """The watcher killed alone (a stray ``pkill python``, the kernel out of memory): the
    engine starts another within a ping interval, tells it every live worker group and says
    so; a kill -9 of the engine afterwards still takes its worker with it (seen in /proc)."""
    root, env = _executions_root()
    served = start_serve(env, root)
    try:
        with served.client() as client:
            client.submit("ex", req(seconds=30))
            wait_until(lambda: _executions(root), 30, "the job to start on its worker")
            worker_pid = _executions(root)[0][2]
            first = _lifeline_of(env)
            assert first is not None
            os.kill(first, signal.SIGKILL)
            second = wait_until(lambda: (p := _lifeline_of(env, missing_ok=True)) != first
                                and p, 30, "another lifeline watcher")
        wait_until(lambda: "was gone; started it again" in served.stderr(), 10,
                   "the engine saying it started the lifeline again")
        os.kill(served.proc.pid, signal.SIGKILL)
        served.proc.wait(10)
        wait_until(lambda: gone(worker_pid), 5, "the worker to die with the engine")
        wait_until(lambda: gone(second), 5, "the new watcher to end with its work done")
    finally:
        reap(served)


def _lifeline_of(env: dict[str, str], missing_ok: bool = False) -> int | None:
    """The lifeline watcher of the engine using ``env``'s runtime directory (from /proc)."""
    runtime = f"VRAMTUI_RUNTIME_DIR={env['VRAMTUI_RUNTIME_DIR']}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if b"lifeline.py" in cmdline and runtime in environ.split(b"\0") \
                and not gone(int(entry)):
            return int(entry)
    if missing_ok:
        return None
    raise AssertionError("no lifeline watcher found for this engine")


# --------------------------------------------------------------------------- calibration


@pytest.mark.process
def test_calibrating_a_worker_that_never_allocated_earns_nothing() -> None:
    spec = {"name": "plain", "script": str(NOSIM), "vram": {"peak": "1GiB"},
            "timeouts": {"stop_grace": "2s"}}
    with engine([spec]) as sup:
        result = sup.wait(sup.calibrate("plain", repeats=1, settle_s=0.2), 60)
        summary = json.loads(result.data or b"{}")
        overlays = list(sup.paths.backends_dir.glob("*.yaml"))
    assert result.state is JobState.FAILED
    assert "no per-process memory seen" in (result.error or "")
    assert "worker_sdk.sim" in (result.error or "")
    assert summary.get("overlay") is None and overlays == []
    assert summary["confidence"] == "low" and summary["peak_mib"] is None


@pytest.mark.process
def test_calibrating_a_demo_backend_keeps_the_demo_backends(tmp_path: Path) -> None:
    env = dict(os.environ, VRAMTUI_RUNTIME_DIR=str(tmp_path / "r"),
               VRAMTUI_STATE_DIR=str(tmp_path / "s"), VRAMTUI_CONFIG_DIR=str(tmp_path / "c"))
    env.pop("VRAMTUI_BACKENDS", None)
    sup = Supervisor.from_config(gpus="sim:24GiB", environ=env, paths=Paths.from_env(env),
                                 config=EngineConfig(reserve_mib=0, tick_s=0.1))
    sup.start_in_thread()
    try:
        result = sup.wait(sup.calibrate("whisper-sim", repeats=1, settle_s=0.2), 60)
    finally:
        sup.stop(timeout=30)
    overlay = tmp_path / "c" / "backends.d" / "zz-calibrated-whisper-sim.yaml"
    assert result.state is JobState.SUCCEEDED, result.error
    assert yaml.safe_load(overlay.read_text())["overlay"] is True
    again = Supervisor.from_config(gpus="sim:24GiB", environ=env, paths=Paths.from_env(env))
    names = set(again.engine.backends)
    assert {"sdxl-sim", "flux-sim", "echo"} <= names, again.engine.descriptors.errors
    assert again.engine.descriptors.errors == ()
    measured = again.engine.backends["whisper-sim"].spec
    assert measured.vram.context_mib == 256  # what the demo's descriptor leaves out
    assert "zz-calibrated-whisper-sim" in measured.source


def test_an_overlay_whose_backend_is_gone_is_reported_not_run(tmp_path: Path) -> None:
    from supervisor.backends.loader import load_backends

    (tmp_path / "a.yaml").write_text(yaml.safe_dump(
        {"name": "kept", "command": [sys.executable, "-c", "pass"]}))
    (tmp_path / "zz-calibrated-gone.yaml").write_text(yaml.safe_dump(
        {"name": "gone", "overlay": True, "vram": {"peak": "1GiB"}}))
    loaded = load_backends([tmp_path], demo_fallback=False)
    assert set(loaded.backends) == {"kept"}
    assert any("only an overlay mentions this backend" in str(e) for e in loaded.errors)


@contextlib.contextmanager
def _escaping_server(launcher: str) -> Iterator[tuple[Served, dict[str, str], Path, int]]:
    """An engine whose model server started a helper with ``launcher`` (out of the server's
    group), the server loaded: (the engine, its env, its root, the helper's pid).  Whatever
    of the helper is left is killed at the end."""
    escaper = Escaper(f"{sys.executable} {MODEL_SERVER} --port ${{PORT}}", launcher)
    root = new_root()
    spec = {"name": "esc", "command": escaper.command, "http": {"health": "/health"},
            "api": ["chat"], "simulated": True,
            "vram": {"weights": "256MiB", "activation": "0MiB"}}
    env = make_env(root, [spec])
    served = start_serve(env, root)
    try:
        with served.client() as client:
            client.preload("esc")
            # ready: the engine has recorded the server's group (the record is what the
            # next engine reads)
            wait_until(lambda: any(b.state == "ready" for b in client.snapshot().backends),
                       30, "the server to be ready")
            (pid,) = wait_until(escaper.pids, 30, "the server's helper to start")
        yield served, env, root, pid
    finally:
        escaper.kill_left()
        reap(served)


@pytest.mark.process
@pytest.mark.parametrize("launcher", ["setsid env -i", "setsid -f", "setsid -f env -i"])
def test_a_restarted_engine_kills_what_left_the_group_of_a_leftover_worker(
        launcher: str) -> None:
    """The engine and its lifeline both killed (``kill -9``), and the server's reaper stopped
    (it would kill the server as the engine dies: the next test): the next engine kills the
    leftover server's group and what left it: a helper in its tree with its environment
    cleared, one that forked out of its tree but carries the old run's mark, or one that
    did both (adopted by the server's reaper, so in its tree)."""
    with _escaping_server(launcher) as (served, env, root, pid):
        watcher = _lifeline_of(env)
        assert watcher is not None
        os.kill(_reaper_above(pid), signal.SIGSTOP)
        os.kill(watcher, signal.SIGKILL)
        os.kill(served.proc.pid, signal.SIGKILL)
        served.proc.wait(10)
        assert not gone(pid)  # left behind, until the next engine starts
        again = start_serve(env, root)
        try:
            wait_until(lambda: gone(pid), 10, "the helper to die as the next engine starts")
            # (killed first, said after: the line may come a moment after the helper died)
            wait_until(lambda: "had left their worker's group" in again.stderr(), 10,
                       "the engine to say what it killed")
        finally:
            reap(again)


def _reaper_above(pid: int) -> int:
    """The reaper the process ``pid`` runs under (its nearest ancestor named ``reaper …``;
    a launcher between them may be exiting: asked again until the chain holds still)."""
    def find() -> int | None:
        at = pid
        try:
            while at > 1:
                if Path(f"/proc/{at}/comm").read_text().startswith("reaper "):
                    return at
                stat = Path(f"/proc/{at}/stat").read_bytes()
                at = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        return None

    return wait_until(find, 10, "the reaper above the helper")


@pytest.mark.process
@pytest.mark.parametrize("launcher", ["setsid env -i", "setsid -f", "setsid -f env -i"])
def test_kill_9_of_the_engine_and_its_lifeline_leaves_no_server_behind(launcher: str) -> None:
    """Nothing watches once the engine and its lifeline are both killed: the server's reaper
    hears its parent's death from the kernel and kills the server and every helper that
    left its group (they lived on, with the server's port, until another engine started)."""
    with _escaping_server(launcher) as (served, env, _root, pid):
        reaper = _reaper_above(pid)
        watcher = _lifeline_of(env)
        assert watcher is not None
        os.kill(watcher, signal.SIGKILL)
        os.kill(served.proc.pid, signal.SIGKILL)
        served.proc.wait(10)
        wait_until(lambda: gone(pid) and gone(reaper), 10, "the server's tree to die")


@pytest.mark.process
@pytest.mark.parametrize("launcher", ["setsid", "setsid env -i", "setsid -f env -i"])
def test_kill_9_of_the_engine_takes_a_child_that_left_its_workers_group(launcher: str) -> None:
    """A model server that started a helper in a session of its own (``setsid``): a signal to
    the server's group misses it, so the lifeline also kills every process carrying this
    engine's mark once the engine is gone (seen in /proc), and what is still in the tree of
    a worker group it watches, mark or none (``env -i`` cleared it)."""
    with _escaping_server(launcher) as (served, _env, _root, pid):
        os.kill(served.proc.pid, signal.SIGKILL)
        served.proc.wait(10)
        wait_until(lambda: gone(pid), 5, "the helper to die with the engine")
