"""The simulated GPU: spec parsing, worker_sdk.sim ledgers, and real processes coming and going."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.gpu.errors import BadGpuSpec
from supervisor.gpu.model import Probe
from supervisor.gpu.select import open_probe
from supervisor.gpu.sim import SimulatedProbe, parse_sim_spec
from worker_sdk import sim

ROOT = Path(__file__).resolve().parents[1]
CONTEXT = 256

CHILD = """
import sys
from worker_sdk import sim
sim.attach()
if len(sys.argv) > 1:
    sim.allocate(int(sys.argv[1]))
print("ready", sim.used(), flush=True)
sys.stdin.read()
"""


def spawn(ledger: Path, gpu: int, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, VRAMTUI_SIM_DIR=str(ledger), VRAMTUI_SIM_GPU=str(gpu))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # EOF ("") if the child died
    assert line.startswith("ready"), f"child failed: {line!r}"
    return proc


@pytest.fixture
def declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This test process itself as a simulated worker on GPU 0."""
    ledger = tmp_path / "ledger"
    monkeypatch.setenv(sim.ENV_DIR, str(ledger))
    monkeypatch.setenv(sim.ENV_GPU, "0")
    yield ledger
    sim.detach()


def write_record(ledger: Path, name: str, record: object) -> Path:
    ledger.mkdir(exist_ok=True)
    path = ledger / name
    path.write_text(json.dumps(record))
    return path


# --- spec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("sim:24GiB", [24576]),
        ("sim:24GiB,sim:8GiB", [24576, 8192]),
        (" sim:8192MiB , SIM:8gib ", [8192, 8192]),
        ("sim:8192", [8192]),
        ("sim:1.5GiB", [1536]),
    ],
)
def test_parse_spec(spec: str, sizes: list[int]) -> None:
    assert parse_sim_spec(spec) == sizes


@pytest.mark.parametrize(
    "spec", ["24GiB", "sim:", "sim:0", "sim:-1GiB", "sim:8TB", "sim:1.5", "sim:24GiB,8GiB", ""]
)
def test_bad_spec(tmp_path: Path, spec: str) -> None:
    with pytest.raises(ValueError, match=r"sim:<size>|whole number of MiB") as info:
        SimulatedProbe(spec, tmp_path)
    assert isinstance(info.value, BadGpuSpec) and "\n" not in str(info.value)


def test_empty_ledger(tmp_path: Path) -> None:
    probe = SimulatedProbe("sim:24GiB,sim:8GiB", tmp_path / "new")
    assert isinstance(probe, Probe)
    assert (probe.source, probe.simulated, probe.driver_version) == ("simulated", True, None)
    d0, d1 = probe.devices()
    assert (d0.index, d0.total_mib, d0.used_mib, d0.free_mib) == (0, 24576, 0, 24576)
    assert (d1.name, d1.total_mib, d1.free_mib) == ("Simulated GPU (8 GiB)", 8192, 8192)
    assert probe.processes() == []


def test_open_probe_sim(tmp_path: Path) -> None:
    probe, notice = open_probe("sim:8GiB,sim:4GiB", ledger_dir=tmp_path)
    assert notice is None and [d.total_mib for d in probe.devices()] == [8192, 4096]


# --- real processes -----------------------------------------------------------------------


@pytest.mark.process
def test_real_workers_come_and_go(tmp_path: Path) -> None:
    probe = SimulatedProbe("sim:24GiB,sim:8GiB", tmp_path, context_mib=CONTEXT)
    idle = spawn(tmp_path, 0)  # attached only: just the context
    busy = spawn(tmp_path, 1, "1000")
    try:
        procs = {p.pid: (p.gpu_index, p.used_mib) for p in probe.processes()}
        assert procs == {idle.pid: (0, CONTEXT), busy.pid: (1, 1000 + CONTEXT)}
        d0, d1 = probe.devices()
        assert (d0.used_mib, d1.used_mib, d1.free_mib) == (CONTEXT, 1256, 8192 - 1256)

        busy.send_signal(signal.SIGKILL)
        busy.wait(timeout=10)
        assert [p.pid for p in probe.processes()] == [idle.pid]
        assert probe.devices()[1].used_mib == 0
        assert not (tmp_path / f"{busy.pid}.json").exists()

        assert idle.stdin is not None
        idle.stdin.close()  # ends normally, without telling anyone
        idle.wait(timeout=10)
        assert probe.processes() == [] and probe.devices()[0].used_mib == 0
    finally:
        for proc in (idle, busy):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.process
def test_dead_pid_record_is_deleted(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(gone.stdout)
    path = write_record(tmp_path, f"{pid}.json",
                        {"pid": pid, "gpu": 0, "mib": 5000, "start_time": None})
    probe = SimulatedProbe("sim:24GiB", tmp_path)
    assert probe.processes() == [] and probe.devices()[0].used_mib == 0
    assert not path.exists()


def test_reused_pid_record_is_deleted(declared: Path) -> None:
    sim.allocate(100)
    path = declared / f"{os.getpid()}.json"
    record = json.loads(path.read_text())
    probe = SimulatedProbe("sim:24GiB", declared)
    assert [p.pid for p in probe.processes()] == [os.getpid()]
    if record["start_time"] is None:
        pytest.skip("no /proc here: start times are not recorded")
    record["start_time"] -= 1  # same pid, another process
    path.write_text(json.dumps(record))
    assert probe.processes() == []
    assert not path.exists()


def test_record_without_start_time_counts_if_pid_alive(tmp_path: Path) -> None:
    pid = os.getpid()
    write_record(tmp_path, f"{pid}.json", {"pid": pid, "gpu": 0, "mib": 10, "start_time": None})
    probe = SimulatedProbe("sim:24GiB", tmp_path, context_mib=0)
    assert probe.devices()[0].used_mib == 10


def test_foreign_and_partial_files_are_ignored(tmp_path: Path) -> None:
    pid = os.getpid()
    keep = [
        write_record(tmp_path, "junk.json", {"pid": pid}),
        write_record(tmp_path, "1.json", {"pid": pid, "gpu": 0, "mib": 10}),  # name != pid
        write_record(tmp_path, f"{pid}.json", {"pid": pid, "gpu": 0, "mib": -5}),
        write_record(tmp_path, "list.json", [1, 2, 3]),
        write_record(tmp_path, "true.json", {"pid": True, "gpu": 0, "mib": 1}),
    ]
    partial = tmp_path / "4242.json"
    partial.write_text('{"pid": 4242, "gpu": 0, "mi')
    (tmp_path / "subdir.json").mkdir()
    probe = SimulatedProbe("sim:24GiB", tmp_path)
    assert probe.processes() == [] and probe.devices()[0].used_mib == 0
    assert all(p.exists() for p in [*keep, partial])


def test_gpu_outside_the_spec_is_ignored_but_kept(tmp_path: Path) -> None:
    pid = os.getpid()
    path = write_record(tmp_path, f"{pid}.json", {"pid": pid, "gpu": 3, "mib": 1})
    probe = SimulatedProbe("sim:24GiB", tmp_path)
    assert probe.processes() == [] and path.exists()


# --- worker_sdk.sim -----------------------------------------------------------------------


def test_sdk_is_a_noop_on_a_real_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sim.ENV_DIR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert not sim.enabled()
    sim.attach()
    assert sim.allocate(100) == 0 and sim.free(10) == 0 and sim.used() == 0
    sim.reset()
    sim.detach()
    assert list(tmp_path.iterdir()) == []


def test_sdk_declares_and_probe_reads(declared: Path) -> None:
    probe = SimulatedProbe("sim:24GiB", declared, context_mib=CONTEXT)
    path = declared / f"{os.getpid()}.json"
    sim.attach()
    assert probe.devices()[0].used_mib == CONTEXT and sim.used() == 0
    assert sim.allocate(1000) == 1000 and sim.allocate(24) == 1024
    assert sim.free(1000) == 24 and sim.free(100) == 0  # never below 0
    sim.allocate(30000)  # over-committed: reported as it is
    d0 = probe.devices()[0]
    assert (d0.used_mib, d0.free_mib) == (30000 + CONTEXT, 0)
    record = json.loads(path.read_text())
    assert record["pid"] == os.getpid() and record["gpu"] == 0 and record["mib"] == 30000
    assert [p.name for p in declared.iterdir()] == [path.name]  # no temporary files left
    sim.reset()  # still attached: the context stays
    assert sim.used() == 0 and probe.devices()[0].used_mib == CONTEXT
    sim.detach()
    assert not path.exists() and probe.devices()[0].used_mib == 0


def test_sdk_rejects_bad_values(declared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="non-negative integer"):
            sim.allocate(bad)  # type: ignore[arg-type]
    monkeypatch.setenv(sim.ENV_GPU, "first")
    with pytest.raises(ValueError, match=sim.ENV_GPU):
        sim.attach()


def test_sdk_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(sim.__file__).read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    tops = {m.split(".")[0] for m in modules}
    assert tops - set(sys.stdlib_module_names) == set()
