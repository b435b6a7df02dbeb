"""The ``vramtui`` command's exit codes, and which errors give which: the one list.

:data:`CODES` is the list (each meaning as its lines in ``vramtui --help``); :class:`Exit`
names the codes for the code that returns them; :data:`EXIT_CODES` is the list as ``--help``
prints it; :func:`exit_code` maps an engine error to its code, for the CLI, ``--serve`` and the
TUI alike.  The README's "Exit codes" table says the same (``tests/test_exits.py`` keeps them
in step).  ``python -m worker_sdk`` has codes of its own (``worker_sdk.worker.ExitCode``):
worker_sdk never imports vramtui.

Importing this module imports nothing else: every command imports it, and ``vramtui status``
must start fast.
"""

from __future__ import annotations


class Exit:
    """The exit codes by name (plain ints: a handler returns one, ``sys.exit`` takes it)."""

    OK = 0
    JOB_FAILED = 1
    FAILED = 1
    USAGE = 2
    NO_ENGINE = 3
    NOT_FOUND = 4
    REFUSED = 5
    NOT_FINISHED = 6
    NOTHING_TO_DO = 7
    INTERNAL = 70
    INTERRUPTED = 130


CODES: tuple[tuple[int, tuple[str, ...]], ...] = (
    (Exit.OK, ("success",)),
    (Exit.FAILED, ("the job failed, was cancelled or timed out; doctor found a problem; the "
                   "engine failed;",
                   "a calibration failed or earned too low a confidence to write an overlay")),
    (Exit.USAGE, ("bad usage or input (unknown flag, bad JSON, unreadable file, request too "
                  "large)",)),
    (Exit.NO_ENGINE, ("no engine is running (start one with `vramtui --serve`, or run "
                      "`vramtui`)",)),
    (Exit.NOT_FOUND, ("unknown backend, job or GPU",)),
    (Exit.REFUSED, ("refused: too large for every GPU, queue full, backend failed or busy, "
                    "access denied,",
                    "or (--serve) another engine already runs in this runtime or state directory")),
    (Exit.NOT_FINISHED, ("the job has not finished yet (result without --wait)",)),
    (Exit.NOTHING_TO_DO, ("nothing to do: the job had already ended (cancel); the backend is "
                          "not loaded (evict,",
                          "sleep, wake), asleep already (sleep) or awake (wake); the GPU is "
                          "not yielded (resume)")),
    (Exit.INTERNAL, ("internal error (a bug; VRAMTUI_DEBUG=1 shows the traceback)",)),
    (Exit.INTERRUPTED, ("interrupted (Ctrl-C; a submitted job goes on, a calibration is "
                        "cancelled);",
                        "Ctrl-C ends a follow (events, logs -f, status --watch) with 0")),
)


def _help_text() -> str:
    lines = ["exit codes:"]
    for code, meaning in CODES:
        lines.append(f"  {code:<3} {meaning[0]}")
        lines.extend(f"      {more}" for more in meaning[1:])
    return "\n".join(lines) + "\n"


EXIT_CODES = _help_text()  # the epilog of ``vramtui --help`` and of every command's help


class UsageError(Exception):
    """Bad input caught before talking to the engine (exit 2, one line)."""


def exit_code(exc: BaseException) -> int:
    """The exit code for an error from the engine or the control socket (1 for any other)."""
    from supervisor import errors as E
    from supervisor.control import errors as CE

    for cls, code in (
        (E.UnknownBackend, Exit.NOT_FOUND),
        (E.UnknownJob, Exit.NOT_FOUND),
        (E.UnknownGpu, Exit.NOT_FOUND),
        (E.EngineRunning, Exit.REFUSED),  # its runtime directory or its journal
        (E.NothingToDo, Exit.NOTHING_TO_DO),  # (a Refused: before it)
        (E.Refused, Exit.REFUSED),
        (E.QueueFull, Exit.REFUSED),
        (E.BackendFailed, Exit.REFUSED),
        (CE.AccessDenied, Exit.REFUSED),
        (CE.TooManyConnections, Exit.REFUSED),
        (E.EngineStopped, Exit.NO_ENGINE),
        (CE.RequestTooLarge, Exit.USAGE),
        (CE.BadRequest, Exit.USAGE),
        (E.InvalidRequest, Exit.USAGE),
        (CE.ProtocolMismatch, Exit.USAGE),
        (E.JobTimeout, Exit.JOB_FAILED),
        (E.NoReport, Exit.NOT_FOUND),
    ):
        if isinstance(exc, cls):
            return code
    return Exit.JOB_FAILED
