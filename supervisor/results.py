"""Immutable answers of the API methods besides jobs and snapshots (log tails and the like).

Plain frozen dataclasses, so the control socket's codec carries them as it carries snapshots
(fields by name, rebuilt from their type hints on the client side).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Part of a worker's log: the last lines, or what followed an offset."""

    path: str
    data: bytes
    offset: int  # pass it back to read what comes next
    missing: bool = False  # there is no log yet


@dataclass(frozen=True, slots=True)
class DescriptorLayer:
    """One file's entry for a backend: where it is and what it says (YAML text)."""

    file: str
    line: int | None
    text: str


@dataclass(frozen=True, slots=True)
class DescriptorInfo:
    """A backend's descriptor: each layer that names it (lowest first), what the engine runs
    with now (``effective``, YAML text, after calibration overlays), and its problems."""

    backend: str
    layers: tuple[DescriptorLayer, ...]
    effective: str
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReportFile:
    """A calibration report as the engine wrote it (the JSON document's bytes)."""

    backend: str
    name: str  # the file's name in the calibration directory
    path: str
    data: bytes
    count: int  # how many reports this backend has
    names: tuple[str, ...] = ()  # all of them, newest first


@dataclass(frozen=True, slots=True)
class BackendChange:
    """What a reload changed in one backend (``notes``: what the engine did about it)."""

    backend: str
    changes: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """The outcome of reading the descriptors again: what changed and what could not load.

    A backend whose file has errors keeps its previous descriptor (``kept``); the others
    apply at once.
    """

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[BackendChange, ...]
    kept: tuple[str, ...]  # one line each: the backend and why it was kept as it was
    errors: tuple[str, ...]  # file:line: problem
    files: tuple[str, ...]  # the files read, lowest layer first

    @property
    def unchanged(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def summary(self) -> str:
        """``1 added (x), 2 changed (a, b), 1 error(s)`` or ``nothing changed``."""
        parts = []
        for what, names in (("added", self.added), ("changed", [c.backend for c in
                                                                self.changed]),
                            ("removed", self.removed)):
            if names:
                parts.append(f"{len(names)} {what} ({', '.join(names)})")
        if self.kept:
            parts.append(f"{len(self.kept)} kept as they were")
        if self.errors:
            parts.append(f"{len(self.errors)} error(s)")
        return ", ".join(parts) if parts else "nothing changed"


def reload_summary(result: ReloadResult) -> str:
    """:meth:`ReloadResult.summary` (the faces' name for it)."""
    return result.summary()


@dataclass(frozen=True, slots=True)
class JobRequest:
    """The request a job was submitted with (its first ``limit`` bytes), while it is kept."""

    job_id: str
    size: int  # bytes in all
    data: bytes  # at most the limit asked for
    kept: bool = True  # False: no longer kept (data is empty)


@dataclass(frozen=True, slots=True)
class CancelResult:
    """One job of a ``cancel_many``: its state after the request, or why it was not found."""

    job_id: str
    state: str | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class YieldInfo:
    """A GPU handed over to programs the engine does not manage (``vramtui yield``): nothing
    of ours runs there until it is resumed, or ``until`` (epoch seconds; None: until asked)."""

    gpu: int
    by: str  # who asked: a user, or the ``yield_when`` rule that matched
    since: float  # epoch seconds
    until: float | None = None
    now: bool = False  # its running jobs were cancelled rather than left to finish
    rule: bool = False  # a ``yield_when`` rule asked (it resumes when the rule stops matching)

    @property
    def text(self) -> str:
        """``GPU0 is yielded (ada (cli), until 14:05:09)`` (or ``until resumed``); a rule's:
        ``GPU0 is yielded (rule: while steam runs, or until resumed)``."""
        from .units import wall_time_text

        if self.rule:
            return f"GPU{self.gpu} is yielded (rule: {self.by}, or until resumed)"
        until = "until resumed" if self.until is None else f"until {wall_time_text(self.until)}"
        return f"GPU{self.gpu} is yielded ({self.by}, {until})"
