"""Choosing the GPU source from the ``--gpus`` value: ``auto``, ``nvml``, ``sim:...``, and
``host[:SIZE]`` alone or after any of them (``auto,host``: the GPUs, then the host device)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.gpu.combined import CombinedProbe
from supervisor.gpu.errors import BadGpuSpec, GpuUnavailable
from supervisor.gpu.host import (
    DEFAULT_RESERVE_MIB,
    HOST_FORM,
    HostProbe,
    is_host_spec,
    parse_host_spec,
)
from supervisor.gpu.model import Probe
from supervisor.gpu.nvml import NvmlProbe
from supervisor.gpu.sim import SPEC_FORM, SimulatedProbe, parse_sim_spec
from supervisor.units import mib_exact

FALLBACK_SPEC = "sim:24GiB"


def open_probe(
    gpus: str = "auto", *, ledger_dir: Path, nvml_module: Any | None = None,
    host_reserve_mib: int = DEFAULT_RESERVE_MIB,
) -> tuple[Probe, str | None]:
    """Open the probe ``gpus`` names; returns it with a one-line notice for the user or None.

    - ``auto``: NVML when it initialises and sees at least one device, else a simulated
      24 GiB GPU and a notice saying so;
    - ``nvml``: NVML or ``GpuUnavailable`` with the reason;
    - ``sim:<size>[,sim:<size>...]``: simulated GPUs, their ledger in ``ledger_dir``;
    - ``host[:SIZE]``: the host's memory as a device (``supervisor/gpu/host.py``), alone or
      last, after any of the above (``auto,host``), ``host_reserve_mib`` left to the rest.

    ``nvml_module`` replaces ``pynvml`` (tests). Raises ``BadGpuSpec`` for anything else.
    """
    rest, host_spec = _split(gpus)
    if host_spec is None:
        return _open_gpus(gpus, ledger_dir, nvml_module)
    host = HostProbe(host_spec, reserve_mib=host_reserve_mib)
    if not rest:
        return host, None
    try:
        gpus_probe, notice = _open_gpus(rest, ledger_dir, nvml_module)
    except BaseException:
        host.close()
        raise
    return CombinedProbe([gpus_probe, host]), notice


def check_spec(gpus: str) -> None:
    """``BadGpuSpec`` when ``open_probe`` would refuse ``gpus`` as it is written; opens
    nothing (NVML's absence, or a host size above this machine's memory, are found when the
    engine starts).  ``vramtui install-service`` asks, so as not to write a unit that exits at
    once and restarts every five seconds."""
    rest, host_spec = _split(gpus)
    if host_spec is not None:
        parse_host_spec(host_spec)
    if (host_spec is None or rest) and _kind(rest) == "sim":
        parse_sim_spec(rest.strip())


def _split(gpus: str) -> tuple[str, str | None]:
    """``gpus`` as (its GPUs' part, its host device or None); BadGpuSpec for hosts misplaced."""
    parts = [p.strip() for p in str(gpus).split(",")]
    hosts = [p for p in parts if is_host_spec(p)]
    if not hosts:
        return str(gpus), None
    if len(hosts) > 1 or parts[-1] not in hosts:
        raise BadGpuSpec(f"bad --gpus value {gpus!r}: one host device at most, and last "
                         f"(e.g. 'host', 'auto,host' or 'sim:24GiB,host:8GiB'); {HOST_FORM}")
    return ",".join(parts[:-1]), hosts[0]


def _kind(gpus: str) -> str:
    """``sim``, ``auto`` or ``nvml``: which GPUs a value without a host device names."""
    lowered = str(gpus).strip().lower()
    if lowered.startswith("sim:"):
        return "sim"
    if lowered not in ("auto", "nvml"):
        raise BadGpuSpec(f"bad --gpus value {gpus!r}: expected 'auto', 'nvml' or {SPEC_FORM}; "
                         f"or {HOST_FORM}, alone or after one of them")
    return lowered


def _open_gpus(gpus: str, ledger_dir: Path, nvml_module: Any | None
               ) -> tuple[Probe, str | None]:
    choice = str(gpus).strip()
    lowered = _kind(choice)
    if lowered == "sim":
        return SimulatedProbe(choice, ledger_dir), None
    try:
        probe = NvmlProbe(nvml_module)
    except GpuUnavailable as exc:
        if lowered == "nvml":
            raise
        reason = str(exc).removeprefix("NVML: ")
        return _fallback(ledger_dir, f"NVML: {reason}")
    if probe.device_count >= 1:
        return probe, None
    probe.close()
    if lowered == "nvml":
        raise GpuUnavailable("NVML: the driver reports no NVIDIA GPU")
    return _fallback(ledger_dir, "NVML reports 0 devices")


def _fallback(ledger_dir: Path, why: str) -> tuple[Probe, str]:
    size = mib_exact(parse_sim_spec(FALLBACK_SPEC)[0])
    notice = f"No NVIDIA GPU found ({why}); using a SIMULATED {size} GPU"
    return SimulatedProbe(FALLBACK_SPEC, ledger_dir), notice
