"""The engine's exceptions: each message says what went wrong and what to do about it."""

from __future__ import annotations

from collections.abc import Iterable


def brief(value: object, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut short when long (messages stay one readable line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class VramtuiError(Exception):
    """Base of every error the engine raises on purpose."""


class EngineRunning(VramtuiError):
    """Another engine already owns this runtime directory (and so its GPUs), or this state
    directory (its journal: :class:`supervisor.journal.JournalInUse`, ``socket`` None)."""

    pid: int | None = None
    socket: str | None = None


class UnknownBackend(VramtuiError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        names = sorted(known)
        listing = ", ".join(names) if names else "none are configured"
        super().__init__(f"unknown backend {brief(name)}; known backends: {listing}")
        self.name = name


class UnknownJob(VramtuiError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"unknown job {brief(job_id)} (finished jobs are kept for a while "
                         "only)")
        self.job_id = job_id


class UnknownGpu(VramtuiError):
    """A GPU index this engine does not have."""


class Refused(VramtuiError):
    """A job that can never run here (too large for every GPU, …)."""


class NothingToDo(Refused):
    """There is nothing to do what was asked of: a backend that is not loaded has nothing to
    put to sleep or wake, a GPU not yielded nothing to resume.  Nothing was done.  A refusal
    (``except Refused`` still takes it), told apart so that the CLI exits 7 and HTTP says
    ``nothing_to_do`` (:func:`vramtui.exits.exit_code`,
    :func:`supervisor.http.errors.from_engine`)."""


class QueueFull(VramtuiError):
    """The queue is at its maximum depth."""


class BackendFailed(VramtuiError):
    """The backend failed to initialise repeatedly and waits for a respawn."""


class CannotStart(VramtuiError):
    """A worker cannot be started as its descriptor says (e.g. no port can be picked for a
    server's ``${PORT}``): the job it was for fails with this reason."""


class EngineStopped(VramtuiError):
    """The engine is not running (stopped, or never started)."""


class JobTimeout(VramtuiError):
    """``wait`` ran out of time before the job ended (the job itself goes on)."""


class InvalidRequest(VramtuiError):
    """A request the engine cannot take as given (e.g. metadata that cannot be serialised).

    ``param``: the argument refused, by its wire name, when one is (HTTP says it too)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class NoReport(VramtuiError):
    """A backend has no calibration report (or not the one asked for)."""


class EngineBug(RuntimeError):
    """The engine broke one of its own rules (an illegal state transition): a bug to report,
    never a user's mistake; deliberately not a :class:`VramtuiError`."""
