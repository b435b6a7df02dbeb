"""Build ``fakecuda.c`` (a stand-in libcuda) into a shared object, where a C compiler exists.

    path = build(Path("/tmp/x"))   # the .so, or None when there is no compiler
    run_worker(env={"CUDA_ALLOC_LIBCUDA": str(path), "CUDA_ALLOC_DRIVER": "cuda", ...})

Used by the tests of the ctypes layer and by ``scripts/device-check --simulate``; the fake's
environment variables are listed at the top of ``fakecuda.c``.  Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fakecuda.c"
LIBRARY_NAME = "libcuda-fake.so"


class BuildError(Exception):
    """The compiler exists but failed (the message holds the end of its output)."""


def compiler() -> str | None:
    """The C compiler to use ($CC, else cc or gcc on the PATH), or None."""
    for candidate in (os.environ.get("CC"), "cc", "gcc"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def build(directory: Path, *, timeout: float = 60.0) -> Path | None:
    """Compile the fake into ``directory``; None when no compiler is installed."""
    cc = compiler()
    if cc is None:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LIBRARY_NAME
    tmp = directory / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
    try:
        done = subprocess.run(
            [cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(tmp), str(SOURCE), "-lpthread"],
            capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{cc} could not build {SOURCE.name}: {exc}") from exc
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise BuildError(f"{cc} failed on {SOURCE.name} (exit {done.returncode}): {tail}")
    os.replace(tmp, target)  # atomic: a parallel build never leaves half a library
    return target
