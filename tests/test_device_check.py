"""scripts/device-check here, where no GPU exists: it skips in one line, and its --simulate mode
runs the same rows (environment, doctor, probe, calibrate, trace, screenshot) against the
simulated GPU, the workers allocating through a fake libcuda when a compiler exists.

The truth each row compares with is not computed by the engine: the simulated GPU's ledger
read by a second reader, and what the worker itself allocated.  A run whose descriptors lie
(``--understate``) must fail the trace, or the check could not catch an over-committing
engine.  The two full runs start together (a module fixture) to keep the module short.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from spawning import spawns

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device-check"
sys.path.insert(0, str(ROOT / "scripts"))

from devicecheck import compare, detect, main, plan, readers, stages, table, watcher  # noqa: E402

pytestmark = pytest.mark.skipif(
    isinstance(detect.detect(), detect.Detected),
    reason="this machine has an NVIDIA GPU: run scripts/device-check itself")


def env_here() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMTUI_", "OUT"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # its many processes start faster with bytecode
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


@dataclass
class Run:
    out: Path
    proc: subprocess.Popen[str]
    stdout: str = ""
    stderr: str = ""

    def finish(self, timeout: float = 150) -> Run:
        if self.proc.returncode is None:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        return self

    def rows(self) -> dict[str, table.Row]:
        return {r["check"]: table.Row.from_json(r)
                for r in json.loads((self.out / "rows.json").read_text())}


def start(out: Path, *extra: str) -> Run:
    argv = [str(SCRIPT), "--simulate", "--quick", "--python", sys.executable, "--out", str(out),
            *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_here(), cwd=str(out.parent))
    return Run(out, proc)


@pytest.fixture(scope="module")
@spawns
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    base = tmp_path_factory.mktemp("devcheck")
    started = {"honest": start(base / "honest"),
               "lying": start(base / "lying", "--stages", "trace", "--understate", "0.4")}
    yield started
    for run in started.values():
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.communicate()


def marked_processes() -> list[int]:
    mark = b"VRAMTUI_DEVICE_CHECK="
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


# -- the real thing, here -----------------------------------------------------------------------


@pytest.mark.process
def test_without_a_gpu_it_says_skipped_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=30,
                          cwd=str(tmp_path), env=env_here())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("device-check: skipped — no NVIDIA GPU")
    assert done.stderr == ""
    assert list(tmp_path.iterdir()) == []  # nothing written where it ran


@pytest.mark.process
def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "--simulate", "gpu:9"], capture_output=True, text=True,
                          timeout=30, cwd=str(tmp_path))
    assert done.returncode == 2
    assert "expected sim:<size>" in done.stderr.strip().splitlines()[-1]


# -- --simulate: every row, against the simulated GPU -----------------------------------------


def test_simulated_run_passes_every_row(runs: dict[str, Run]) -> None:
    run = runs["honest"].finish()
    assert run.proc.returncode == 0, run.stdout + run.stderr
    rows = run.rows()
    expected = ["environment", *[c for stage in table.STAGE_ROWS.values() for c in stage]]
    assert [c for c in expected if c not in rows] == []
    assert {c: rows[c].status for c in expected if rows[c].status != table.OK} == {}
    assert run.stdout.rstrip().endswith("rows ok")
    # the exact figures of the simulated device
    assert rows["probe: context"].measured.startswith("256 MiB")
    assert rows["calibrate: weights"].measured == "1024 MiB (+0 MiB)"
    for name in ("device-check.log", "device-check.txt", "calibration.json", "trace.json",
                 "dashboard.svg"):
        assert (run.out / name).stat().st_size > 0, name
    assert (run.out / "device-check.txt").read_text() == run.stdout


def test_simulated_trace_was_watched_and_oversubscribed(runs: dict[str, Run]) -> None:
    run = runs["honest"].finish()
    trace = json.loads((run.out / "trace.json").read_text())
    assert sum(trace["peaks_mib"]) == pytest.approx(2 * trace["total_mib"], abs=8)
    assert all(j["state"] == "succeeded" for j in trace["jobs"])
    seen = trace["watcher"]
    assert seen["hz"] >= compare.MIN_WATCH_HZ and seen["readings"] > 10
    assert 0 < seen["max_used_mib"] <= seen["total_mib"]
    assert "SIMULATED" in (run.out / "dashboard.svg").read_text()


def test_lying_descriptors_fail_the_trace(runs: dict[str, Run]) -> None:
    run = runs["lying"].finish()
    assert run.proc.returncode == 1, run.stdout + run.stderr
    rows = run.rows()
    failed = {c for c, r in rows.items() if r.status == table.FAIL}
    # with the fake driver the workers' allocations fail (as on a card); without a compiler
    # the simulated GPU over-commits instead; or the engine sees a liar hold more than it
    # declared and kills it first: its jobs fail, and the run says why
    caught = "trace: jobs" in failed and "killed: it held" in run.stdout
    assert failed & {"trace: out of memory", "trace: used ≤ total"} or caught, run.stdout
    assert "device-check: FAILED" in run.stdout
    assert "probe: context" not in rows and "calibrate: weights" not in rows  # --stages trace


def test_no_process_outlives_a_run(runs: dict[str, Run]) -> None:
    for run in runs.values():
        run.finish()
    assert marked_processes() == []
    # each run's own work dir (named in its log) is removed; other runs on the box don't count
    works = [re.search(r"work in (\S+)", (run.out / "device-check.log").read_text())
             for run in runs.values()]
    assert all(works), "a run's log does not say where it worked"
    assert [m.group(1) for m in works if m and Path(m.group(1)).exists()] == []


@pytest.mark.process
def test_a_stage_past_its_limit_is_stopped_and_its_rows_say_so(tmp_path: Path) -> None:
    work = Path(main.tempfile.mkdtemp(prefix="vtdc-", dir="/tmp"))
    log = main.Log(tmp_path / "log")
    try:
        the_plan = plan.make_plan(8192, simulated=True, quick=True, sim_spec="sim:8GiB")
        cfg = {"simulated": True, "gpu": 0, "sim_spec": "sim:8GiB", "work": str(work),
               "out": str(tmp_path), "script": str(main.SCRIPT), "plan": the_plan.to_json(),
               "facts": {}, "worker_env": {}, "sim_dir": str(work / "sim"),
               "vramtui_env": {"VRAMTUI_RUNTIME_DIR": str(work / "run"),
                               "VRAMTUI_STATE_DIR": str(work / "state"),
                               "VRAMTUI_CONFIG_DIR": str(work / "cfg")}}
        env = {**env_here(), "PYTHONPATH": os.pathsep.join([str(ROOT / "scripts"), str(ROOT)])}
        t0 = time.monotonic()
        # the probe waits longer than a second by itself (settle windows), so 1 s stops it
        rows, _facts = main.run_stage("probe", cfg, sys.executable, env, 1.0, log)
        assert time.monotonic() - t0 < 30
        main.sweep(work, log)
        assert main.marked_pids(work) == []
    finally:
        log.close()
        main.shutil.rmtree(work, ignore_errors=True)
    assert [r.check for r in rows] == list(table.STAGE_ROWS["probe"])
    stopped = [r for r in rows if r.status == table.NOT_RUN]
    assert stopped and all("time limit" in r.why for r in stopped)


# -- the pure parts ---------------------------------------------------------------------------


def test_tolerance_is_2_percent_or_64_mib() -> None:
    assert compare.within(1024 + 64, 1024) and not compare.within(1024 + 65, 1024)
    assert compare.within(10_000 - 200, 10_000) and not compare.within(10_000 - 201, 10_000)
    assert not compare.within(None, 0)


def test_the_plan_oversubscribes_twice_and_each_backend_fits_alone() -> None:
    for total in (8192, 24576, 143771):
        p = plan.make_plan(total, simulated=False)
        peaks = [b.peak_mib for b in p.trace]
        assert sum(peaks) == pytest.approx(2 * total, abs=len(peaks))
        assert max(peaks) + 512 < total  # its own peak and the default safety margin
        doc = plan.backends(p, script=main.SCRIPT, python="py", context_mib=600)
        traced = [s for s in doc["backends"] if s["name"].startswith("dc-trace-")]
        for b, spec in zip(p.trace, traced, strict=True):
            vram = {k: int(v.removesuffix("MiB")) for k, v in spec["vram"].items()}
            assert vram["weights"] + vram["activation"] + vram["context"] == b.peak_mib
            assert spec["env"]["CUDA_ALLOC_WEIGHTS_MIB"] == str(vram["weights"])
            assert spec["gpus"] == [0]
        lying = plan.backends(p, script=main.SCRIPT, python="py", context_mib=600,
                              declare_fraction=0.5)
        assert lying["backends"][1]["vram"]["weights"] != doc["backends"][1]["vram"]["weights"]
        assert lying["backends"][1]["env"] == doc["backends"][1]["env"]  # same real sizes
        assert len(p.trace_jobs()) == 3 * len(p.trace)
        # the model server: an HTTP backend on the same GPU, declaring what its child takes
        server = next(s for s in doc["backends"] if s["name"] == plan.SERVER_NAME)
        assert server["command"][1].endswith("cuda_alloc/server.py") and "${PORT}" in \
            server["command"]
        assert server["vram"]["weights"] == f"{p.server.weights_mib}MiB"
        assert server["gpus"] == [0] and server["http"] == {"health": "/health"}
        assert plan.Plan.from_json(p.to_json()) == p
    with pytest.raises(ValueError, match="too small"):
        plan.make_plan(1024, simulated=False)


def test_the_table_explains_every_row_that_did_not_pass() -> None:
    rows = table.complete([table.ok("a", "1", "1"),
                           table.fail("b", "3 MiB", "1 MiB", "it grew by two")],
                          ["a", "b", "c"], "the stage crashed")
    text = table.render(rows)
    assert "b [FAIL]: it grew by two" in text and "c [not run]: the stage crashed" in text
    assert text.endswith("2 of 3 rows did not pass (b, c)")
    assert table.render(rows[:1]).endswith("passed — 1 rows ok")
    assert [table.Row.from_json(r) for r in json.loads(table.dump(rows))] == rows


class FakeReader:
    def __init__(self, values: list[int | None]) -> None:
        self.values = values
        self.closed = False

    def device(self) -> tuple[int | None, int]:
        return (self.values.pop(0) if self.values else 10), 100

    def close(self) -> None:
        self.closed = True


def test_the_watcher_remembers_every_instant_above_the_total() -> None:
    reader = FakeReader([50, None, 101, 99, 150] + [10] * 5000)
    w = watcher.Watcher(lambda: reader, hz=1e6)
    w.start()
    deadline = time.monotonic() + 20
    while w.readings < 5000 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    s = w.summary()
    assert s["over_count"] == 2 and [o[1] for o in s["over"]] == [101, 150]
    assert s["max_used_mib"] == 150 and s["unreadable"] == 1 and reader.closed
    assert len(s["timeline"]) < watcher.MAX_TIMELINE


def test_sim_sizes() -> None:
    assert main.sim_size("sim:24GiB") == 24576
    assert main.sim_size("sim:8192,sim:4GiB") == 8192
    assert main.sim_size("nvml") is None


class FakeNvml:
    """pynvml at the function level: one 1000 MiB GPU, its processes as given."""

    class NVMLError(Exception):
        pass

    def __init__(self, compute: list[tuple[int, int | None]],
                 graphics: list[tuple[int, int | None]], used: int | None = 300) -> None:
        self.compute, self.graphics, self.used = compute, graphics, used

    @staticmethod
    def _procs(items: list[tuple[int, int | None]]) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else
                                (2**64 - 1 if mib < 0 else mib * readers.MIB))
                for pid, mib in items]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str: return f"h{i}"
    def nvmlDeviceGetName(self, h: str) -> bytes: return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        if self.used is None:
            raise self.NVMLError("gone")
        return SimpleNamespace(total=1000 * readers.MIB, used=self.used * readers.MIB)

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[SimpleNamespace]:
        return self._procs(self.compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: str) -> list[SimpleNamespace]:
        raise self.NVMLError("not supported")


def test_the_nvml_reader_merges_processes_and_keeps_unknowns_unknown() -> None:
    nvml = FakeNvml(compute=[(10, 200), (11, -1), (12, None)], graphics=[])
    reader = readers.NvmlReader(0, nvml)
    assert (reader.name, reader.total_mib) == ("NVIDIA H200", 1000)
    assert reader.device() == (300, 1000)
    assert reader.processes() == {10: 200, 11: None, 12: None}
    nvml.used = None
    assert reader.device() == (None, 1000)


class ProcReader:
    def __init__(self, frames: list[dict[int, int | None]]) -> None:
        self.frames = frames

    def processes(self) -> dict[int, int | None]:
        return self.frames.pop(0) if len(self.frames) > 1 else self.frames[0]


def test_the_worker_pid_or_why_not() -> None:
    soon = time.monotonic() + 2
    assert stages.find_pid(ProcReader([{}, {7: 300}]), 7, set(), soon) == (7, "")
    pid, note = stages.find_pid(ProcReader([{1: 50, 99: 300}]), 7, {1}, time.monotonic() + 2)
    assert pid == 99 and "another PID namespace" in note
    pid, note = stages.find_pid(ProcReader([{7: None}]), 7, set(), time.monotonic() + 0.2)
    assert pid is None and "no memory figure" in note
    pid, note = stages.find_pid(ProcReader([{1: 5}]), 7, {1}, time.monotonic() + 0.2)
    assert pid is None and "never showed on the GPU (NVML lists [1])" in note


@pytest.mark.process
def test_a_relative_python_is_named_absolutely_for_the_descriptors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The descriptors name the interpreter from their own folder: `--python .venv/bin/python`
    # given from the repository wrote a path that existed nowhere, and every backend was refused.
    venv_python = Path(sys.executable)
    monkeypatch.chdir(venv_python.parent.parent)
    relative = os.path.join(venv_python.parent.name, venv_python.name)
    args = main.parse_args(["--python", relative, "--out", str(tmp_path / "out")])
    log = main.Log(tmp_path / "log")
    try:
        env, row = main.prepare_env(args, tmp_path, log)
    finally:
        log.close()
    assert env is not None, row
    assert os.path.isabs(env.python) and env.python == os.path.abspath(relative)
