"""The NVML probe: real NVIDIA GPUs read through ``nvidia-ml-py`` (import name ``pynvml``).

Rules it keeps:
- every NVML error turns the one field it concerns into ``None`` ("not available"); nothing
  here raises after construction;
- a function the driver or the bindings lack (FUNCTION_NOT_FOUND, NOT_SUPPORTED, a missing
  attribute, pynvml's library-mismatch error) is remembered, logged once, and not called again
  (NOT_SUPPORTED is remembered per device, since GPUs of one machine differ);
- slow fields (name, total memory, driver version) are read once and cached;
- per-process memory comes from the running-process queries, newest version first
  (``_v3``, ``_v2``, then the plain name), compute and graphics merged by pid.

pynvml's process wrappers do the count query and the fill themselves, oversizing the buffer;
if processes appear between the two calls the wrapper raises INSUFFICIENT_SIZE, and calling it
again grows the buffer. That is what we do, a few times.

The module is injected (``NvmlProbe(nvml_module=fake)``) so that tests run without a GPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from supervisor.gpu.errors import GpuUnavailable
from supervisor.gpu.model import GpuReading, ProcessReading

log = logging.getLogger(__name__)

MIB = 1024 * 1024
ULONGLONG_MAX = 2**64 - 1
INSUFFICIENT_SIZE_RETRIES = 3

# Error codes, read from the module when it defines them (these are NVML's own values).
_DEFAULT_CODES = {
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_DEPRECATED": 26,
}

COMPUTE_QUERIES = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
GRAPHICS_QUERIES = (
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses",
)


class _NotAvailable:
    """Sentinel: the call failed this time (distinct from a legitimate ``None`` result)."""

    def __repr__(self) -> str:
        return "<not available>"


NA: Any = _NotAvailable()


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _process_mib(value: Any) -> int | None:
    """usedGpuMemory in bytes -> MiB; None / NVML_VALUE_NOT_AVAILABLE (ULONGLONG_MAX) -> None."""
    if value is None or not isinstance(value, int) or value < 0 or value >= ULONGLONG_MAX:
        return None
    return value // MIB


def _more(a: int | None, b: int | None) -> bool:
    """a is a better (known and larger) figure than b."""
    return a is not None and (b is None or a > b)


class NvmlProbe:
    """Reads NVIDIA GPUs through NVML. Thread-safe (one lock around each read).

    Raises ``GpuUnavailable`` from the constructor when pynvml is not importable or
    ``nvmlInit`` / ``nvmlDeviceGetCount`` fail. After that, nothing raises.
    """

    source = "nvml"
    simulated = False

    def __init__(self, nvml_module: ModuleType | Any | None = None) -> None:
        if nvml_module is None:
            try:
                import pynvml as nvml_module
            except ImportError as exc:
                raise GpuUnavailable(f"NVML: nvidia-ml-py is not installed ({exc})") from exc
        self._nvml = nvml_module
        self._codes = {k: getattr(nvml_module, k, v) for k, v in _DEFAULT_CODES.items()}
        self._lock = threading.Lock()
        self._closed = False
        # (function name, device index or None for "everywhere")
        self._missing: set[tuple[str, int | None]] = set()
        self._logged: set[tuple[str, str]] = set()
        try:
            nvml_module.nvmlInit()
        except Exception as exc:
            raise GpuUnavailable(f"NVML: {self._describe(exc)}") from exc
        try:
            self._count = int(nvml_module.nvmlDeviceGetCount())
        except Exception as exc:
            self._shutdown()
            raise GpuUnavailable(f"NVML: cannot count devices: {self._describe(exc)}") from exc
        self._handles: list[Any] = [NA] * self._count
        self._names: list[str | None] = [None] * self._count
        self._totals: list[int | None] = [None] * self._count
        self._last_procs: dict[tuple[str, int], list[ProcessReading]] = {}
        self._driver_version: str | None = None
        with self._lock:
            for i in range(self._count):
                self._handle(i)
                self._slow_fields(i)
            self._read_driver_version()

    # -- public ---------------------------------------------------------------------------

    @property
    def device_count(self) -> int:
        return self._count

    @property
    def driver_version(self) -> str | None:
        with self._lock:
            if self._driver_version is None and not self._closed:
                self._read_driver_version()
            return self._driver_version

    def devices(self) -> list[GpuReading]:
        with self._lock:
            if self._closed:
                return []
            return [self._device(i) for i in range(self._count)]

    def processes(self) -> list[ProcessReading]:
        with self._lock:
            if self._closed:
                return []
            out: list[ProcessReading] = []
            for i in range(self._count):
                handle = self._handle(i)
                if handle is NA:
                    continue
                merged: dict[int, ProcessReading] = {}
                for kind, chain in (("compute", COMPUTE_QUERIES), ("graphics", GRAPHICS_QUERIES)):
                    for p in self._process_list(kind, chain, i, handle):
                        old = merged.get(p.pid)
                        if old is None or _more(p.used_mib, old.used_mib):
                            merged[p.pid] = p
                out.extend(merged.values())
            return out

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._shutdown()

    def __enter__(self) -> NvmlProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------

    def _device(self, i: int) -> GpuReading:
        handle = self._handle(i)
        if handle is NA:
            return GpuReading(i, None, self._totals[i] or 0, None, None, None, None, None)
        self._slow_fields(i)
        used = free = None
        mem = self._call("nvmlDeviceGetMemoryInfo", handle, device=i)
        if mem is not NA:
            used, free = int(mem.used) // MIB, int(mem.free) // MIB
            if self._totals[i] is None:
                self._totals[i] = int(mem.total) // MIB
        util = self._call("nvmlDeviceGetUtilizationRates", handle, device=i)
        temp = self._call(
            "nvmlDeviceGetTemperature",
            handle,
            getattr(self._nvml, "NVML_TEMPERATURE_GPU", 0),
            device=i,
        )
        power = self._call("nvmlDeviceGetPowerUsage", handle, device=i)  # milliwatts
        return GpuReading(
            index=i,
            name=self._names[i],
            total_mib=self._totals[i] or 0,
            used_mib=used,
            free_mib=free,
            util_pct=None if util is NA else int(util.gpu),
            temp_c=None if temp is NA else int(temp),
            power_w=None if power is NA else power / 1000.0,
        )

    def _handle(self, i: int) -> Any:
        if self._handles[i] is NA:
            self._handles[i] = self._call("nvmlDeviceGetHandleByIndex", i, device=i)
        return self._handles[i]

    def _slow_fields(self, i: int) -> None:
        handle = self._handles[i]
        if handle is NA:
            return
        if self._names[i] is None:
            name = self._call("nvmlDeviceGetName", handle, device=i)
            if name is not NA:
                self._names[i] = _text(name)
        if self._totals[i] is None:
            mem = self._call("nvmlDeviceGetMemoryInfo", handle, device=i)
            if mem is not NA:
                self._totals[i] = int(mem.total) // MIB

    def _read_driver_version(self) -> None:
        version = self._call("nvmlSystemGetDriverVersion")
        if version is not NA:
            self._driver_version = _text(version)

    def _process_list(
        self, kind: str, chain: Sequence[str], i: int, handle: Any
    ) -> list[ProcessReading]:
        """The first function of ``chain`` that exists answers; a transient error keeps the
        last good list for this device (an error must not look like "the process left")."""
        for fname in chain:
            if self._is_missing(fname, i):
                continue
            raw = self._call(fname, handle, device=i, retries=INSUFFICIENT_SIZE_RETRIES)
            if raw is NA:
                if self._is_missing(fname, i):
                    continue  # just learned it is missing: try the older version
                return self._last_procs.get((kind, i), [])
            procs = [
                ProcessReading(int(p.pid), i, _process_mib(getattr(p, "usedGpuMemory", None)))
                for p in raw
            ]
            self._last_procs[(kind, i)] = procs
            return procs
        return []

    # -- the one place NVML is called -------------------------------------------------------

    def _is_missing(self, fname: str, device: int | None) -> bool:
        return (fname, None) in self._missing or (fname, device) in self._missing

    def _call(self, fname: str, *args: Any, device: int | None = None, retries: int = 0) -> Any:
        """``nvml.<fname>(*args)``, or ``NA`` on any failure (remembering missing functions)."""
        if self._is_missing(fname, device):
            return NA
        fn: Callable[..., Any] | None = getattr(self._nvml, fname, None)
        if fn is None:
            self._mark_missing(fname, None, "not in this pynvml")
            return NA
        for attempt in range(retries + 1):
            try:
                return fn(*args)
            except Exception as exc:
                code = getattr(exc, "value", None) if self._is_nvml_error(exc) else None
                if code in (
                    self._codes["NVML_ERROR_FUNCTION_NOT_FOUND"],
                    self._codes["NVML_ERROR_DEPRECATED"],
                ):
                    self._mark_missing(fname, None, self._describe(exc))
                elif code == self._codes["NVML_ERROR_NOT_SUPPORTED"]:
                    self._mark_missing(fname, device, self._describe(exc))
                elif type(exc).__name__ == "NVMLLibraryMismatchError":
                    # pynvml's unversioned wrapper when the versioned symbol is absent
                    self._mark_missing(fname, None, "library version mismatch")
                elif code == self._codes["NVML_ERROR_INSUFFICIENT_SIZE"] and attempt < retries:
                    continue  # the wrapper re-counts and allocates a bigger buffer
                elif code is not None:
                    log.debug("NVML %s (device %s): %s", fname, device, self._describe(exc))
                else:
                    self._log_once(fname, f"unexpected error: {exc!r}", warn=True)
                return NA
        return NA  # pragma: no cover - loop always returns

    def _is_nvml_error(self, exc: BaseException) -> bool:
        cls = getattr(self._nvml, "NVMLError", None)
        return isinstance(cls, type) and isinstance(exc, cls)

    def _mark_missing(self, fname: str, device: int | None, why: str) -> None:
        self._missing.add((fname, device))
        where = "" if device is None else f" on GPU {device}"
        self._log_once(fname, f"unavailable{where} ({why}); not calling it again")

    def _log_once(self, fname: str, message: str, *, warn: bool = False) -> None:
        if (fname, message) in self._logged:
            return
        self._logged.add((fname, message))
        log.log(logging.WARNING if warn else logging.INFO, "NVML %s: %s", fname, message)

    def _describe(self, exc: BaseException) -> str:
        text = str(exc)
        if not text:
            code = getattr(exc, "value", None)
            text = type(exc).__name__ + ("" if code is None else f" (code {code})")
        return text

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:  # a failed shutdown must not break the caller's exit path
            log.debug("nvmlShutdown: %s", self._describe(exc))
