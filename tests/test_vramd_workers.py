"""vramd's own workers under our engine, unchanged: a ``version: 2`` file, vramd's SDK, JSON lines.

The adapter is written on vramd 0.3.9's own ``WorkerAdapter``/``run_worker_loop`` (the PyPI
package, a test-only dependency) and holds simulated VRAM through ``worker_sdk.sim``, so the
simulated GPU sees it. The truth the checks use is read apart from the engine: the simulated
device's ledger (an independent ``SimulatedProbe``), the processes in /proc, and the worker's
own log.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_support import ROOT, UsageWatcher
from proc_state import gone
from waiting import wait_until, wait_until_async

from supervisor import JobState, Supervisor
from supervisor.backends.schema import VramdSettings
from supervisor.engine import EngineConfig
from supervisor.gpu.sim import SimulatedProbe
from supervisor.paths import Paths
from supervisor.units import parse_size
from supervisor.workers.base import Worker
from supervisor.workers.handle import WorkerHandle, WorkerState
from supervisor.workers.vramd import VramdWorkerHandle

pytest.importorskip("vramd.worker")

WEIGHTS, ACTIVATION, CONTEXT = 1024, 512, 256  # MiB; CONTEXT: the simulated GPU's own

ADAPTER = '''
import os, sys, time
from vramd.worker import WorkerAdapter, run_worker_loop
from worker_sdk import sim

WEIGHTS = int(os.environ["ADAPTER_WEIGHTS_MIB"])
ACTIVATION = int(os.environ["ADAPTER_ACTIVATION_MIB"])
LOADS = []


class Adapter(WorkerAdapter):
    name = "vsim"

    def load(self, **kwargs):
        LOADS.append(dict(kwargs))
        print(f"load {kwargs}", file=sys.stderr, flush=True)
        sim.attach()  # the CUDA context comes first, the weights take a moment to copy
        time.sleep(0.3)
        sim.allocate(WEIGHTS)
        return {"device": kwargs.get("device", "cuda")}

    def generate(self, model, request):
        steps = int(request.get("steps", 3))
        step_s = float(request.get("step_s", 0.02))
        sim.allocate(ACTIVATION)
        try:
            for i in range(steps):
                if self.should_abort(request):
                    return self.cancelled_response(f"cancelled at step {i + 1}")
                self.report_progress(request, i / steps, f"step {i + 1}/{steps}")
                time.sleep(step_s)
            if request.get("fail"):
                raise RuntimeError("simulated failure")
        finally:
            sim.free(ACTIVATION)
        return {"status": "ok", "output": str(request.get("prompt", "")).upper(),
                "pid": os.getpid(), "device": model["device"], "loads": len(LOADS)}

    def unload(self, model):
        print("unload called", file=sys.stderr, flush=True)
        sim.free(WEIGHTS)


if __name__ == "__main__":
    run_worker_loop(Adapter, backend_name="vsim")
'''

DESCRIPTOR = '''
version: 2
backends:
  - name: vsim
    adapter: sim_adapter        # vramd's in-process mode only: unused with runtime
    vram_mib: 9000              # an estimate; the measured vram: block below wins
    priority: 10
    runtime:
      command: ["${env:VT_PYTHON}", "sim_adapter.py"]
      env:
        PYTHONPATH: "${env:VT_ROOT}"
        ADAPTER_WEIGHTS_MIB: "1024"
        ADAPTER_ACTIVATION_MIB: "512"
      load_timeout_sec: 30
    load_keys: [device]
    calibrate_request: {steps: 3, step_s: 0.05}
    vram:
      weights_gib: 1.0
      activation_gib: 0.5
      context_gib: 0.25
      peak_mib: 1792
      safety_mib: 128
    keep_alive: 10m
    timeouts: {stop_grace: 3s}
'''


def req(**kw: Any) -> bytes:
    return json.dumps(kw).encode()


@contextmanager
def vramd_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                 gpus: str = "sim:4GiB") -> Iterator[Supervisor]:
    """An engine running the vramd file as it is, started in the folder of its worker."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "sim_adapter.py").write_text(ADAPTER)
    desc = tmp_path / "conf" / "backends.yaml"
    desc.parent.mkdir()
    desc.write_text(DESCRIPTOR)
    monkeypatch.chdir(work)  # vramd resolves "sim_adapter.py" against its working directory
    root = Path(os.path.realpath(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"), VT_PYTHON=sys.executable,
               VT_ROOT=str(ROOT))
    sup = Supervisor.from_config(gpus=gpus, backends=[desc], environ=env,
                                 paths=Paths.from_env(env),
                                 config=EngineConfig(reserve_mib=0, tick_s=0.1,
                                                     cancel_grace_s=3.0))
    sup.start_in_thread()
    try:
        yield sup
    finally:
        sup.stop(timeout=30)


def worker_mib(sup: Supervisor, pid: int) -> int | None:
    """The simulated GPU's own reading of a process (not the engine's)."""
    probe = SimulatedProbe("sim:4GiB", sup.paths.sim_dir)
    return next((p.used_mib for p in probe.processes() if p.pid == pid), None)


@pytest.mark.process
def test_a_vramd_worker_runs_under_the_engine_as_it_is(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    with vramd_engine(tmp_path, monkeypatch) as sup, UsageWatcher(sup, "sim:4GiB") as watch:
        spec_note = [line.text for line in sup.snapshot().log if "descriptor" in line.text]
        assert spec_note == [], spec_note  # nothing in this file goes unhonoured
        backend = sup.snapshot().backend("vsim")
        assert backend is not None and backend.declared_peak_mib == 1792  # measured, not 9000

        # submit: progress and the result, as for any backend
        sub = sup.subscribe(kinds=["job"])
        job = sup.submit("vsim", req(prompt="hi", steps=4))
        done = sup.wait(job, 30)
        assert done.state is JobState.SUCCEEDED, done.error
        body = json.loads(done.data or b"{}")
        assert body["status"] == "ok" and body["output"] == "HI"
        assert done.headers == {"Content-Type": "application/json"}
        pid = body["pid"]
        fractions = []
        while (event := sub.get(timeout=0.3)) is not None:
            if event.job is not None and event.job.id == job and event.job.progress is not None:
                fractions.append(event.job.progress)
        sub.close()
        assert fractions[:4] == [0.0, 0.25, 0.5, 0.75], fractions
        # what the simulated GPU itself sees: weights + the process's CUDA context
        assert wait_until(lambda: worker_mib(sup, pid) == WEIGHTS + CONTEXT, what="resident")

        # a failing generate and a request that is not vramd's (a JSON object) fail cleanly
        failed = sup.wait(sup.submit("vsim", req(fail=True, steps=1)), 20)
        assert failed.state is JobState.FAILED
        assert "simulated failure" in (failed.error or "")
        bad = sup.wait(sup.submit("vsim", b"[1, 2]"), 20)
        assert bad.state is JobState.FAILED and "JSON object" in (bad.error or "")

        # cancel mid-job: vramd's abort, honoured through should_abort; same worker after
        long = sup.submit("vsim", req(steps=400, step_s=0.02))
        wait_until(lambda: (sup.job(long).progress or 0) > 0, what="the long job progressing")
        assert worker_mib(sup, pid) == WEIGHTS + ACTIVATION + CONTEXT
        sup.cancel(long)
        cancelled = sup.wait(long, 10)
        assert cancelled.state is JobState.CANCELLED
        after = sup.wait(sup.submit("vsim", req(steps=1)), 20)
        assert after.state is JobState.SUCCEEDED
        assert json.loads(after.data or b"{}")["pid"] == pid  # it stopped cooperatively

        # a request's load_keys reload the worker first, with them, as vramd does
        cpu = json.loads(sup.wait(sup.submit("vsim", req(device="cpu", steps=1)), 20).data
                         or b"{}")
        assert (cpu["device"], cpu["loads"]) == ("cpu", 2)
        same = json.loads(sup.wait(sup.submit("vsim", req(device="cpu", steps=1)), 20).data
                          or b"{}")
        assert same["loads"] == 2  # unchanged: no reload
        assert worker_mib(sup, pid) == WEIGHTS + CONTEXT  # the reload did not double it

        # evict: unload, then shutdown; the process leaves, and its memory with it
        sup.evict("vsim")
        wait_until(lambda: sup.snapshot().backend("vsim").state == "cold", what="evicted")
        assert gone(pid)
        log = Path(sup.snapshot().backend("vsim").log_path).read_text()
        # the reload unloaded once, the eviction once more: the worker unloaded, not killed
        assert log.count("unload called") == 2 and log.rstrip().endswith("unload called")
        assert worker_mib(sup, pid) is None

        # respawn: a fresh worker, ready, without a job
        sup.respawn("vsim")
        second = wait_until(lambda: (b := sup.snapshot().backend("vsim")).state == "ready"
                          and b.pid != pid and b.pid, what="respawned")

        # kill -9 mid-job: that job fails with the code and the log; the next one respawns
        doomed = sup.submit("vsim", req(steps=400, step_s=0.02))
        wait_until(lambda: sup.job(doomed).state is JobState.RUNNING, what="doomed running")
        os.kill(second, signal.SIGKILL)
        killed = sup.wait(doomed, 20)
        assert killed.state is JobState.FAILED
        assert "code -9" in (killed.error or "") and "vsim.log" in (killed.error or "")
        again = sup.wait(sup.submit("vsim", req(prompt="back")), 30)
        assert again.state is JobState.SUCCEEDED
        assert json.loads(again.data or b"{}")["pid"] not in (pid, second)
        history = [state for _t, state, _note in again.history]
        assert history[0] == "queued" and history[-1] == "succeeded"
    assert watch.samples > 10 and watch.overcommits == []


@pytest.mark.process
def test_calibrating_a_vramd_backend_measures_it(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with vramd_engine(tmp_path, monkeypatch) as sup:
        job = sup.calibrate("vsim", repeats=2, settle_s=0.3)  # calibrate_request: the request
        result = sup.wait(job, 60)
        assert result.state is JobState.SUCCEEDED, result.error
        summary = json.loads(result.data or b"{}")
        vram = yaml.safe_load(Path(summary["overlay"]).read_text())
        figures = json.dumps(vram)
        assert "vsim" in figures
        (entry,) = vram.get("backends", [vram])
        measured = {k: parse_size(v) for k, v in entry["vram"].items()}
        assert abs(measured["weights"] - WEIGHTS) <= 64, measured
        assert abs(measured["activation"] - ACTIVATION) <= 64, measured
        assert abs(measured["peak"] - (WEIGHTS + ACTIVATION + CONTEXT)) <= 64, measured
        backend = sup.snapshot().backend("vsim")
        assert backend is not None and backend.declared_peak_mib is not None
        assert abs(backend.declared_peak_mib - 1792) <= 64


# -- the handle on its own -------------------------------------------------------------------


class Recorder:
    """A WorkerObserver that keeps everything it hears."""

    def __init__(self) -> None:
        self.done: dict[str, Any] = {}
        self.progress: list[tuple[str, float | None, str]] = []
        self.exits: list[tuple[int | None, str]] = []

    def worker_state(self, handle: Any) -> None:
        pass

    def worker_exited(self, handle: Any, code: int | None, reason: str) -> None:
        self.exits.append((code, reason))

    def request_done(self, handle: Any, job_id: str, outcome: Any) -> None:
        self.done[job_id] = outcome

    def request_progress(self, job_id: str, fraction: float | None, text: str) -> None:
        self.progress.append((job_id, fraction, text))

    def request_chunk(self, job_id: str, chunk: bytes) -> None:
        pass


async def until(predicate: Any, timeout: float = 10.0) -> None:
    await wait_until_async(predicate, timeout)


def handle_for(tmp_path: Path, script: str, **kw: Any) -> tuple[VramdWorkerHandle, Recorder]:
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=str(ROOT), ADAPTER_WEIGHTS_MIB="0",
               ADAPTER_ACTIVATION_MIB="0")
    env.pop("VRAMTUI_SIM_DIR", None)
    observer = Recorder()
    handle = VramdWorkerHandle(backend="t", name="t#1", gpu=0, argv=[sys.executable, str(path)],
                               env=env, cwd=str(tmp_path), log_path=tmp_path / "t.log",
                               observer=observer, **kw)
    return handle, observer


def test_both_handles_present_one_interface(tmp_path: Path) -> None:
    handle, observer = handle_for(tmp_path, ADAPTER)
    ours = WorkerHandle(backend="t", name="t#2", gpu=0, argv=["x"], env={}, cwd=None,
                        log_path=tmp_path / "o.log", listener=None,  # type: ignore[arg-type]
                        observer=observer)
    assert isinstance(handle, Worker) and isinstance(ours, Worker)
    assert handle.state is ours.state is WorkerState.STARTING


@pytest.mark.process
def test_ping_resolves_on_pong_and_stop_is_unload_then_shutdown(tmp_path: Path) -> None:
    async def scenario() -> None:
        handle, observer = handle_for(tmp_path, ADAPTER)
        await handle.start()
        await until(lambda: handle.hot)
        assert [s for _t, s in handle.status_marks] == ["initializing", "ready"]
        rtt = await handle.round_trip(timeout=5)
        assert rtt is not None and rtt < 5
        handle.send("j", req(steps=2), stream=False)
        assert handle.state is WorkerState.BUSY
        await until(lambda: "j" in observer.done)
        await handle.stop(grace=5)
        assert handle.exited and handle.state is WorkerState.COLD
        assert observer.exits == [(0, "stopped")]  # it exited by itself: not signalled
        assert await handle.round_trip(timeout=1) is None
        assert "unload called" in (tmp_path / "t.log").read_text()

    asyncio.run(scenario())


RAW_WORKER = r'''
import json, os, sys, time
# A JSON-lines worker written by hand, misbehaving on request.
out = sys.stdout
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["cmd"] == "load":
        out.write("this is not json\n" + "x" * 5000 + "\n")
        out.write(json.dumps({"event": "ready", "vram_mib": 12}) + "\n"); out.flush()
    elif cmd["cmd"] == "generate":
        request = cmd["request"]
        if request.get("hang"):
            time.sleep(60)
        if request.get("mute"):
            out.close(); os.close(1); time.sleep(60)
        if request.get("big"):
            out.write(json.dumps({"event": "done", "result": "y" * 5000}) + "\n"); out.flush()
            continue
        out.write(json.dumps({"event": "progress", "pct": 7, "msg": None}) + "\n")
        out.write(json.dumps({"event": "progress", "pct": 10 ** 400}) + "\n")
        out.write(json.dumps({"event": "done", "result": [1, "two"]}) + "\n"); out.flush()
    elif cmd["cmd"] == "shutdown":
        break
'''


@pytest.mark.process
def test_a_hand_written_jsonl_worker_that_misbehaves(tmp_path: Path) -> None:
    async def scenario() -> None:
        handle, observer = handle_for(tmp_path, RAW_WORKER, max_line=1024)
        await handle.start()
        await until(lambda: handle.hot)
        assert handle.reported_vram_mib == 12
        handle.send("ok", b"", stream=False)
        await until(lambda: "ok" in observer.done)
        outcome = observer.done["ok"]
        assert outcome.ok and json.loads(outcome.data) == [1, "two"]
        # pct clamped to 0..1 (even past a float's range), msg None → ""
        assert observer.progress == [("ok", 1.0, ""), ("ok", 1.0, "")]
        handle.send("big", req(big=True), stream=False)  # a result over the line limit
        await until(lambda: "big" in observer.done)
        assert "over 1024 bytes" in observer.done["big"].error and handle.hot
        handle.send("deep", b"[" * 100_000 + b"]" * 100_000, stream=False)
        await until(lambda: "deep" in observer.done)
        assert observer.done["deep"].status_code == 400 and handle.hot
        handle.send("mute", req(mute=True), stream=False)  # it closes stdout, lives on
        await until(lambda: handle.exited, timeout=10)
        ((code, reason),) = observer.exits
        assert code == -signal.SIGKILL and "closed its stdout" in reason
        log = (tmp_path / "t.log").read_text()
        assert "not JSON" in log and "over 1024 bytes" in log

    asyncio.run(scenario())


@pytest.mark.process
def test_a_job_that_sends_nothing_for_the_event_timeout_is_killed(tmp_path: Path) -> None:
    async def scenario() -> None:
        handle, observer = handle_for(tmp_path, RAW_WORKER,
                                      settings=VramdSettings(event_timeout_s=0.5))
        await handle.start()
        await until(lambda: handle.hot)
        handle.send("hang", req(hang=True), stream=False)
        await until(lambda: handle.exited, timeout=10)
        ((code, reason),) = observer.exits
        assert code == -signal.SIGKILL and "no event for 0.5 s" in reason

    asyncio.run(scenario())
