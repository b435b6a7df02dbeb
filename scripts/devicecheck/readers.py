"""Reading one GPU's memory independently of the engine: NVML itself, or the simulated GPU.

``NvmlReader`` calls ``pynvml`` directly (not the engine's ``NvmlProbe``), so a bug in the
probe cannot hide from the check; ``SimReader`` reads the simulated GPU's ledger directory as
a second reader beside the engine's.  Both answer ``device()`` -> (used, total) MiB and
``processes()`` -> {pid: MiB or None}.  One reader per thread.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Protocol

MIB = 1024 * 1024
_NOT_AVAILABLE = 2**64 - 1


class Reader(Protocol):
    source: str

    def device(self) -> tuple[int | None, int]: ...

    def processes(self) -> dict[int, int | None]: ...

    def close(self) -> None: ...


class NvmlReader:
    source = "nvml"

    def __init__(self, index: int, nvml_module: Any = None) -> None:
        if nvml_module is None:
            import pynvml as nvml_module
        self._nvml: Any = nvml_module
        nvml_module.nvmlInit()
        self._handle = nvml_module.nvmlDeviceGetHandleByIndex(index)
        self.name = _text(nvml_module.nvmlDeviceGetName(self._handle))
        self.total_mib = int(nvml_module.nvmlDeviceGetMemoryInfo(self._handle).total) // MIB

    def device(self) -> tuple[int | None, int]:
        try:
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except self._nvml.NVMLError:
            return None, self.total_mib
        return int(mem.used) // MIB, int(mem.total) // MIB

    def processes(self) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for query in ("nvmlDeviceGetComputeRunningProcesses",
                      "nvmlDeviceGetGraphicsRunningProcesses"):
            try:
                procs = getattr(self._nvml, query)(self._handle)
            except self._nvml.NVMLError:
                continue
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                mib = None if used is None or used >= _NOT_AVAILABLE else int(used) // MIB
                if out.get(int(p.pid)) is None or (mib or 0) > (out[int(p.pid)] or 0):
                    out[int(p.pid)] = mib
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing must not fail the check
            self._nvml.nvmlShutdown()


class SimReader:
    source = "simulated"

    def __init__(self, spec: str, ledger_dir: Path, index: int) -> None:
        from supervisor.gpu.sim import SimulatedProbe

        self._probe = SimulatedProbe(spec, ledger_dir)
        self._index = index
        self.name = f"simulated GPU {index}"
        self.total_mib = self._probe.sizes_mib[index]

    def device(self) -> tuple[int | None, int]:
        reading = next(d for d in self._probe.devices() if d.index == self._index)
        return reading.used_mib, reading.total_mib

    def processes(self) -> dict[int, int | None]:
        return {p.pid: p.used_mib for p in self._probe.processes() if p.gpu_index == self._index}

    def close(self) -> None:
        self._probe.close()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def open_reader(config: dict[str, Any]) -> NvmlReader | SimReader:
    """The reader for a stage's config (``simulated``, ``gpu``, ``sim_spec``, ``sim_dir``)."""
    if config["simulated"]:
        return SimReader(config["sim_spec"], Path(config["sim_dir"]), config["gpu"])
    return NvmlReader(config["gpu"])
