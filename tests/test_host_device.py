"""The host device (``--gpus host[:SIZE]``): the host's memory, measured by the kernel.

The readers on a /proc and a cgroup tree of our own (their figures exact), the choice and its
errors, then real workers holding real, touched memory, with /proc read here as the oracle,
not through the engine."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admission_checker import Watching
from engine_support import ROOT, engine
from other_user import needs_other_user, run_as_other_user
from prometheus_client.parser import text_string_to_metric_families
from serve_support import cli, in_process
from waiting import wait_until, wait_until_async

from supervisor import JobState
from supervisor.backends.schema import HOST_GPU, build_spec
from supervisor.gpu.combined import CombinedProbe
from supervisor.gpu.errors import BadGpuSpec
from supervisor.gpu.host import ENGINE_MARK, HostProbe, parse_host_spec
from supervisor.gpu.procmem import cgroup_dirs, cgroup_memory, process_memory
from supervisor.gpu.select import open_probe
from supervisor.http.metrics import Exporter

HOSTMEM = ROOT / "tests" / "workers" / "hostmem.py"
GIB_KB = 1024 * 1024


# -- a /proc of our own -------------------------------------------------------------------------
def fake_proc(root: Path, *, total_kb: int = 16 * GIB_KB, available_kb: int = 12 * GIB_KB,
              procs: dict[int, tuple[int, int]] | None = None, cgroup: str = "0::/\n",
              last_pid: int = 100) -> Path:
    """``procs``: pid -> (parent, PSS in kB); pid 1 is the engine."""
    proc = root / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: {total_kb} kB\nMemFree: 1 kB\n"
                                  f"MemAvailable: {available_kb} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    (proc / "loadavg").write_text(f"0.1 0.1 0.1 1/10 {last_pid}\n")
    for pid, (parent, pss) in (procs or {}).items():
        add_process(proc, pid, parent, pss)
    return proc


def add_process(proc: Path, pid: int, parent: int, pss_kb: int, start: int = 7) -> None:
    d = proc / str(pid)
    d.mkdir(exist_ok=True)
    fields = ["S", str(parent)] + ["0"] * 17 + [str(start)]
    (d / "stat").write_text(f"{pid} (py thon) {' '.join(fields)} 0 0\n")
    (d / "smaps_rollup").write_text(f"00-ff ---p 0 0:0 0 [rollup]\nRss: {pss_kb * 2} kB\n"
                                    f"Pss: {pss_kb} kB\nPss_Anon: {pss_kb} kB\n")
    (d / "statm").write_text(f"1000 {pss_kb * 2 // 4} 0 0 0 0 0\n")


def probe_on(proc: Path, spec: str = "host", reserve: int = 0, cg: str = "/nonexistent"
             ) -> HostProbe:
    """A probe of ``proc`` whose clock moves 10 s a reading (each one discovers anew)."""
    ticks = iter(range(0, 10**6, 10))
    return HostProbe(spec, reserve_mib=reserve, root=1, proc=str(proc), cgroup_root=cg,
                     clock=lambda: float(next(ticks)))


def test_the_budget_is_the_smaller_of_size_and_what_the_kernel_gives(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, procs={2: (1, 512 * 1024)})  # a worker holding 512 MiB
    whole = probe_on(proc, reserve=1024).devices()[0]
    assert (whole.name, whole.source) == ("host memory", "host")
    # no size: the machine less the reserve; used is what the host uses (16 - 12 GiB)
    assert whole.total_mib == 16 * 1024 - 1024
    assert whole.free_mib == 12 * 1024 - 1024
    assert whole.used_mib == 4 * 1024
    small = probe_on(proc, "host:2GiB", reserve=1024).devices()[0]
    # a size below what is available: the size, less what ours hold
    assert (small.total_mib, small.free_mib, small.used_mib) == (2048, 1536, 512)
    (proc / "meminfo").write_text(f"MemTotal: {16 * GIB_KB} kB\nMemAvailable: 1572864 kB\n")
    tight = probe_on(proc, "host:2GiB", reserve=1024).devices()[0]
    assert tight.free_mib == 1536 - 1024  # the kernel gives less than the size: its figure
    assert tight.used_mib - 512 == 2048 - 512 - 512  # what the others take from it: foreign


def test_a_cgroup_limit_is_read_and_reread(tmp_path: Path) -> None:
    cg = tmp_path / "cg"
    group = cg / "work"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(str(3 * 2**30))
    (group / "memory.current").write_text(str(2**30))
    proc = fake_proc(tmp_path, cgroup="0::/work\n")
    assert cgroup_memory(cgroup_dirs(str(proc), str(cg))) is not None
    probe = probe_on(proc, reserve=256, cg=str(cg))
    r = probe.devices()[0]
    assert (r.total_mib, r.free_mib, r.used_mib) == (3072 - 256, 2048 - 256, 1024)
    (group / "memory.current").write_text(str(2 * 2**30))  # re-read as it changes
    assert probe.devices()[0].free_mib == 1024 - 256
    assert probe.host_used_mib() == 2048
    (group / "memory.max").write_text("max")
    assert probe.devices()[0].total_mib == 16 * 1024 - 256
    v1 = tmp_path / "v1"
    (v1 / "memory" / "work").mkdir(parents=True)
    (v1 / "memory" / "work" / "memory.limit_in_bytes").write_text(str(2**30))
    (v1 / "memory" / "work" / "memory.usage_in_bytes").write_text(str(2**29))
    proc1 = fake_proc(tmp_path / "b", cgroup="4:memory:/work\n")
    found = cgroup_memory(cgroup_dirs(str(proc1), str(v1)))
    assert found is not None and (found.limit_mib, found.current_mib) == (1024, 512)


def test_pss_of_whole_trees_orphans_kept_and_unreadable_counted(tmp_path: Path,
                                                                  caplog: Any) -> None:
    proc = fake_proc(tmp_path, procs={2: (1, 100 * 1024), 3: (2, 50 * 1024),
                                       9: (77, 999 * 1024)})  # 9: not ours
    probe = probe_on(proc)
    seen = {p.pid: p.used_mib for p in probe.processes()}
    assert seen == {2: 100, 3: 50}
    # the worker exits, its child lives on (re-parented to init): still counted, as an orphan
    (proc / "2" / "stat").unlink()
    (proc / "2" / "smaps_rollup").unlink()
    add_process(proc, 3, 0, 50 * 1024)  # parent: not the engine
    seen = {p.pid: p.used_mib for p in probe.processes()}
    assert seen == {3: 50} and probe.orphans == {3}
    # its PSS cannot be read (another user's): its RSS, said so, never 0
    (proc / "3" / "smaps_rollup").unlink()
    (proc / "3" / "smaps_rollup").mkdir()
    with caplog.at_level("WARNING"):
        seen = {p.pid: p.used_mib for p in probe.processes()}
    assert seen == {3: 100} and probe.estimated == {3}
    assert "smaps_rollup cannot be read" in caplog.text
    gone = process_memory(4242, str(proc))
    assert gone is None


@pytest.mark.parametrize(("spec", "says"), [
    ("host:0", "at least 1 MiB"), ("host:abc", "'abc' is not a size"),
    ("host:-3GiB", "negative"), ("host:99TiB", "more than this machine's memory"),
    ("host,auto", "one host device at most, and last"), ("host,host:1GiB", "at most"),
])
def test_bad_host_specs_are_one_line_errors(tmp_path: Path, spec: str, says: str) -> None:
    with pytest.raises(BadGpuSpec, match=says) as info:
        open_probe(spec, ledger_dir=tmp_path)
    assert "\n" not in str(info.value)


def test_host_beside_gpus_is_numbered_after_them(tmp_path: Path) -> None:
    assert parse_host_spec("host") is None and parse_host_spec("HOST:1GiB") == 1024
    probe, notice = open_probe("sim:8GiB,sim:4GiB,host:1GiB", ledger_dir=tmp_path)
    assert isinstance(probe, CombinedProbe) and notice is None
    devices = probe.devices()
    assert [(d.index, d.source) for d in devices] == [(0, "simulated"), (1, "simulated"),
                                                      (2, "host")]
    assert devices[2].name == "host memory" and probe.source == "simulated+host"
    probe.close()
    spec = build_spec("cpu", {"command": ["true"], "gpus": ["host"]},
                      base_dir=lambda _key: tmp_path)
    assert spec.gpus == (HOST_GPU,)


# -- real workers, real memory ------------------------------------------------------------------
def host_backend(name: str, weights: int, activation: int, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name, "script": str(HOSTMEM), "safety": "8MiB",
        "env": {"HOSTMEM_WEIGHTS_MIB": str(weights), "HOSTMEM_ACTIVATION_MIB": str(activation)},
        "timeouts": {"stop_grace": "3s", "start": "20s"},
    }
    spec.update(extra)
    return spec


def _env(pid: int, key: bytes) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in environ.split(b"\0"):
        if item.startswith(key + b"="):
            return item.split(b"=", 1)[1].decode()
    return None


def backend_of(pid: int) -> str | None:
    return _env(pid, b"VRAMTUI_BACKEND")


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _of_this_test(pid: int) -> bool:
    """Its engine (the pid every worker carries) is this process or one it started: another
    test running beside this one on the box has workers of the same names."""
    engine = _env(pid, ENGINE_MARK.encode())
    if engine is None or not engine.isdigit():
        return False
    return int(engine) == os.getpid() or _parent(int(engine)) == os.getpid()


def pss_mib(pid: int) -> float:
    """Read here, from the kernel: the process's PSS (0 once gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    line = next(x for x in text.splitlines() if x.startswith("Pss:"))
    return int(line.split()[1]) / 1024


def our_workers() -> dict[str, list[int]]:
    """backend -> pids of this test's worker processes, found in /proc by their environment."""
    out: dict[str, list[int]] = {}
    me = os.getpid()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            backend = backend_of(int(name))
            if backend is not None and backend.startswith("host-") and _of_this_test(int(name)):
                out.setdefault(backend, []).append(int(name))
    return out


class Resident(Watching):
    """A thread reading /proc: which backends hold more than ``floor_mib`` at each instant."""

    def __init__(self, floor_mib: float) -> None:
        super().__init__("resident")
        self.floor = floor_mib
        self.together: list[dict[str, float]] = []
        self.seen: set[str] = set()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            held = {b: sum(pss_mib(p) for p in pids) for b, pids in our_workers().items()}
            big = {b: mib for b, mib in held.items() if mib >= self.floor}
            self.seen |= set(big)
            if len(big) > 1:
                self.together.append(big)


@pytest.mark.process
def test_two_that_cannot_share_the_budget_alternate_never_resident_together() -> None:
    backends = [host_backend("host-a", 60, 20, vram={"peak": "110MiB"}),
                host_backend("host-b", 60, 20, vram={"peak": "110MiB"})]
    with engine(backends, gpus="host:180MiB") as sup, Resident(floor_mib=50) as watch:
        for name in ("host-a", "host-b", "host-a", "host-b"):
            job = sup.submit(name, b'{"step_s": 0.2}')
            assert sup.wait(job, 60).state is JobState.SUCCEEDED
        log = [line.text for line in sup.snapshot().log]
    assert watch.seen == {"host-a", "host-b"}  # both ran, each really held its memory
    assert not watch.together, watch.together[:3]
    assert sum("evicting" in line for line in log) >= 3


@pytest.mark.process
def test_backends_json_is_within_ten_percent_of_proc_and_labelled_host_memory() -> None:
    backends = [host_backend("host-big", 80, 10, vram={"peak": "200MiB"})]
    with in_process(backends, gpus="host:1GiB") as (sup, _server, root):
        assert sup.wait(sup.submit("host-big", b"{}"), 60).state is JobState.SUCCEEDED
        pid = wait_until(lambda: sup.snapshot().backend("host-big").pid, what="its worker")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
        env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
                   VRAMTUI_CONFIG_DIR=str(root / "cfg"))

        def close() -> dict[str, Any] | None:
            done = cli(env, "backends", "--json")
            assert done.returncode == 0, done.stderr
            row = next(b for b in json.loads(done.stdout) if b["name"] == "host-big")
            truth = pss_mib(pid)
            ok = row["observed_mib"] is not None and abs(row["observed_mib"] - truth) <= \
                0.1 * truth
            return row if ok else None

        row = wait_until(close, deadline=20, what="backends --json close to /proc")
        assert row["memory_kind"] == "host memory" and not row["simulated"]
        assert row["observed_mib"] >= 80
        status = cli(env, "status")
        assert "host memory" in status.stdout and "SIMULATED" not in status.stdout
        gpus = cli(env, "gpus", "--json")
        assert gpus.returncode == 0, gpus.stderr
        (device,) = json.loads(gpus.stdout)
        assert (device["kind"], device["name"], device["simulated"]) == \
            ("host memory", "host memory", False)
        listed = cli(env, "gpus").stdout
        assert "devices: host memory" in listed and str(pid) in listed
        page = Exporter(sup.engine, "test", {}).render().decode()
        info = [s for f in text_string_to_metric_families(page) for s in f.samples
                if s.name == "vramtui_backend_info"]
        assert [(s.labels, s.value) for s in info] == \
            [({"backend": "host-big", "simulated": "false"}, 1.0)]  # real figures: false


@pytest.mark.process
def test_a_child_outliving_its_worker_stays_counted() -> None:
    backends = [host_backend("host-parent", 10, 0, vram={"peak": "200MiB"},
                             env={"HOSTMEM_WEIGHTS_MIB": "10", "HOSTMEM_ORPHAN_MIB": "40",
                                  "HOSTMEM_ORPHAN_S": "20"})]
    orphans: set[int] = set()
    with engine(backends, gpus="host:1GiB") as sup:
        try:
            assert sup.wait(sup.submit("host-parent", b"{}"), 60).state is JobState.SUCCEEDED
            worker = wait_until(lambda: sup.snapshot().backend("host-parent").pid)
            # A worker that crashes (a stop or a kill takes what left its group with it)
            sup.wait(sup.submit("host-parent", b'{"exit": true}'), 60)
            wait_until(lambda: not os.path.exists(f"/proc/{worker}/cmdline"),
                       what="its worker gone")
            probe = sup.engine.probe
            assert isinstance(probe, HostProbe)
            orphans = wait_until(lambda: probe.orphans, what="the child seen as an orphan")
            gpu = wait_until(lambda: next((g for g in sup.snapshot().gpus if (g.used_mib or 0)
                                           >= 40 and (g.foreign_mib or 0) >= 40), None),
                             what="the orphan's memory in the host's figures")
            held = {p.pid: p.used_mib for p in gpu.processes}
            assert worker not in held
            for pid in orphans:
                assert held.get(pid, 0) >= 40  # counted: foreign, as its worker is gone
            log = [line.text for line in sup.snapshot().log]
            assert any("outlived it: counted as foreign" in line for line in log), log[-5:]
        finally:
            for pid in orphans:
                os.kill(pid, signal.SIGKILL)


@pytest.mark.process
def test_a_calibration_on_the_host_finds_the_weights() -> None:
    backends = [host_backend("host-cal", 200, 80, vram={"peak": "600MiB"},
                             env={"HOSTMEM_WEIGHTS_MIB": "200", "HOSTMEM_ACTIVATION_MIB": "80",
                                  "HOSTMEM_LOAD_S": "0.3", "HOSTMEM_STEP_S": "0.4"})]
    with engine(backends, gpus="host:2GiB") as sup:
        result = sup.wait(sup.calibrate("host-cal", repeats=1, settle_s=0.3), 90)
        assert result.state is JobState.SUCCEEDED, result.error
        summary = json.loads(result.data or b"{}")
    # PSS splits the interpreter's shared pages among every Python process on the host, and
    # that share moves as a busy host starts and ends them (26 and 31 MiB seen in CI): the
    # weights nearer 200 than weights + activation (280), which is what tells them apart
    assert abs(summary["weights_mib"] - 200) < 40, summary
    assert summary["context_mib"] and summary["context_mib"] < 100, summary


def _marked_here() -> list[int]:
    """Processes that carry this process's engine mark: left by an engine of an earlier test
    here (a worker's child that left its group, say). The host probe of the next engine in
    this process takes them for its own orphans, which no worker owns: others' memory."""
    mark = f"{ENGINE_MARK}={os.getpid()}".encode()
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            with contextlib.suppress(OSError):
                if mark in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                    found.append(int(name))
    return found


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    for pid in _marked_here():  # another file's engine, run in this process before
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    yield
    for pids in our_workers().values():
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# -- every face says "host memory" --------------------------------------------------------------
@pytest.mark.process
def test_every_face_labels_the_host_device_host_memory() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from supervisor.doors.codec import backend_json, gpu_json
    from supervisor.http.gpu_ids import device_uuids
    from supervisor.http.metrics import EngineCollector
    from vramtui.output import backend_table, devices_kind, gpu_table

    backends = [host_backend("host-x", 10, 0, vram={"peak": "64MiB"})]
    with engine(backends, gpus="sim:1GiB,host:512MiB") as sup:
        snap = sup.snapshot()
        sim, host = snap.gpus
        assert (sim.kind, host.kind, host.name, host.simulated) == \
            ("SIMULATED", "host memory", "host memory", False)
        assert gpu_json(host, "HOST-1")["kind"] == "host memory"
        assert device_uuids({0: "simulated", 1: "host"}) == {0: "SIM-0", 1: "HOST-1"}
        view = snap.backend("host-x")
        assert view is not None
        assert backend_json(view, snap, {})["memory"]["kind"] is None  # runs nowhere yet
        registry = CollectorRegistry()
        registry.register(EngineCollector(sup.engine, "test", {1: "HOST-1"}))
        metrics = generate_latest(registry).decode()
        assert 'kind="host memory"' in metrics and 'modelName="host memory"' in metrics
        assert devices_kind(snap) == "SIMULATED + host memory"
        table = gpu_table(snap).render() + backend_table(snap).render()
        assert "host memory" in table
        assert "engine started: SIMULATED: GPU0 1024 MiB; host memory: GPU1 512 MiB" in \
            [line.text for line in snap.log]


def test_config_yaml_chooses_the_host_device_and_its_reserve(tmp_path: Path) -> None:
    import argparse

    from supervisor.errors import VramtuiError
    from supervisor.paths import Paths
    from vramtui.serve import engine_config

    paths = Paths(config_dir=tmp_path, state_dir=tmp_path, runtime_dir=tmp_path)
    settings = tmp_path / "config.yaml"
    settings.write_text("engine:\n  gpus: [auto, host]\n  host_reserve: 2GiB\n")
    config = engine_config(argparse.Namespace(gpus=None), paths, {})
    assert (config.gpus, config.host_reserve_mib) == ("auto,host", 2048)
    settings.write_text("engine:\n  gpus: host:48GiB\n")
    assert engine_config(argparse.Namespace(gpus=None), paths, {}).gpus == "host:48GiB"
    assert engine_config(argparse.Namespace(gpus="sim:8GiB"), paths, {}).gpus == "sim:8GiB"
    settings.write_text("engine:\n  gpus: [3]\n")
    with pytest.raises(VramtuiError, match="expected what --gpus takes"):
        engine_config(argparse.Namespace(gpus=None), paths, {})
    settings.write_text("engine:\n  host_reserve: lots\n")
    with pytest.raises(VramtuiError, match="host_reserve"):
        engine_config(argparse.Namespace(gpus=None), paths, {})


@pytest.mark.process
@pytest.mark.parametrize(("spec", "says"), [("host:0", "at least 1 MiB"),
                                            ("host:99TiB", "more than this machine")])
def test_serve_refuses_a_bad_host_device_in_one_line(tmp_path: Path, spec: str,
                                                     says: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(tmp_path / "run"), VRAMTUI_STATE_DIR=str(tmp_path / "s"),
               VRAMTUI_CONFIG_DIR=str(tmp_path / "cfg"))
    done = cli(env, "--serve", "--gpus", spec)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr


@pytest.mark.process
def test_what_is_built_on_measurements_works_on_the_host() -> None:
    """Unmeasured runs alone until measured, learned peaks, a liar caught (on_overuse: kill),
    memory freed once the process is gone."""
    backends = [host_backend("host-new", 40, 20),  # nothing declared: measured first
                host_backend("host-liar", 100, 0, vram={"peak": "30MiB"}, on_overuse="kill")]
    with engine(backends, gpus="host:600MiB") as sup:
        # (its job lasts 2 s: the device held whole is seen between two polls of a busy box)
        first = sup.submit("host-new", b'{"step_s": 2.0}')
        wait_until(lambda: sup.snapshot().backend("host-new").reserved_mib >= 600,
                   what="the unmeasured backend holding the device whole")
        assert sup.wait(first, 60).state is JobState.SUCCEEDED
        new = sup.snapshot().backend("host-new")
        assert new.learned_peak_mib is not None and new.learned_peak_mib >= 60
        assert new.reserved_mib < 600  # measured: it shares now
        lie = sup.wait(sup.submit("host-liar", b'{"step_s": 1.5}'), 60)
        assert lie.state is JobState.FAILED, lie
        log = [line.text for line in sup.snapshot().log]
        assert any("host-liar killed" in line for line in log), log[-8:]
        liar = wait_until(lambda: (b := sup.snapshot().backend("host-liar")).pid is None and
                          b.reserved_mib == 0 and b, what="the liar's memory freed once gone")
        assert liar.learned_peak_mib is not None and liar.learned_peak_mib >= 100


def _pids_with(marker: bytes) -> list[int]:
    """Processes whose command line holds ``marker``, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
    return found


def _lifelines() -> list[int]:
    """This process's lifeline watchers, found in /proc by parent and command line."""
    return [pid for pid in _pids_with(b"lifeline.py") if _parent(pid) == os.getpid()]


@pytest.mark.process
def test_the_engines_own_lifeline_is_no_stranger_on_the_host() -> None:
    """The engine's lifeline (the watcher that kills its workers if it dies) is part of the
    engine: the host device never lists it, and nothing is held back for "others" because of
    it (it was counted as a stranger of ~8 MiB; a second process beside it once put a device
    held whole by an unmeasured worker over-committed)."""
    with engine([host_backend("host-l", 40, 10, vram={"peak": "80MiB"})],
                gpus="host:600MiB") as sup:
        assert sup.wait(sup.submit("host-l", b'{"step_s": 0.2}'), 60).state \
            is JobState.SUCCEEDED
        (lifeline,) = _lifelines()
        assert pss_mib(lifeline) > 1  # it holds memory: counted, it would show
        workers = set(our_workers()["host-l"])
        # Samples for 2.5 s of the engine's own clock: the probe passes over /proc (where it
        # finds the lifeline, a child of this process) at least every second.
        since = sup.snapshot().gpus[0].history[-1][0]
        gpu = wait_until(lambda: (g := sup.snapshot().gpus[0]).history[-1][0] >= since + 2.5
                         and g, deadline=20, what="2.5 s more of samples")
        assert {p.pid for p in gpu.processes} == workers, gpu.processes
        assert lifeline not in {p.pid for p in gpu.processes}
        assert gpu.foreign_mib == 0 and gpu.others_mib == 0, (gpu.foreign_mib, gpu.others_mib)


@pytest.mark.process
def test_a_yield_when_command_is_the_engines_not_a_stranger_on_the_host() -> None:
    """A ``yield_when`` command is the engine asking a question: while it runs (holding
    40 MiB here, 4 s each time, longer than a stranger must stay to be counted), the host
    device holds nothing back for "others" because of it (it held back 46 MiB). Only the
    instant between its start and the engine's own() may see it once in a sample."""
    import sys

    from supervisor.engine import EngineConfig
    from supervisor.engine.rules import parse_rules

    marker = "vramtui-yield-question"
    command = [sys.executable, "-c", "import time; b = b'1' * (40 << 20); time.sleep(4); "
               "raise SystemExit(1)", marker]
    rules = parse_rules([{"command": command, "timeout": "10s", "every": "0.2s"}], "test")
    config = EngineConfig(reserve_mib=0, tick_s=0.1, yield_when=rules)
    with engine([host_backend("host-q", 40, 10, vram={"peak": "80MiB"})],
                gpus="host:600MiB", config=config) as sup:
        assert sup.wait(sup.submit("host-q", b'{"step_s": 0.2}'), 60).state \
            is JobState.SUCCEEDED
        asked: set[int] = set()
        others = 0
        held_mib = 0.0

        def watched_enough() -> bool:
            nonlocal others, held_mib
            now = _pids_with(marker.encode())
            asked.update(now)
            held_mib = max([held_mib, *(pss_mib(p) for p in now)])
            others = max(others, sup.snapshot().gpus[0].others_mib)
            return len(asked) >= 2  # a second question: the first ran its 4 s whole

        wait_until(watched_enough, deadline=30, what="two yield_when questions")
    assert held_mib >= 30  # each question really held memory while it ran
    assert others == 0


def test_without_proc_the_host_device_says_why(tmp_path: Path) -> None:
    from supervisor.gpu.errors import GpuUnavailable

    with pytest.raises(GpuUnavailable, match="needs Linux's /proc") as info:
        HostProbe("host", proc=str(tmp_path / "nothing"))
    assert "\n" not in str(info.value)


@pytest.mark.process
def test_the_dashboard_labels_the_host_device() -> None:
    import asyncio

    from vramtui.app import VramApp
    from vramtui.app.widgets.engine_header import EngineHeader
    from vramtui.app.widgets.gpu_panel import GpuPanel

    async def look(sup: Any) -> tuple[str, str, str]:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=(160, 48)) as pilot:
            panels = await wait_until_async(
                lambda: [p for p in app.screen.query(GpuPanel) if p.border_subtitle], 20,
                "the device's panel, shown",
                                            pause=lambda: pilot.pause(0.05))
            header = app.screen.query_one(EngineHeader).render().plain
            return header, str(panels[0].border_title), str(panels[0].border_subtitle)

    with engine([host_backend("host-t", 10, 0, vram={"peak": "64MiB"})],
                gpus="host:512MiB") as sup:
        header, title, subtitle = asyncio.run(asyncio.wait_for(look(sup), 30))
    assert "HOST MEMORY" in header and "SIMULATED" not in header
    assert "host memory" in title and "SIM" not in title
    assert "host memory" in subtitle


@pytest.mark.process
@needs_other_user
def test_another_users_process_is_counted_at_its_rss_not_zero() -> None:
    """Read as uid 65534, a root process's smaps_rollup is closed: the reader (its own source,
    run by that user) falls back to the RSS, an over-estimate, and says it did."""
    import sys

    from supervisor.gpu import procmem

    hold = "b = bytearray(30 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n" \
           "print(1, flush=True)\ninput()\n"
    child = subprocess.Popen([sys.executable, "-c", hold], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()
        code = Path(procmem.__file__).read_text() + (
            "\nimport sys\nm = process_memory(int(sys.argv[1]))\n"
            "print(m.measured, round(m.mib))\n")
        done = run_as_other_user(code, child.pid)
        assert done.returncode == 0, done.stderr
        measured, mib = done.stdout.split()
        assert measured == "False" and int(mib) >= 30
    finally:
        child.kill()
        child.wait()


@pytest.mark.process
@needs_other_user
def test_another_users_process_with_our_mark_is_not_counted_as_ours() -> None:
    """Anyone may put VRAMTUI_ENGINE_PID=<engine> in their environment, and a root engine
    reads every environment: another user's process that outlived its parent (forked and
    left) and carries the mark must not be taken for an orphan of our workers, or its memory
    would eat the engine's host:SIZE budget."""
    from other_user import other_user_argv

    probe = HostProbe("host:1GiB", reserve_mib=0, root=os.getpid())
    hold = ("import os, sys\nif os.fork(): print(0, flush=True); os._exit(0)\n"
            "b = bytearray(300 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
            "print(os.getpid(), flush=True)\nsys.stdin.read()\n")
    attacker = subprocess.Popen(other_user_argv(hold), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, start_new_session=True,
                                env={ENGINE_MARK: str(os.getpid()), "PATH": "/usr/bin:/bin"})
    assert attacker.stdout is not None
    try:
        attacker.stdout.readline()
        attacker.wait(30)
        held_by = int(attacker.stdout.readline())  # re-parented: not under the engine
        assert _parent(held_by) != os.getpid()
        wait_until(lambda: pss_mib(held_by) >= 290, 30, "the other user to hold 300 MiB")
        listed = {p.pid for p in probe.processes()}
        assert held_by not in listed and held_by not in probe.orphans
        assert probe.devices()[0].free_mib > 1024 - 290  # its 300 MiB are not in the budget
    finally:
        if attacker.stdin is not None:
            attacker.stdin.close()
        attacker.wait(30)


@pytest.mark.process
def test_gpus_host_in_a_descriptor_places_a_backend_on_the_host_device() -> None:
    from supervisor.errors import Refused

    cpu = host_backend("host-cpu", 10, 0, vram={"peak": "64MiB"}, gpus=["host"])
    with engine([cpu], gpus="sim:1GiB,host:512MiB") as sup:
        assert sup.wait(sup.submit("host-cpu", b"{}"), 60).state is JobState.SUCCEEDED
        view = sup.snapshot().backend("host-cpu")
        assert view is not None and view.gpu == 1 and view.pid is not None
        environ = Path(f"/proc/{view.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=" in environ and b"VRAMTUI_SIM_GPU=1" not in environ
    with engine([cpu], gpus="sim:1GiB") as sup, \
            pytest.raises(Refused, match="allows the host device but none of them is present"):
        sup.submit("host-cpu", b"{}")


@pytest.mark.process
def test_a_gpu_workers_host_memory_is_ours_on_the_host_device_not_a_strangers() -> None:
    """With GPUs and the host device (``--gpus auto,host``), the host device lists every
    process of ours, a GPU worker's too: what it holds there counts against the host's room
    (it is taken), as the engine's own, never as others' (no stranger to yield or evict for).
    The truth is the worker's PSS, read here from /proc."""
    gpu_model = host_backend("host-on-gpu", 160, 0, vram={"peak": "200MiB"}, gpus=[0])
    with engine([gpu_model], gpus="sim:1GiB,host:1GiB") as sup:
        assert sup.wait(sup.submit("host-on-gpu", b"{}"), 60).state is JobState.SUCCEEDED
        view = sup.snapshot().backend("host-on-gpu")
        assert view is not None and view.gpu == 0 and view.pid is not None
        pid = view.pid

        def host_device() -> Any:
            host = sup.snapshot().gpus[1]
            truth = pss_mib(pid)
            return host if truth >= 150 and host.ours_mib >= 0.9 * truth else None

        host = wait_until(host_device, deadline=20, what="the worker's host memory as ours")
        truth = pss_mib(pid)
        assert host.foreign_mib is not None and host.foreign_mib < truth / 2, (host, truth)
        assert host.others_mib < truth / 2  # admission holds nothing back for strangers
        # ... but the room it took is not handed out again
        assert host.budget_mib <= host.total_mib - 0.9 * truth, (host, truth)
        log = [line.text for line in sup.snapshot().log]
    assert not any("over-committed" in line or "others" in line for line in log), log
