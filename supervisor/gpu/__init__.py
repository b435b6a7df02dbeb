"""GPU probes: NVML and the simulated device behind one ``Probe`` interface, and the sampler.

- ``model``: ``GpuReading``, ``ProcessReading``, the ``Probe`` protocol;
- ``nvml``: ``NvmlProbe`` (real NVIDIA GPUs through nvidia-ml-py);
- ``sim``: ``SimulatedProbe`` (sizes from a spec, memory from ``worker_sdk.sim`` ledgers);
- ``select``: ``open_probe`` (``--gpus auto|nvml|sim:...``);
- ``sampler``: ``Sampler`` thread, ``Sample``, ``History``;
- ``errors``: ``GpuUnavailable``, ``BadGpuSpec``.
"""

from __future__ import annotations

from supervisor.gpu.errors import BadGpuSpec, GpuUnavailable
from supervisor.gpu.model import GpuReading, Probe, ProcessReading
from supervisor.gpu.nvml import NvmlProbe
from supervisor.gpu.sampler import History, Sample, Sampler
from supervisor.gpu.select import open_probe
from supervisor.gpu.sim import SimulatedProbe, parse_sim_spec

__all__ = [
    "BadGpuSpec",
    "GpuReading",
    "GpuUnavailable",
    "History",
    "NvmlProbe",
    "Probe",
    "ProcessReading",
    "Sample",
    "Sampler",
    "SimulatedProbe",
    "open_probe",
    "parse_sim_spec",
]
