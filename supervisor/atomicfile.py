"""Writing a file so that it is either the old one or the whole new one, never half.

A temporary file in the same directory, written and fsynced, then ``os.replace``; an error
or an interruption leaves the old file as it was and no temporary behind. ``write_all_atomic``
does so for a set of files: all of them, or none.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


def _stage(path: Path, data: bytes | str, mode: int | None) -> str:
    """``data`` written and fsynced to a temporary beside ``path`` (``mode`` None: the old
    file's mode, else 0644); its name. Raises ``OSError`` and leaves no temporary."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    return temp


def write_atomic(path: Path, data: bytes | str, *, mode: int | None = None,
                 sync_dir: bool = False) -> Path:
    """Replace ``path`` with ``data``; ``mode`` None keeps the old file's mode (else 0644)."""
    temp = _stage(path, data, mode)
    try:
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    if sync_dir:  # make the rename itself durable
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    return path


def write_all_atomic(files: Mapping[Path, bytes | str]) -> None:
    """Write each of ``files`` whole, or none of them: every one is written and fsynced to a
    temporary beside it first (an old file's mode kept, else 0644), and only then is each
    moved into place. Raises ``OSError`` (nothing replaced, no temporary left) when one
    cannot be written or one of the paths is a folder."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            if path.is_dir():
                raise IsADirectoryError(errno.EISDIR, "a folder is in the way", str(path))
            staged.append((_stage(path, data, None), path))
    except BaseException:
        for temp, _path in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        raise
    for temp, path in staged:  # (a rename in one folder: it does not fail for want of room)
        os.replace(temp, path)
