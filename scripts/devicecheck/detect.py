"""Is there an NVIDIA GPU here?  NVML read through ctypes, in a child process with a time limit.

Standard library only (it runs before any venv exists).  A hung or crashing driver cannot
hang or kill the check: the child is killed after ``timeout`` seconds.  The answer:

- ``Detected(gpus=[...], driver=...)``: NVML initialised and counted at least one GPU;
- ``Absent(reason)``: no NVIDIA driver (libnvidia-ml.so.1 missing, or the kernel driver not
  loaded) or no GPU — the check is skipped;
- ``Broken(reason)``: there is a driver but NVML fails otherwise — the check fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field

NVML_LIBRARY = "libnvidia-ml.so.1"

# Run as `python -c`: prints one JSON object.  NVML's error codes: 9 DRIVER_NOT_LOADED,
# 12 LIB_RM_VERSION_MISMATCH (a driver update without a reboot: broken, not absent).
_CHILD = r"""
import ctypes, json, sys
lib_name = sys.argv[1]
def out(**kw):
    print(json.dumps(kw)); sys.exit(0)
try:
    nvml = ctypes.CDLL(lib_name)
except OSError as exc:
    out(kind="absent", reason=f"{lib_name} not found ({exc})")
def text(fn, *args):
    buf = ctypes.create_string_buffer(96)
    return buf.value.decode(errors="replace") if fn(*args, buf, 96) == 0 else None
def err(code):
    try:
        nvml.nvmlErrorString.restype = ctypes.c_char_p
        return nvml.nvmlErrorString(code).decode(errors="replace")
    except Exception:
        return f"error {code}"
code = nvml.nvmlInit_v2()
if code == 9:
    out(kind="absent", reason="the NVIDIA kernel driver is not loaded (NVML: " + err(code) + ")")
if code != 0:
    out(kind="broken", reason=f"nvmlInit failed: {err(code)} (code {code})")
count = ctypes.c_uint()
code = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
if code != 0:
    out(kind="broken", reason=f"nvmlDeviceGetCount failed: {err(code)} (code {code})")
class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]
gpus = []
for i in range(count.value):
    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
        gpus.append({"index": i, "name": None, "total_mib": None, "used_mib": None}); continue
    mem = Memory()
    ok = nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)) == 0
    name = ctypes.create_string_buffer(96)
    named = nvml.nvmlDeviceGetName(handle, name, 96) == 0
    gpus.append({"index": i, "name": name.value.decode(errors="replace") if named else None,
                 "total_mib": mem.total // 2**20 if ok else None,
                 "used_mib": mem.used // 2**20 if ok else None})
driver = text(nvml.nvmlSystemGetDriverVersion)
nvml.nvmlShutdown()
if not gpus:
    out(kind="absent", reason="the NVIDIA driver reports no GPU")
out(kind="detected", gpus=gpus, driver=driver)
"""


@dataclass(frozen=True)
class Detected:
    gpus: list[dict[str, object]] = field(default_factory=list)
    driver: str | None = None


@dataclass(frozen=True)
class Absent:
    reason: str


@dataclass(frozen=True)
class Broken:
    reason: str


def detect(*, timeout: float = 30.0, library: str = NVML_LIBRARY,
           python: str = sys.executable) -> Detected | Absent | Broken:
    try:
        done = subprocess.run([python, "-c", _CHILD, library], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return Broken(f"NVML did not answer within {timeout:g} s (a hung driver?)")
    except OSError as exc:
        return Broken(f"cannot run {python} to ask NVML: {exc}")
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " | ".join((done.stderr or "").strip().splitlines()[-3:])
        return Broken(f"the NVML probe died (exit {done.returncode}): {tail or 'no output'}")
    kind = answer.get("kind")
    if kind == "detected":
        return Detected(list(answer.get("gpus") or []), answer.get("driver"))
    if kind == "absent":
        return Absent(str(answer.get("reason")))
    return Broken(str(answer.get("reason")))
