"""The CUDA driver API through ctypes: the few calls that hold and release device memory.

No torch, no CUDA toolkit: ``libcuda.so.1`` is installed with the NVIDIA driver itself.  The
signatures, from the CUDA driver API reference (``CUdevice`` is an int, ``CUcontext`` an
opaque pointer, ``CUdeviceptr`` an unsigned 64-bit integer, ``CUresult`` an int)::

    CUresult cuInit(unsigned int Flags)
    CUresult cuDriverGetVersion(int *driverVersion)
    CUresult cuDeviceGetCount(int *count)
    CUresult cuDeviceGet(CUdevice *device, int ordinal)
    CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
    CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
    CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
    CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
    CUresult cuCtxSetCurrent(CUcontext ctx)
    CUresult cuCtxSynchronize(void)
    CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
    CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
    CUresult cuMemFree_v2(CUdeviceptr dptr)
    CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
    CUresult cuGetErrorName(CUresult error, const char **pStr)
    CUresult cuGetErrorString(CUresult error, const char **pStr)

(the ``_v2`` names are what ``cuda.h`` maps the plain names to since CUDA 3.2 / 11.0).

What it keeps: the **primary context** of one device (the one the CUDA runtime and PyTorch
share), retained once and made current on whichever thread allocates (a context is current
per thread, and worker_sdk runs requests on another thread than ``@initialize``).  Memory is
taken in chunks (64 MiB by default), so a large size needs no single contiguous block, and
released in the reverse order.  ``cuMemAlloc`` commits device memory when it returns: NVML
counts it at once, touched or not (``Block.touch`` writes it anyway, to prove it usable).
The context itself costs memory too (hundreds of MiB on recent GPUs), from the moment it is
created until the process exits or releases it.

Every failure raises ``CudaError`` with one line naming the call, the error's name and the
driver's text (``cuMemAlloc_v2(64 MiB): CUDA_ERROR_OUT_OF_MEMORY (out of memory)``);
``CudaUnavailable`` when there is no driver at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

MIB = 1024 * 1024
DEFAULT_LIBRARY = "libcuda.so.1"

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NO_DEVICE = 100

CUresult = ctypes.c_int
CUdevice = ctypes.c_int
CUcontext = ctypes.c_void_p
CUdeviceptr = ctypes.c_ulonglong

# name -> (argument types); every function returns CUresult.  Alternatives are tried in order.
_FUNCTIONS: dict[str, tuple[Sequence[str], list[object]]] = {
    "init": (("cuInit",), [ctypes.c_uint]),
    "driver_version": (("cuDriverGetVersion",), [ctypes.POINTER(ctypes.c_int)]),
    "device_count": (("cuDeviceGetCount",), [ctypes.POINTER(ctypes.c_int)]),
    "device_get": (("cuDeviceGet",), [ctypes.POINTER(CUdevice), ctypes.c_int]),
    "device_name": (("cuDeviceGetName",), [ctypes.c_char_p, ctypes.c_int, CUdevice]),
    "device_total": (("cuDeviceTotalMem_v2",), [ctypes.POINTER(ctypes.c_size_t), CUdevice]),
    "ctx_retain": (("cuDevicePrimaryCtxRetain",), [ctypes.POINTER(CUcontext), CUdevice]),
    "ctx_release": (("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), [CUdevice]),
    "ctx_set_current": (("cuCtxSetCurrent",), [CUcontext]),
    "ctx_synchronize": (("cuCtxSynchronize",), []),
    "mem_info": (("cuMemGetInfo_v2",),
                 [ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
    "mem_alloc": (("cuMemAlloc_v2",), [ctypes.POINTER(CUdeviceptr), ctypes.c_size_t]),
    "mem_free": (("cuMemFree_v2",), [CUdeviceptr]),
    "memset_d8": (("cuMemsetD8_v2",), [CUdeviceptr, ctypes.c_ubyte, ctypes.c_size_t]),
    "error_name": (("cuGetErrorName",), [CUresult, ctypes.POINTER(ctypes.c_char_p)]),
    "error_string": (("cuGetErrorString",), [CUresult, ctypes.POINTER(ctypes.c_char_p)]),
}


class CudaError(RuntimeError):
    """A driver call failed: ``code`` (CUresult), ``name`` (``CUDA_ERROR_…``), ``call``."""

    def __init__(self, message: str, *, code: int | None = None, name: str = "",
                 call: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.name = name
        self.call = call

    @property
    def out_of_memory(self) -> bool:
        return self.code == CUDA_ERROR_OUT_OF_MEMORY


class CudaUnavailable(CudaError):
    """No usable driver: the library is missing or lacks a function we need."""


def mib_text(nbytes: int) -> str:
    """Bytes as MiB for messages: 67108864 -> '64 MiB', 1 -> '0.000954 MiB'."""
    return f"{nbytes / MIB:g} MiB"


class Driver:
    """``libcuda`` loaded, its functions bound; ``check`` turns a CUresult into ``CudaError``."""

    def __init__(self, library: str = DEFAULT_LIBRARY) -> None:
        self.library = library
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise CudaUnavailable(
                f"cannot load {library}, the CUDA library the NVIDIA driver installs ({exc}): "
                "no NVIDIA driver here; on a machine without a GPU run this backend on a "
                "simulated GPU (vramtui --gpus sim:24GiB)") from None
        self._fns: dict[str, object] = {}
        for key, (names, argtypes) in _FUNCTIONS.items():
            fn = next((getattr(self._lib, n) for n in names if hasattr(self._lib, n)), None)
            if fn is None:
                raise CudaUnavailable(
                    f"{library} has no {names[0]}: the NVIDIA driver is too old for this "
                    "worker (it needs CUDA 11 or later)")
            fn.argtypes = argtypes
            fn.restype = CUresult
            self._fns[key] = fn

    def call(self, key: str, *args: object) -> int:
        """The raw CUresult of one function (see ``_FUNCTIONS`` for the keys)."""
        return int(self._fns[key](*args))  # type: ignore[operator]

    def describe(self, code: int) -> tuple[str, str]:
        """(``CUDA_ERROR_…`` name, the driver's text) for a CUresult, whatever it is."""
        texts = []
        for key in ("error_name", "error_string"):
            out = ctypes.c_char_p()
            ok = self.call(key, code, ctypes.byref(out)) == CUDA_SUCCESS and out.value
            texts.append(out.value.decode(errors="replace") if ok and out.value else "")
        name = texts[0] or f"CUresult {code}"
        return name, texts[1] or "no description from the driver"

    def check(self, code: int, call: str) -> None:
        """Raise ``CudaError`` unless ``code`` is CUDA_SUCCESS."""
        if code == CUDA_SUCCESS:
            return
        name, text = self.describe(code)
        raise CudaError(f"{call}: {name} ({text})", code=code, name=name, call=call)


@dataclass
class Block:
    """Device memory taken in chunks; ``free`` gives it back in the reverse order."""

    device: Device
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (pointer, bytes)

    @property
    def nbytes(self) -> int:
        return sum(size for _ptr, size in self.chunks)

    @property
    def mib(self) -> int:
        return self.nbytes // MIB

    def touch(self, value: int = 0) -> None:
        """Write every byte (cuMemsetD8, then wait for it): the memory is really usable."""
        dev = self.device
        dev.make_current()
        for ptr, size in self.chunks:
            dev.driver.check(dev.driver.call("memset_d8", CUdeviceptr(ptr), value, size),
                             f"cuMemsetD8_v2({mib_text(size)})")
        dev.driver.check(dev.driver.call("ctx_synchronize"), "cuCtxSynchronize")

    def free(self) -> None:
        """Release every chunk, last first; raises the first failure after trying them all."""
        if not self.chunks:
            return
        dev = self.device
        dev.make_current()
        first: CudaError | None = None
        while self.chunks:
            ptr, size = self.chunks.pop()
            code = dev.driver.call("mem_free", CUdeviceptr(ptr))
            if code != CUDA_SUCCESS and first is None:
                name, text = dev.driver.describe(code)
                first = CudaError(f"cuMemFree_v2({mib_text(size)}): {name} ({text})",
                                  code=code, name=name, call="cuMemFree_v2")
        if first is not None:
            raise first


class Device:
    """One device's primary context, retained at construction until ``close``."""

    def __init__(self, driver: Driver, ordinal: int = 0) -> None:
        self.driver = driver
        self.ordinal = ordinal
        check = driver.check
        check(driver.call("init", 0), "cuInit")
        count = ctypes.c_int()
        check(driver.call("device_count", ctypes.byref(count)), "cuDeviceGetCount")
        if count.value < 1:
            raise CudaError("cuDeviceGetCount: no CUDA device is visible "
                            "(check CUDA_VISIBLE_DEVICES)", code=CUDA_ERROR_NO_DEVICE,
                            name="CUDA_ERROR_NO_DEVICE", call="cuDeviceGetCount")
        handle = CUdevice()
        check(driver.call("device_get", ctypes.byref(handle), ordinal),
              f"cuDeviceGet({ordinal}) of {count.value} visible device(s)")
        self.handle = handle.value
        name = ctypes.create_string_buffer(256)
        check(driver.call("device_name", name, len(name), self.handle), "cuDeviceGetName")
        self.name = name.value.decode(errors="replace")
        total = ctypes.c_size_t()
        check(driver.call("device_total", ctypes.byref(total), self.handle),
              "cuDeviceTotalMem_v2")
        self.total_bytes = total.value
        version = ctypes.c_int()
        check(driver.call("driver_version", ctypes.byref(version)), "cuDriverGetVersion")
        self.driver_version = f"{version.value // 1000}.{version.value % 1000 // 10}"
        ctx = CUcontext()
        check(driver.call("ctx_retain", ctypes.byref(ctx), self.handle),
              "cuDevicePrimaryCtxRetain")
        self.context = ctx.value
        self._retained = True
        self._current = threading.local()
        self.make_current()

    def make_current(self) -> None:
        """Make the context current on the calling thread (once per thread)."""
        if not self._retained:
            raise CudaError("the device's context was released", call="cuCtxSetCurrent")
        if getattr(self._current, "set", False):
            return
        self.driver.check(self.driver.call("ctx_set_current", CUcontext(self.context)),
                          "cuCtxSetCurrent")
        self._current.set = True

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, as the driver sees them."""
        self.make_current()
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.driver.check(self.driver.call("mem_info", ctypes.byref(free), ctypes.byref(total)),
                          "cuMemGetInfo_v2")
        return free.value, total.value

    def allocate(self, nbytes: int, chunk_bytes: int = 64 * MIB) -> Block:
        """``nbytes`` in chunks of at most ``chunk_bytes``; all or nothing.

        On a failure the chunks already taken are released (last first) and ``CudaError``
        says which chunk failed and how much had been taken.
        """
        if nbytes < 0 or chunk_bytes <= 0:
            raise ValueError(f"bad sizes: {nbytes} bytes in chunks of {chunk_bytes}")
        self.make_current()
        block = Block(self)
        left = nbytes
        while left > 0:
            size = min(chunk_bytes, left)
            ptr = CUdeviceptr()
            code = self.driver.call("mem_alloc", ctypes.byref(ptr), size)
            if code != CUDA_SUCCESS:
                name, text = self.driver.describe(code)
                taken = block.nbytes
                with contextlib.suppress(CudaError):  # the allocation's error is the one
                    block.free()
                raise CudaError(
                    f"cuMemAlloc_v2({mib_text(size)}): {name} ({text}) after "
                    f"{mib_text(taken)} of {mib_text(nbytes)} in {mib_text(chunk_bytes)} "
                    f"chunks", code=code, name=name, call="cuMemAlloc_v2")
            block.chunks.append((ptr.value, size))
            left -= size
        return block

    def close(self) -> None:
        """Release the primary context (the process leaves the GPU once nothing else holds it)."""
        if self._retained:
            self._retained = False
            self.driver.check(self.driver.call("ctx_release", self.handle),
                              "cuDevicePrimaryCtxRelease")
