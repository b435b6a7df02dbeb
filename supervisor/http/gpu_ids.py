"""Each GPU's UUID, for the ``UUID`` label that dcgm-exporter puts on its series.

Read once, in a thread (NVML calls block), when the front door starts: NVML's
``nvmlDeviceGetUUID`` for each index the probe reports.  A simulated GPU has no UUID; it gets
``SIM-<index>``, which no real GPU can have, so its series are never joined with real ones;
the host device (``--gpus host``) gets ``HOST-<index>`` the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any


def simulated_uuid(index: int) -> str:
    return f"SIM-{index}"


def device_uuids(sources: Mapping[int, str], nvml_module: Any | None = None
                 ) -> dict[int, str]:
    """``{index: uuid}`` for devices of every source (``nvml``, ``simulated``, ``host``)."""
    out = read_uuids([i for i, s in sources.items() if s not in ("simulated", "host")],
                     simulated=False, nvml_module=nvml_module) \
        if any(s not in ("simulated", "host") for s in sources.values()) else {}
    for i, s in sources.items():
        if s == "simulated":
            out[i] = simulated_uuid(i)
        elif s == "host":
            out[i] = f"HOST-{i}"
    return out


def read_uuids(indices: Iterable[int], *, simulated: bool,
               nvml_module: Any | None = None) -> dict[int, str]:
    """``{index: uuid}`` for the GPUs given; indices NVML cannot answer for are left out."""
    indices = list(indices)
    if simulated:
        return {i: simulated_uuid(i) for i in indices}
    nvml = nvml_module
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-untyped, no-redef]
        except ImportError:
            return {}
    out: dict[int, str] = {}
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: no UUID label values
        return out
    try:
        for i in indices:
            with contextlib.suppress(Exception):
                raw = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
                out[i] = raw.decode() if isinstance(raw, bytes) else str(raw)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
    return out
