"""NvmlProbe against a fake pynvml module (function level), and open_probe's NVML paths."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.gpu.errors import BadGpuSpec, GpuUnavailable
from supervisor.gpu.model import Probe
from supervisor.gpu.nvml import COMPUTE_QUERIES, GRAPHICS_QUERIES, NvmlProbe
from supervisor.gpu.select import open_probe
from supervisor.gpu.sim import SimulatedProbe

MIB = 1024 * 1024
V3 = "nvmlDeviceGetComputeRunningProcesses_v3"
V2 = "nvmlDeviceGetComputeRunningProcesses_v2"
V1 = "nvmlDeviceGetComputeRunningProcesses"

# NVML's own error codes (pynvml defines the same constants)
SUCCESS = 0
UNINITIALIZED = 1
NOT_SUPPORTED = 3
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
UNKNOWN = 999


class FakeNVMLError(Exception):
    _names = {NOT_SUPPORTED: "Not Supported", INSUFFICIENT_SIZE: "Insufficient Size",
              DRIVER_NOT_LOADED: "Driver Not Loaded", FUNCTION_NOT_FOUND: "Function Not Found",
              GPU_IS_LOST: "GPU is lost", UNKNOWN: "Unknown Error"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._names.get(self.value, f"NVML Error with code {self.value}")


class FakeLibraryMismatch(Exception):
    pass


FakeLibraryMismatch.__name__ = "NVMLLibraryMismatchError"


@dataclass
class FakeDevice:
    name: str | bytes = "NVIDIA H100 80GB HBM3"
    total_mib: int = 81559
    used_mib: int = 1000
    util: int = 37
    temp: int = 45
    power_mw: int = 123456
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    """pynvml at the function level: counts calls, raises injected NVML errors, and can hide
    functions (AttributeError) like an older pynvml would."""

    NVMLError = FakeNVMLError
    NVMLLibraryMismatchError = FakeLibraryMismatch
    NVML_SUCCESS = SUCCESS
    NVML_ERROR_UNINITIALIZED = UNINITIALIZED
    NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED
    NVML_ERROR_INSUFFICIENT_SIZE = INSUFFICIENT_SIZE
    NVML_ERROR_DRIVER_NOT_LOADED = DRIVER_NOT_LOADED
    NVML_ERROR_FUNCTION_NOT_FOUND = FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = GPU_IS_LOST
    NVML_ERROR_UNKNOWN = UNKNOWN
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[FakeDevice], driver: str | bytes = b"550.54.15") -> None:
        self.devs = devices
        self.driver = driver
        self.calls: Counter[str] = Counter()
        self.device_calls: Counter[tuple[str, int]] = Counter()
        self.failures: dict[tuple[str, int | None], list[int | None]] = {}
        self.absent: set[str] = set()
        # run once between the count query and the fill of a process query
        self.between: dict[str, list[Callable[[], None]]] = {}

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("nvml") and name in object.__getattribute__(self, "absent"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    def fail(self, fname: str, code: int, times: int | None = None, device: int | None = None):
        """Raise NVMLError(code) from ``fname`` the next ``times`` calls (None: always)."""
        self.failures[(fname, device)] = [code] * times if times else [None, code]

    def _enter(self, fname: str, device: int | None = None) -> None:
        self.calls[fname] += 1
        if device is not None:
            self.device_calls[(fname, device)] += 1
        for key in ((fname, device), (fname, None)):
            queue = self.failures.get(key)
            if queue:
                if queue[0] is None:  # "always"
                    raise FakeNVMLError(queue[1])  # type: ignore[arg-type]
                code = queue.pop(0)
                raise FakeNVMLError(code)  # type: ignore[arg-type]

    # --- the API -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.devs)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        return index

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetName(self, h: int) -> str | bytes:
        self._enter("nvmlDeviceGetName", h)
        return self.devs[h].name

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        d = self.devs[h]
        return SimpleNamespace(
            total=d.total_mib * MIB, used=d.used_mib * MIB, free=(d.total_mib - d.used_mib) * MIB
        )

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=self.devs[h].util, memory=5)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self.devs[h].temp

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return self.devs[h].power_mw

    def _running(self, fname: str, h: int, kind: str) -> list[SimpleNamespace]:
        """Like pynvml's _v3/_v2 wrappers: count query, then a fill into a buffer of
        count * 2 + 5 entries; INSUFFICIENT_SIZE surfaces if more appeared in between."""
        self._enter(fname, h)
        procs = getattr(self.devs[h], kind)
        count = len(procs)
        if count == 0:
            return []
        hooks = self.between.get(fname)
        if hooks:
            hooks.pop(0)()
        if len(procs) > count * 2 + 5:
            raise FakeNVMLError(INSUFFICIENT_SIZE)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        return self._running(V3, h, "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: int) -> list[SimpleNamespace]:
        return self._running(V2, h, "compute")

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        # pynvml 12+: the plain name is the v3 wrapper under throwOnVersionMismatch
        self.calls[V1] += 1
        try:
            return self._running(V3, h, "compute")
        except FakeNVMLError as exc:
            if exc.value == FUNCTION_NOT_FOUND:
                raise FakeLibraryMismatch("Unversioned function called ...") from exc
            raise

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, h: int) -> list[SimpleNamespace]:
        return self._running(GRAPHICS_QUERIES[0], h, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, h: int) -> list[SimpleNamespace]:
        return self._running(GRAPHICS_QUERIES[1], h, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return self._running(GRAPHICS_QUERIES[2], h, "graphics")


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeDevice(compute=[(100, 2000 * MIB), (101, 512 * MIB)]),
            FakeDevice(name=b"NVIDIA L4", total_mib=23034, used_mib=0, power_mw=16000),
        ]
    )


def by_pid(probe: NvmlProbe) -> dict[int, tuple[int, int | None]]:
    return {p.pid: (p.gpu_index, p.used_mib) for p in probe.processes()}


# --- devices -------------------------------------------------------------------------------


def test_reads_every_field() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    assert isinstance(probe, Probe)
    assert (probe.source, probe.simulated, probe.driver_version) == ("nvml", False, "550.54.15")
    d0, d1 = probe.devices()
    assert (d0.index, d0.name, d0.total_mib, d0.used_mib, d0.free_mib) == (
        0, "NVIDIA H100 80GB HBM3", 81559, 1000, 80559,
    )
    assert (d0.util_pct, d0.temp_c, d0.power_w) == (37, 45, pytest.approx(123.456))
    assert (d1.index, d1.name, d1.total_mib, d1.free_mib, d1.power_w) == (
        1, "NVIDIA L4", 23034, 23034, 16.0,
    )


def test_slow_fields_are_cached() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    for _ in range(3):
        probe.devices()
        assert probe.driver_version == "550.54.15"
    assert fake.calls["nvmlDeviceGetName"] == 2
    assert fake.calls["nvmlSystemGetDriverVersion"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 2 + 3 * 2  # totals once, then each read


def test_temperature_error_is_none_and_memory_still_read() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    fake.fail("nvmlDeviceGetTemperature", GPU_IS_LOST, times=2)
    d0, d1 = probe.devices()
    assert d0.temp_c is None and d1.temp_c is None
    assert (d0.used_mib, d0.free_mib, d0.util_pct) == (1000, 80559, 37)
    # a transient error is not remembered: the next read has the field again
    assert probe.devices()[0].temp_c == 45


def test_not_supported_is_remembered_per_device(caplog: pytest.LogCaptureFixture) -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    fake.fail("nvmlDeviceGetPowerUsage", NOT_SUPPORTED, device=0)
    with caplog.at_level(logging.INFO, logger="supervisor.gpu.nvml"):
        for _ in range(3):
            d0, d1 = probe.devices()
            assert d0.power_w is None and d1.power_w == 16.0
    assert fake.device_calls[("nvmlDeviceGetPowerUsage", 0)] == 1
    assert fake.device_calls[("nvmlDeviceGetPowerUsage", 1)] == 3
    assert sum("nvmlDeviceGetPowerUsage" in r.getMessage() for r in caplog.records) == 1


def test_function_absent_from_bindings(caplog: pytest.LogCaptureFixture) -> None:
    fake = two_gpus()
    fake.absent.add("nvmlDeviceGetUtilizationRates")
    with caplog.at_level(logging.INFO, logger="supervisor.gpu.nvml"):
        probe = NvmlProbe(fake)
        for _ in range(3):
            assert [d.util_pct for d in probe.devices()] == [None, None]
    assert [d.used_mib for d in probe.devices()] == [1000, 0]
    assert sum("nvmlDeviceGetUtilizationRates" in r.getMessage() for r in caplog.records) == 1


def test_unexpected_exception_is_not_a_crash() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    fake.nvmlDeviceGetTemperature = lambda h, s: 1 / 0  # type: ignore[method-assign]
    assert [d.temp_c for d in probe.devices()] == [None, None]


def test_handle_failure_is_retried_later() -> None:
    fake = two_gpus()
    fake.fail("nvmlDeviceGetHandleByIndex", UNKNOWN, times=1, device=1)
    probe = NvmlProbe(fake)
    d1 = probe.devices()[1]
    assert (d1.name, d1.total_mib, d1.used_mib) == ("NVIDIA L4", 23034, 0)


# --- processes -----------------------------------------------------------------------------


def test_processes_from_v3() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    assert by_pid(probe) == {100: (0, 2000), 101: (0, 512)}
    assert fake.calls[V2] == 0 and fake.calls[V1] == 0


def test_v3_missing_falls_back_to_v2_and_is_not_called_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = two_gpus()
    fake.devs[1].compute = [(200, 100 * MIB)]
    fake.fail(V3, FUNCTION_NOT_FOUND)  # what pynvml raises when the symbol is absent
    probe = NvmlProbe(fake)
    with caplog.at_level(logging.INFO, logger="supervisor.gpu.nvml"):
        for _ in range(3):
            assert by_pid(probe) == {100: (0, 2000), 101: (0, 512), 200: (1, 100)}
    assert fake.calls[V3] == 1
    assert fake.calls[V2] == 3 * 2
    assert fake.calls[V1] == 0
    assert sum(V3 in r.getMessage() for r in caplog.records) == 1


def test_v3_not_supported_on_one_device_only() -> None:
    fake = two_gpus()
    fake.devs[1].compute = [(200, 100 * MIB)]
    fake.fail(V3, NOT_SUPPORTED, device=1)
    probe = NvmlProbe(fake)
    for _ in range(2):
        assert by_pid(probe) == {100: (0, 2000), 101: (0, 512), 200: (1, 100)}
    assert fake.device_calls[(V3, 0)] == 2 and fake.device_calls[(V3, 1)] == 1
    assert fake.device_calls[(V2, 0)] == 0 and fake.device_calls[(V2, 1)] == 2


def test_old_bindings_use_the_plain_name() -> None:
    fake = two_gpus()
    fake.absent.update({V3, V2})
    probe = NvmlProbe(fake)
    assert by_pid(probe) == {100: (0, 2000), 101: (0, 512)}
    assert fake.calls[V1] == 2


def test_no_process_query_at_all_is_not_a_crash() -> None:
    fake = two_gpus()
    fake.fail(V3, FUNCTION_NOT_FOUND)
    fake.fail(V2, FUNCTION_NOT_FOUND)  # the plain name then raises NVMLLibraryMismatchError
    probe = NvmlProbe(fake)
    assert probe.processes() == [] and probe.processes() == []
    # v3 twice: once directly, once inside pynvml's plain-name wrapper; then never again
    assert (fake.calls[V3], fake.calls[V2], fake.calls[V1]) == (2, 1, 1)
    assert probe.devices()[0].used_mib == 1000


def test_insufficient_size_retries_with_a_bigger_buffer() -> None:
    fake = two_gpus()
    dev = fake.devs[0]
    # 8 processes start between the count query and the fill: 2 + 8 > 2 * 2 + 5
    fake.between[V3] = [lambda: dev.compute.extend((300 + i, MIB) for i in range(8))]
    probe = NvmlProbe(fake)
    procs = by_pid(probe)
    assert len(procs) == 10 and procs[307] == (0, 1)
    assert fake.device_calls[(V3, 0)] == 2
    assert fake.calls[V2] == 0  # not a reason to fall back


def test_transient_error_keeps_the_last_process_list() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    assert set(by_pid(probe)) == {100, 101}
    fake.fail(V3, GPU_IS_LOST, times=1, device=0)
    assert set(by_pid(probe)) == {100, 101}  # an error must not look like "they left"
    assert fake.calls[V2] == 0
    fake.devs[0].compute = []
    assert by_pid(probe) == {}


def test_memory_not_available_is_none() -> None:
    fake = two_gpus()
    # older pynvml passes ULONGLONG_MAX through; newer turns it into None itself
    fake.devs[0].compute = [(100, 2**64 - 1), (101, None), (102, 0)]
    probe = NvmlProbe(fake)
    assert by_pid(probe) == {100: (0, None), 101: (0, None), 102: (0, 0)}


def test_graphics_processes_are_merged_by_pid() -> None:
    fake = two_gpus()
    fake.devs[0].graphics = [(100, 2000 * MIB), (400, 64 * MIB)]
    fake.devs[1].graphics = [(100, None)]
    probe = NvmlProbe(fake)
    procs = probe.processes()
    assert sorted((p.pid, p.gpu_index, p.used_mib) for p in procs) == [
        (100, 0, 2000), (100, 1, None), (101, 0, 512), (400, 0, 64),
    ]


# --- lifecycle and selection ---------------------------------------------------------------


def test_init_failure_is_gpu_unavailable() -> None:
    fake = two_gpus()
    fake.fail("nvmlInit", DRIVER_NOT_LOADED)
    with pytest.raises(GpuUnavailable, match="Driver Not Loaded"):
        NvmlProbe(fake)


def test_close_is_idempotent() -> None:
    fake = two_gpus()
    probe = NvmlProbe(fake)
    probe.close()
    probe.close()
    assert fake.calls["nvmlShutdown"] == 1
    assert probe.devices() == [] and probe.processes() == []


def test_the_real_bindings_have_what_we_call() -> None:
    pynvml = pytest.importorskip("pynvml")
    names = [
        "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
        "nvmlSystemGetDriverVersion", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage",
        *COMPUTE_QUERIES, *GRAPHICS_QUERIES,
    ]
    assert [n for n in names if not callable(getattr(pynvml, n, None))] == []
    for name in dir(FakeNvml):
        if name.startswith("NVML_"):
            assert getattr(pynvml, name) == getattr(FakeNvml, name), name
    assert pynvml.NVMLLibraryMismatchError.__name__ == "NVMLLibraryMismatchError"


def test_real_nvml_without_a_gpu_is_gpu_unavailable() -> None:
    try:
        probe = NvmlProbe()
    except GpuUnavailable as exc:
        assert str(exc).startswith("NVML: ")
    else:  # a machine with a driver: it must read without raising
        try:
            assert len(probe.devices()) == probe.device_count
            probe.processes()
        finally:
            probe.close()


def test_auto_falls_back_to_a_simulated_gpu(tmp_path: Path) -> None:
    fake = two_gpus()
    fake.fail("nvmlInit", DRIVER_NOT_LOADED)
    probe, notice = open_probe("auto", ledger_dir=tmp_path, nvml_module=fake)
    assert isinstance(probe, SimulatedProbe) and probe.simulated
    assert notice == (
        "No NVIDIA GPU found (NVML: Driver Not Loaded); using a SIMULATED 24 GiB GPU"
    )
    assert [d.total_mib for d in probe.devices()] == [24576]


def test_auto_with_zero_devices_falls_back(tmp_path: Path) -> None:
    fake = FakeNvml([])
    probe, notice = open_probe("auto", ledger_dir=tmp_path, nvml_module=fake)
    assert probe.simulated and notice and "0 devices" in notice
    assert fake.calls["nvmlShutdown"] == 1
    with pytest.raises(GpuUnavailable, match="no NVIDIA GPU"):
        open_probe("nvml", ledger_dir=tmp_path, nvml_module=FakeNvml([]))


def test_auto_and_nvml_use_nvml_when_present(tmp_path: Path) -> None:
    for choice in ("auto", " NVML "):
        probe, notice = open_probe(choice, ledger_dir=tmp_path, nvml_module=two_gpus())
        assert isinstance(probe, NvmlProbe) and notice is None


def test_forced_nvml_raises(tmp_path: Path) -> None:
    fake = two_gpus()
    fake.fail("nvmlInit", DRIVER_NOT_LOADED)
    with pytest.raises(GpuUnavailable, match="^NVML: Driver Not Loaded"):
        open_probe("nvml", ledger_dir=tmp_path, nvml_module=fake)


@pytest.mark.parametrize("bad", ["", "cuda", "sim", "nvml:0", "auto,sim:8GiB"])
def test_bad_gpus_value(tmp_path: Path, bad: str) -> None:
    with pytest.raises(BadGpuSpec, match="expected 'auto', 'nvml' or sim:") as info:
        open_probe(bad, ledger_dir=tmp_path)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
