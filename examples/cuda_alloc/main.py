"""A model's memory without a model: real CUDA device memory through the driver API.

The real twin of ``examples/demo/simmodel.py``: it holds ``weights`` MiB from initialize until
exit and ``activation`` MiB more while a request runs, with progress and cancellation, but the
memory is the GPU's own (``cudadrv``: ctypes over ``libcuda.so.1``; no torch, no toolkit).
Each knob is read from ``CUDA_ALLOC_<NAME>``, else from simmodel's ``SIM_<NAME>``, so a demo
descriptor runs on a real card by changing its ``script`` alone:

  WEIGHTS_MIB (1024), ACTIVATION_MIB (512)  memory held (MiB)
  LOAD_S (0.5)         seconds initialize waits after creating the CUDA context, before the
                       weights (a loader reading files): the context alone is visible then
  STEP_S (0.1), STEPS (10)   a request runs STEPS steps of STEP_S seconds
  LEAK_MIB (0)         each request keeps this much more, for good (a leaking model)
  LAZY (0)             1: nothing at initialize; the weights come with the first request

and of its own (``CUDA_ALLOC_`` only):

  CUDA_ALLOC_CHUNK_MIB (64)   allocation granularity: big sizes need no contiguous block
  CUDA_ALLOC_TOUCH (0)        1: write every allocated byte (cuMemsetD8); counts are the same
                              either way, since cuMemAlloc commits device memory at once
  CUDA_ALLOC_DEVICE (0)       the CUDA ordinal (the engine sets CUDA_VISIBLE_DEVICES to its GPU)
  CUDA_ALLOC_LIBCUDA          the driver library (default libcuda.so.1; tests name a fake)
  CUDA_ALLOC_DRIVER (auto)    auto: CUDA, except on vramtui's simulated GPU, where the memory is
                              only declared through worker_sdk.sim (no driver needed); cuda:
                              CUDA always (and still declared on a simulated GPU)

On a simulated GPU every allocation is also declared through ``worker_sdk.sim`` (a no-op on a
real GPU), so the same descriptor is useful in both places.  The CUDA context lives until the
process exits, as with a framework: ``@unload`` frees the memory, not the context.

A request is JSON (``{"steps": 10, "step_s": 0.1, "fail": false, "activation_mib": N}``, every
key optional).  The reply is JSON with what was held.  Without a driver, initialize fails with
one line (``CudaUnavailable: cannot load libcuda.so.1 …``) and the worker exits with code 3.
A failed allocation frees what it took and fails the request (or initialize) with the driver's
error name, e.g. ``CUDA_ERROR_OUT_OF_MEMORY``; the worker goes on serving.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cudadrv import DEFAULT_LIBRARY, MIB, Block, CudaError, Device, Driver

import worker_sdk
from worker_sdk import sim


class ConfigError(ValueError):
    """A knob has a bad value (initialize fails with this one line)."""


@dataclass(frozen=True)
class Config:
    weights_mib: int = 1024
    activation_mib: int = 512
    load_s: float = 0.5
    step_s: float = 0.1
    steps: int = 10
    leak_mib: int = 0
    lazy: bool = False
    chunk_mib: int = 64
    touch: bool = False
    device: int = 0
    library: str = DEFAULT_LIBRARY
    driver: str = "auto"

    @property
    def uses_cuda(self) -> bool:
        return self.driver == "cuda" or not sim.enabled()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        def raw(name: str, shared: bool = True) -> tuple[str, str | None]:
            """(the variable that was read, its value) for knob ``name``."""
            for var in (f"CUDA_ALLOC_{name}", f"SIM_{name}")[: 2 if shared else 1]:
                value = env.get(var)
                if value is not None and value.strip():
                    return var, value.strip()
            return f"CUDA_ALLOC_{name}", None

        def number(name: str, default: float, kind: type, least: float,
                   shared: bool = True) -> Any:
            var, text = raw(name, shared)
            if text is None:
                return default
            try:
                value = kind(text)
            except ValueError:
                what = "a whole number" if kind is int else "a number"
                raise ConfigError(f"{var}={text!r} is not {what}") from None
            if not value >= least:  # (NaN too)
                raise ConfigError(f"{var}={text!r} is below {least:g}")
            return value

        def flag(name: str, shared: bool = True) -> bool:
            var, text = raw(name, shared)
            text = (text or "0").lower()
            if text not in ("0", "1", "true", "false", "yes", "no"):
                raise ConfigError(f"{var}={text!r}: expected 0 or 1")
            return text in ("1", "true", "yes")

        driver = (raw("DRIVER", False)[1] or "auto").lower()
        if driver not in ("auto", "cuda"):
            raise ConfigError(f"CUDA_ALLOC_DRIVER={driver!r}: expected auto or cuda")
        return cls(
            weights_mib=number("WEIGHTS_MIB", cls.weights_mib, int, 0),
            activation_mib=number("ACTIVATION_MIB", cls.activation_mib, int, 0),
            load_s=number("LOAD_S", cls.load_s, float, 0),
            step_s=number("STEP_S", cls.step_s, float, 0),
            steps=number("STEPS", cls.steps, int, 1),
            leak_mib=number("LEAK_MIB", cls.leak_mib, int, 0),
            lazy=flag("LAZY"),
            chunk_mib=number("CHUNK_MIB", cls.chunk_mib, int, 1, shared=False),
            touch=flag("TOUCH", shared=False),
            device=number("DEVICE", cls.device, int, 0, shared=False),
            library=raw("LIBCUDA", False)[1] or DEFAULT_LIBRARY,
            driver=driver,
        )


class Held:
    """Memory held: a CUDA block (None on a simulated GPU) and its declaration to the sim."""

    def __init__(self, mib: int, block: Block | None) -> None:
        self.mib = mib
        self.block = block
        sim.allocate(mib)

    def free(self) -> None:
        try:
            if self.block is not None:
                self.block.free()
        finally:
            sim.free(self.mib)
            self.mib = 0


class Model:
    """The worker's state: the device, the weights, what leaked."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.device: Device | None = None
        self.weights: Held | None = None
        self.leaked: list[Held] = []
        self.lock = threading.Lock()

    def open(self) -> None:
        if self.config.uses_cuda:
            # NVML numbers GPUs in PCI order; make CUDA_VISIBLE_DEVICES mean the same GPU.
            os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            self.device = Device(Driver(self.config.library), self.config.device)
        sim.attach()  # on a simulated GPU: the context's overhead, as with a real one

    def hold(self, mib: int) -> Held:
        block = None
        if self.device is not None and mib > 0:
            block = self.device.allocate(mib * MIB, self.config.chunk_mib * MIB)
            if self.config.touch:
                try:
                    block.touch()
                except CudaError:
                    block.free()
                    raise
        return Held(mib, block)

    def load_weights(self) -> None:
        with self.lock:
            if self.weights is None:
                self.weights = self.hold(self.config.weights_mib)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "driver": "cuda" if self.device is not None else "simulated",
            "weights_mib": self.weights.mib if self.weights is not None else 0,
            "leaked_mib": sum(h.mib for h in self.leaked),
        }
        if self.device is not None:
            free, total = self.device.mem_info()
            out.update(device=self.device.name, driver_version=self.device.driver_version,
                       free_mib=free // MIB, total_mib=total // MIB)
        return out

    def release(self) -> None:
        with self.lock:
            for held in reversed(self.leaked):
                held.free()
            self.leaked.clear()
            if self.weights is not None:
                self.weights.free()
                self.weights = None
        sim.reset()


MODEL: Model | None = None


def model() -> Model:
    if MODEL is None:
        raise RuntimeError("the model was not initialized")
    return MODEL


@worker_sdk.initialize
def load() -> None:
    global MODEL
    MODEL = Model(Config.from_env(os.environ))
    MODEL.open()
    time.sleep(MODEL.config.load_s)  # the context alone, as while a loader reads files
    if not MODEL.config.lazy:
        MODEL.load_weights()


def _request(payload: bytes) -> dict[str, Any]:
    try:
        request = json.loads(payload) if payload else {}
    except ValueError:
        request = {}
    return request if isinstance(request, dict) else {}


@worker_sdk.predict
def generate(payload: bytes, ctx: worker_sdk.RequestContext) -> worker_sdk.Response:
    m = model()
    cfg = m.config
    request = _request(payload)
    steps = max(1, int(request.get("steps", cfg.steps)))
    step_s = max(0.0, float(request.get("step_s", cfg.step_s)))
    activation_mib = max(0, int(request.get("activation_mib", cfg.activation_mib)))
    started = time.monotonic()
    m.load_weights()  # lazy: the first request loads (and keeps) them
    if cfg.leak_mib:
        m.leaked.append(m.hold(cfg.leak_mib))  # never given back
    held = m.hold(activation_mib)
    try:
        for i in range(steps):
            ctx.progress(i / steps, f"step {i + 1}/{steps}")
            if ctx.wait_cancelled(step_s):
                raise worker_sdk.Cancelled(f"cancelled at step {i + 1}")
            if request.get("fail") and i == steps // 2:
                raise RuntimeError("failure asked for half-way")
        ctx.progress(1.0, "done")
        during = m.info()
    finally:
        held.free()
    body = {
        "backend": os.environ.get("VRAMTUI_BACKEND", "?"),
        "pid": os.getpid(),
        "steps": steps,
        "seconds": round(time.monotonic() - started, 3),
        "activation_mib": activation_mib,
        **during,
        "metadata": ctx.metadata,
    }
    return worker_sdk.Response(json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})


@worker_sdk.hardware_health
def health() -> dict[str, Any]:
    return model().info() if MODEL is not None else {"driver": "not initialized"}


@worker_sdk.unload
def unload() -> None:
    if MODEL is not None:
        MODEL.release()
