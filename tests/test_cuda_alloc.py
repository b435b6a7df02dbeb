"""examples/cuda_alloc against a fake libcuda: the ctypes layer and the worker's error paths.

``fakecuda.c`` is compiled here (skipped without a C compiler) into a shared object exporting
the driver functions the worker binds; it counts what is allocated and fails on demand
(out of memory, no device, init failure) through environment variables.  The in-process tests
load it with ctypes; the worker tests run the real worker process over the wire protocol.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from spawning import spawns

from supervisor.gpu.sim import SimulatedProbe
from worker_sdk.testing import WireServer
from worker_sdk.worker import ExitCode

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cuda_alloc"
MAIN = EXAMPLE / "main.py"
sys.path.insert(0, str(EXAMPLE))

import cudadrv  # noqa: E402
import fakecuda  # noqa: E402

MIB = cudadrv.MIB
FAKE_VARS = ("FAKE_CUDA_INIT_ERROR", "FAKE_CUDA_DEVICES", "FAKE_CUDA_TOTAL_MIB",
             "FAKE_CUDA_CONTEXT_MIB", "FAKE_CUDA_ALLOC_LIMIT", "FAKE_CUDA_DIR", "FAKE_CUDA_TRACE")


@pytest.fixture(scope="module")
@spawns
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        lib = fakecuda.build(tmp_path_factory.mktemp("fakecuda"))
    except fakecuda.BuildError as exc:
        pytest.fail(str(exc))
    if lib is None:
        pytest.skip("no C compiler to build the fake libcuda")
    return lib


@pytest.fixture
def fake(fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """The fake loaded in this process, its books reset and its variables cleared."""
    for var in FAKE_VARS:
        monkeypatch.delenv(var, raising=False)
    handle = ctypes.CDLL(str(fake_lib))
    for name in ("fake_cuda_used_bytes", "fake_cuda_alloc_calls", "fake_cuda_free_calls"):
        getattr(handle, name).restype = ctypes.c_ulonglong
    handle.fake_cuda_reset()
    yield handle
    handle.fake_cuda_reset()


def trace_lines(path: Path) -> list[tuple[str, int, int]]:
    out = []
    for line in path.read_text().splitlines():
        what, ptr, size, _pid = line.split()
        out.append((what, int(ptr, 16), int(size)))
    return out


# -- the ctypes layer -----------------------------------------------------------------------


def test_chunks_are_taken_and_given_back_last_first(fake: ctypes.CDLL, fake_lib: Path,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_TRACE", str(tmp_path / "trace"))
    dev = cudadrv.Device(cudadrv.Driver(str(fake_lib)))
    assert dev.name == "Fake CUDA Device 0" and dev.total_bytes == 24576 * MIB
    block = dev.allocate(200 * MIB, 64 * MIB)
    assert [size for _p, size in block.chunks] == [64 * MIB] * 3 + [8 * MIB]
    assert block.mib == 200 and fake.fake_cuda_live() == 4
    assert dev.mem_info() == ((24576 - 200) * MIB, 24576 * MIB)
    block.touch()
    taken = [p for p, _s in block.chunks]
    block.free()
    assert fake.fake_cuda_live() == 0 and fake.fake_cuda_used_bytes() == 0
    lines = trace_lines(tmp_path / "trace")
    assert [p for w, p, _s in lines if w == "alloc"] == taken
    assert [p for w, p, _s in lines if w == "free"] == taken[::-1]
    block.free()  # nothing left: a second free is harmless
    assert fake.fake_cuda_free_calls() == 4


def test_an_allocation_that_fails_half_way_gives_back_what_it_took(
        fake: ctypes.CDLL, fake_lib: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = cudadrv.Device(cudadrv.Driver(str(fake_lib)))
    kept = dev.allocate(64 * MIB)
    monkeypatch.setenv("FAKE_CUDA_ALLOC_LIMIT", "3")  # 1 taken, 2 more succeed, then OOM
    with pytest.raises(cudadrv.CudaError) as info:
        dev.allocate(256 * MIB, 64 * MIB)
    err = info.value
    assert err.out_of_memory and err.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert str(err) == ("cuMemAlloc_v2(64 MiB): CUDA_ERROR_OUT_OF_MEMORY (out of memory) "
                        "after 128 MiB of 256 MiB in 64 MiB chunks")
    assert fake.fake_cuda_live() == 1  # only the block that was kept
    kept.free()
    assert fake.fake_cuda_live() == 0


def test_the_device_memory_limit_is_the_drivers(fake: ctypes.CDLL, fake_lib: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_TOTAL_MIB", "1000")
    dev = cudadrv.Device(cudadrv.Driver(str(fake_lib)))
    big = dev.allocate(900 * MIB)
    with pytest.raises(cudadrv.CudaError, match="after 64 MiB of 200 MiB"):
        dev.allocate(200 * MIB)
    big.free()
    dev.allocate(200 * MIB).free()  # room again once given back


def test_memory_calls_work_from_another_thread(fake: ctypes.CDLL, fake_lib: Path) -> None:
    # A CUDA context is current per thread; worker_sdk runs requests off the main thread.
    dev = cudadrv.Device(cudadrv.Driver(str(fake_lib)))
    box: dict[str, object] = {}

    def other() -> None:
        try:
            block = dev.allocate(128 * MIB)
            box["info"] = dev.mem_info()
            block.free()
        except cudadrv.CudaError as exc:
            box["error"] = exc

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert "error" not in box, box.get("error")
    assert box["info"] == ((24576 - 128) * MIB, 24576 * MIB)


@pytest.mark.parametrize(("env", "message"), [
    ({"FAKE_CUDA_INIT_ERROR": "999"}, "cuInit: CUDA_ERROR_UNKNOWN (unknown error)"),
    ({"FAKE_CUDA_INIT_ERROR": "35"}, "cuInit: CUDA_ERROR_INSUFFICIENT_DRIVER"),
    ({"FAKE_CUDA_INIT_ERROR": "4242"}, "cuInit: CUresult 4242 (no description from the driver)"),
    ({"FAKE_CUDA_DEVICES": "0"}, "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device"),
])
def test_driver_failures_read_as_one_line(fake: ctypes.CDLL, fake_lib: Path,
                                          monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                          message: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(cudadrv.CudaError) as info:
        cudadrv.Device(cudadrv.Driver(str(fake_lib)))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)
    assert fake.fake_cuda_retained() == 0


def test_a_device_that_is_not_there(fake: ctypes.CDLL, fake_lib: Path) -> None:
    with pytest.raises(cudadrv.CudaError, match=r"cuDeviceGet\(2\) of 1 visible device\(s\): "
                                                "CUDA_ERROR_INVALID_DEVICE"):
        cudadrv.Device(cudadrv.Driver(str(fake_lib)), ordinal=2)


def test_no_driver_library(tmp_path: Path) -> None:
    with pytest.raises(cudadrv.CudaUnavailable) as info:
        cudadrv.Driver(str(tmp_path / "libcuda.so.1"))
    text = str(info.value)
    assert "no NVIDIA driver here" in text and "--gpus sim:24GiB" in text


def test_a_library_without_the_driver_api() -> None:
    with pytest.raises(cudadrv.CudaUnavailable, match="has no cuInit: the NVIDIA driver is too "
                                                      "old"):
        cudadrv.Driver("libc.so.6")


def test_a_released_context_is_not_used_again(fake: ctypes.CDLL, fake_lib: Path) -> None:
    dev = cudadrv.Device(cudadrv.Driver(str(fake_lib)))
    assert fake.fake_cuda_retained() == 1
    dev.close()
    dev.close()
    assert fake.fake_cuda_retained() == 0
    with pytest.raises(cudadrv.CudaError, match="released"):
        dev.allocate(MIB)


# -- the worker process ---------------------------------------------------------------------


class Worker:
    def __init__(self, directory: Path, env: dict[str, str], name: str = "w") -> None:
        self.directory = directory
        self.server = WireServer(directory).start()
        self.log = directory / f"{name}.log"
        self.name = name
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("VRAMTUI_", "FAKE_CUDA_", "CUDA_ALLOC_", "SIM_"))}
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                           os.environ.get("PYTHONPATH")]))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker_sdk", str(MAIN), "--control-socket",
                 self.server.control_path, "--data-socket", self.server.data_path,
                 "--name", name], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, env={**base, **env})

    def link(self):  # type: ignore[no-untyped-def]
        return self.server.wait_worker(self.name, timeout=30)

    def exit_code(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.server.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.close()


def short_dir(name: str) -> Path:
    # AF_UNIX paths are short: a directory under /tmp (the worker's close removes it)
    return Path(tempfile.mkdtemp(prefix=f"vtca-{name}-", dir="/tmp"))


def cuda_env(fake_lib: Path, **extra: str) -> dict[str, str]:
    return {"CUDA_ALLOC_DRIVER": "cuda", "CUDA_ALLOC_LIBCUDA": str(fake_lib),
            "CUDA_ALLOC_LOAD_S": "0", "CUDA_ALLOC_STEPS": "2", "CUDA_ALLOC_STEP_S": "0.01",
            **extra}


def start(workers: list[Worker], tmp_path: Path, env: dict[str, str], name: str = "w"
          ) -> Worker:
    w = Worker(short_dir(name), env, name)
    workers.append(w)
    return w


def test_the_worker_holds_and_returns_real_allocations(fake_lib: Path, tmp_path: Path,
                                                       workers: list[Worker]) -> None:
    trace = tmp_path / "trace"
    w = start(workers, tmp_path, cuda_env(fake_lib, CUDA_ALLOC_WEIGHTS_MIB="300",
                                          CUDA_ALLOC_ACTIVATION_MIB="130",
                                          CUDA_ALLOC_TOUCH="1", FAKE_CUDA_TRACE=str(trace)))
    link = w.link()
    assert link.health()["weights_mib"] == 300
    reply = link.request(b'{"steps": 2}', timeout=30)
    assert reply.kind != "error", reply.error
    body = json.loads(reply.data)
    assert body["driver"] == "cuda" and body["weights_mib"] == 300
    assert body["activation_mib"] == 130 and body["device"] == "Fake CUDA Device 0"
    # while the request ran, the device's free memory was short of weights + activation
    assert body["free_mib"] == 24576 - 300 - 130
    assert link.health()["free_mib"] == 24576 - 300  # the activation went back
    link.shutdown()
    assert w.exit_code() == ExitCode.OK
    lines = trace_lines(trace)
    allocs = [(p, s) for what, p, s in lines if what == "alloc"]
    frees = [(p, s) for what, p, s in lines if what == "free"]
    assert sum(s for _p, s in allocs) == (300 + 130) * MIB
    assert len(allocs) == 5 + 3  # 300 MiB and 130 MiB in 64 MiB chunks
    assert sorted(frees) == sorted(allocs)  # everything given back before exit
    weights = allocs[:5]
    assert frees[-5:] == weights[::-1]  # last taken, first given back


def test_a_request_that_does_not_fit_fails_and_the_worker_goes_on(
        fake_lib: Path, tmp_path: Path, workers: list[Worker]) -> None:
    w = start(workers, tmp_path, cuda_env(fake_lib, CUDA_ALLOC_WEIGHTS_MIB="600",
                                          CUDA_ALLOC_ACTIVATION_MIB="64",
                                          FAKE_CUDA_TOTAL_MIB="1000"))
    link = w.link()
    reply = link.request(b'{"activation_mib": 500}', timeout=30)
    assert reply.kind == "error"
    assert "CUDA_ERROR_OUT_OF_MEMORY" in str(reply.error)
    assert link.health()["free_mib"] == 1000 - 600  # the partial activation was given back
    again = link.request(b'{"activation_mib": 300}', timeout=30)
    assert again.kind != "error", again.error
    assert json.loads(again.data)["activation_mib"] == 300


@pytest.mark.parametrize(("env", "needle"), [
    ({"CUDA_ALLOC_LIBCUDA": "/nonexistent/libcuda.so.1"},
     "CudaUnavailable: cannot load /nonexistent/libcuda.so.1"),
    ({"FAKE_CUDA_INIT_ERROR": "999"}, "CudaError: cuInit: CUDA_ERROR_UNKNOWN (unknown error)"),
    ({"FAKE_CUDA_DEVICES": "0"}, "CudaError: cuInit: CUDA_ERROR_NO_DEVICE"),
    ({"CUDA_ALLOC_WEIGHTS_MIB": "2000", "FAKE_CUDA_TOTAL_MIB": "1000"},
     "CudaError: cuMemAlloc_v2(64 MiB): CUDA_ERROR_OUT_OF_MEMORY (out of memory) after 960 MiB"
     " of 2000 MiB"),
    ({"CUDA_ALLOC_WEIGHTS_MIB": "lots"},
     "ConfigError: CUDA_ALLOC_WEIGHTS_MIB='lots' is not a whole number"),
    ({"SIM_ACTIVATION_MIB": "-5"}, "ConfigError: SIM_ACTIVATION_MIB='-5' is below 0"),
    ({"CUDA_ALLOC_DRIVER": "torch"}, "ConfigError: CUDA_ALLOC_DRIVER='torch': expected auto"),
])
def test_initialize_failures_exit_3_with_one_line(fake_lib: Path, tmp_path: Path,
                                                 workers: list[Worker], env: dict[str, str],
                                                 needle: str) -> None:
    w = start(workers, tmp_path, cuda_env(fake_lib, **env))
    assert w.exit_code() == ExitCode.INIT_FAILED
    lines = [line for line in w.text().splitlines() if "initialize failed:" in line]
    assert len(lines) == 1 and needle in lines[0], w.text()


def test_on_the_simulated_gpu_it_declares_what_it_holds(tmp_path: Path, fake_lib: Path,
                                                        workers: list[Worker]) -> None:
    ledger = tmp_path / "ledger"
    probe = SimulatedProbe("sim:8GiB", ledger)
    env = {"VRAMTUI_SIM_DIR": str(ledger), "CUDA_ALLOC_WEIGHTS_MIB": "700",
           "CUDA_ALLOC_LOAD_S": "0", "CUDA_ALLOC_STEPS": "1", "CUDA_ALLOC_STEP_S": "0",
           "CUDA_ALLOC_LIBCUDA": "/nonexistent/libcuda.so.1"}  # auto: no driver needed here
    w = start(workers, tmp_path, env)
    link = w.link()
    assert link.health()["driver"] == "simulated"
    assert {p.pid: p.used_mib for p in probe.processes()} == {w.proc.pid: 700 + 256}
    link.shutdown()
    assert w.exit_code() == ExitCode.OK
    assert probe.processes() == []
    # ... and forced onto CUDA, it needs the driver even there
    forced = start(workers, tmp_path, {**env, "CUDA_ALLOC_DRIVER": "cuda"}, name="forced")
    assert forced.exit_code() == ExitCode.INIT_FAILED
    assert "CudaUnavailable" in forced.text()


def test_processes_share_one_fake_device(fake_lib: Path, tmp_path: Path,
                                         workers: list[Worker]) -> None:
    # FAKE_CUDA_DIR makes the fake refuse, as a real card does, what the processes together
    # cannot hold: device-check --simulate relies on it to count out-of-memory errors.
    env = cuda_env(fake_lib, CUDA_ALLOC_WEIGHTS_MIB="600", FAKE_CUDA_TOTAL_MIB="1000",
                   FAKE_CUDA_CONTEXT_MIB="100", FAKE_CUDA_DIR=str(tmp_path / "device"))
    first = start(workers, tmp_path, env, name="first")
    first.link()
    second = start(workers, tmp_path, env, name="second")
    assert second.exit_code() == ExitCode.INIT_FAILED
    assert "CUDA_ERROR_OUT_OF_MEMORY (out of memory) after 192 MiB of 600 MiB" in second.text()
    first.close()  # gone: its memory with it
    third = start(workers, tmp_path, env, name="third")
    assert third.link().health()["free_mib"] == 1000 - 600 - 100
