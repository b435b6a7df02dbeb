"""Every ``vramtui`` subcommand: its name, its help, and where its arguments and handler live.

One row per command, in the order ``vramtui --help`` lists them.  A row names the module
under :mod:`vramtui.cli` that implements the command and two functions there: ``arguments``
(``(parser) -> None``: adds the command's own arguments; ``--json`` and ``--attach`` are added
by :mod:`vramtui.cli.parser` to each command whose row lists them in ``common``, by default
every command) and ``run`` (``(args) -> exit code``).  The
rows are plain strings, so that reading them imports nothing: a command's module is imported
only when that command is parsed or run (``vramtui status`` never imports the code of
``calibrate``), and ``vramtui --help`` lists every command without importing any.

To add a command: write its module (``arguments`` and ``run``, importing what it needs inside
``run`` when that is heavy), and add its row here.  A command module never imports the CLI's
main module (:mod:`vramtui.cli`) nor this registry: the registry points at the commands, not
the other way round (``tests/test_cli_registry.py`` reads their imports to make sure).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

IMPORT_VRAMD_HELP = ("print vramtui's spelling of a vramd descriptor file (version: 2), to "
                     "move it over for good (vramd files also run as they are)")


class Command:
    """One subcommand: ``run`` and ``arguments`` are names of functions in ``module`` (under
    :mod:`vramtui.cli`).

    ``reports_errors``: the engine's errors (and :class:`vramtui.exits.UsageError`) become
    one line on stderr and their exit code, a bug one line and exit 70; the commands around
    the HTTP front door handle their own.  ``common``: which of the options every command
    could have, ``--json`` and ``--attach``, it has (one that asks no engine has no
    ``--attach``; one with no output to read has no ``--json``).

    (A plain class, not a dataclass: building one costs ``vramtui status`` nothing.)
    """

    __slots__ = ("arguments", "common", "help", "module", "name", "reports_errors", "run")

    def __init__(self, name: str, help: str, module: str, run: str,
                 arguments: str | None = None, *, reports_errors: bool = True,
                 common: tuple[str, ...] = ("--json", "--attach")) -> None:
        self.name = name
        self.help = help
        self.module = module
        self.run = run
        self.arguments = arguments
        self.reports_errors = reports_errors
        self.common = common

    def __repr__(self) -> str:
        return f"Command({self.name!r}, module={self.module!r}, run={self.run!r})"

    def _attr(self, name: str) -> Any:
        from importlib import import_module

        return getattr(import_module(f"{__package__}.{self.module}"), name)

    def add_arguments(self, parser: Any) -> None:
        """Add the command's own arguments to its subparser (imports its module)."""
        if self.arguments is not None:
            self._attr(self.arguments)(parser)

    def handler(self) -> Callable[[Any], int]:
        """The function that runs the command (imports its module)."""
        handler: Callable[[Any], int] = self._attr(self.run)
        return handler


_BACKEND_ACTIONS = (
    ("evict", "stop an idle backend's worker to free its memory"),
    ("respawn", "restart a backend's worker (new code, or after failures)"),
    ("preload", "start a backend's worker now, before any job"),
    ("kill", "SIGKILL a stuck backend's worker now (its jobs fail)"),
    ("sleep", "put a backend's idle worker to sleep: its GPU memory given back, its process "
              "kept (needs @worker_sdk.sleep/@wake)"),
    ("wake", "wake a backend's sleeping worker"),
)

REGISTRY: tuple[Command, ...] = (
    Command("submit", "submit a job to BACKEND", "submit", "run", "arguments"),
    Command("status", "the engine, its GPUs and backends at a glance", "status", "run",
            "arguments"),
    Command("queue", "jobs waiting, in the order they will run", "queue", "run", "arguments"),
    Command("gpus", "the devices (GPUs, or the host's memory) and what is on them", "gpus",
            "run", "arguments"),
    Command("jobs", "running, queued and recent jobs (newest first)", "jobs", "run",
            "arguments"),
    Command("result", "the result of a job", "job", "result", "result_arguments"),
    Command("cancel", "cancel queued or running jobs", "job", "cancel", "cancel_arguments"),
    Command("retry", "run a finished job's request again, as a new job", "job", "retry",
            "retry_arguments"),
    Command("priority", "change a queued job's priority (higher runs first)", "job",
            "priority", "priority_arguments"),
    Command("events", "follow the engine's events as they happen (ctrl+c stops)", "events",
            "run", "arguments"),
    Command("backends", "configured backends with their footprints and state", "backends",
            "run"),
    *(Command(name, text, "backends", name, "backend_argument")
      for name, text in _BACKEND_ACTIONS),
    Command("zero", "evict every idle backend", "backends", "zero"),
    Command("drain", "drain a GPU: running work finishes, nothing new is admitted there",
            "drain", "run", "arguments"),
    Command("yield", "hand GPUs over to programs we do not manage: nothing of ours runs "
                     "there until resumed (or --for ends)", "yielding", "yield_",
            "yield_arguments"),
    Command("resume", "take yielded GPUs back: jobs run there again", "yielding", "resume",
            "resume_arguments"),
    Command("reload", "read the backend descriptors again and apply what changed (as "
                      "SIGHUP to --serve does)", "reload", "run"),
    Command("stop", "stop the engine (running jobs finish first; --now: they are "
                    "interrupted) and wait until it is gone", "stop", "run", "arguments"),
    Command("logs", "a backend's worker log", "logs", "run", "arguments"),
    Command("doctor", "check NVML, the runtime directory, the journal and every backend",
            "doctor", "run"),
    Command("calibrate", "measure BACKEND's real VRAM footprint: a run alone on a GPU that "
                         "writes a report and, when it can be trusted, an overlay",
            "calibrate", "calibrate", "calibrate_arguments"),
    Command("recalibrate", "re-run the analysis on a stored calibration report (no GPU, "
                           "no engine) and say what changed",
            "calibrate", "recalibrate", "recalibrate_arguments", common=("--json",)),
    Command("import-vramd", IMPORT_VRAMD_HELP, "import_vramd", "run", "arguments",
            common=("--json",)),
    Command("import-llama-swap", "write vramtui descriptors for the models of a llama-swap "
                                 "config.yaml (which also runs as it is)",
            "import_llama_swap", "run", "arguments", common=("--json",)),
    Command("completion", "print a shell completion script (bash, zsh or fish)",
            "completion", "run", "arguments", reports_errors=False, common=()),
    Command("install-service", "write a systemd user unit that runs `vramtui --serve` "
                               "(KillMode=mixed, Restart=on-failure)",
            "install_service", "run", "arguments", reports_errors=False, common=()),
    Command("web", "the dashboard in a browser, attached to the running engine "
                   "(needs vramtui[http]; --serve --http serves it at /ui too)",
            "web", "run", "arguments", reports_errors=False, common=("--attach",)),
)

COMMANDS: tuple[str, ...] = tuple(c.name for c in REGISTRY)
_BY_NAME = {c.name: c for c in REGISTRY}


def command(name: str) -> Command:
    """The row of command ``name`` (``KeyError`` for an unknown one)."""
    return _BY_NAME[name]
