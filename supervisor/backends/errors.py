"""Descriptor errors: one line each, with the file, the line, the backend and the field.

``DescriptorError`` is what callers see (kept in ``LoadResult.errors``, never a traceback);
``DescriptorWarning`` is its kind for what loads but is not honoured (``LoadResult.warnings``).
``FieldError`` is raised inside validation, before the loader knows where the field came from.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path


def display_path(path: Path | str) -> str:
    """A short form for messages: relative to the working directory, else ``~/…``, else as is."""
    text = os.fspath(path)
    try:
        rel = os.path.relpath(text)
        if not rel.startswith(os.pardir):
            return rel
    except (ValueError, OSError):  # OSError: the working directory is gone
        pass
    home = os.path.expanduser("~")
    if home not in ("", "/") and text.startswith(home + os.sep):
        return "~" + text[len(home) :]
    return text


class DescriptorError(Exception):
    """A problem in a backend descriptor.

    ``str()`` is one line, e.g.
    ``backends.d/foo.yaml:12: backend 'sdxl': field 'vram.peak': '12 GB x' is not a size (…)``.
    """

    def __init__(
        self,
        file: Path | None,
        line: int | None,
        field: str | None,
        backend: str | None,
        message: str,
    ) -> None:
        super().__init__(file, line, field, backend, message)
        self.file = file
        self.line = line
        self.field = field
        self.backend = backend
        self.message = message

    def __str__(self) -> str:
        parts: list[str] = []
        if self.file is not None:
            where = display_path(self.file)
            if self.line is not None:
                where += f":{self.line}"
            parts.append(where)
        if self.backend is not None:
            parts.append(f"backend {self.backend!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        parts.append(self.message)
        return ": ".join(parts)

    def __repr__(self) -> str:
        return (
            f"DescriptorError(file={self.file!r}, line={self.line!r}, field={self.field!r}, "
            f"backend={self.backend!r}, message={self.message!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DescriptorError):
            return NotImplemented
        return self.args == other.args

    def __hash__(self) -> int:
        return hash(self.args)


class DescriptorWarning(DescriptorError):
    """Something in a descriptor that loads but is not (fully) honoured, e.g. a vramd key
    vramtui has no use for. One line like an error; kept in ``LoadResult.warnings``."""


class FieldError(ValueError):
    """A bad value for one field (a dotted path such as ``vram.peak``) of one backend."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.field = field
        self.message = message

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def unknown_key_message(
    key: object, known: Iterable[str], hints: dict[str, str] | None = None
) -> str:
    """``unknown key 'vram_peak' (did you mean 'vram'?)``."""
    text = str(key)
    suggestion = (hints or {}).get(text)
    if suggestion is None:
        close = difflib.get_close_matches(text, sorted(known), n=1, cutoff=0.6)
        suggestion = f"did you mean {close[0]!r}?" if close else None
    if suggestion is None:
        return f"unknown key {text!r} (known keys: {', '.join(sorted(known))})"
    return f"unknown key {text!r} ({suggestion})"
