"""Helpers shared by the test worker scripts (importable: a worker's folder is on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path


def marker_dir() -> Path:
    """Where the test wants this worker's marker files (set by tests/conftest.py)."""
    return Path(os.environ.get("WORKER_MARKER_DIR", "."))


def mark(name: str, line: str) -> None:
    """Append ``line`` to marker file ``name`` (flushed and closed, so the test can read it)."""
    with open(marker_dir() / name, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def wait_gate(path: str) -> None:
    """Block until the test releases the FIFO gate at ``path`` (see tests/conftest.py Gate)."""
    with open(path, "rb", buffering=0) as fifo:
        fifo.read(1)
