"""The ``vramtui`` command: the TUI (default), ``--serve``, and the client subcommands.

Only argument parsing lives here; each mode is imported lazily so that ``vramtui status``
never imports Textual and starts fast.  Handlers return an exit code (see ``EXIT_CODES``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .exits import EXIT_CODES, Exit

EXAMPLES = """\
examples:
  vramtui                                 the control centre (starts an engine if none runs)
  vramtui --serve                         the engine, headless
  vramtui submit echo --data '{"a": 1}' --wait
  vramtui status
  vramtui calibrate sdxl --repeats 3 --out sdxl.yaml --report sdxl-report.json
                                          measure sdxl's real VRAM footprint, alone on a GPU
  vramtui recalibrate sdxl-report.json --write-overlay
                                          re-analyse a stored report (no GPU, no engine)
"""


IMPORT_VRAMD_HELP = ("print vramtui's spelling of a vramd descriptor file (version: 2), to "
                     "move it over for good (vramd files also run as they are)")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, minus its ``import shutil`` (and with it zlib, bz2 and lzma: a
    few ms of every command's start, paid only to learn the terminal's width)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            env = os.environ.get("COLUMNS", "")
            try:
                columns = int(env) if env.isdigit() else os.get_terminal_size(1).columns
            except OSError:
                columns = 80
            width = max(11, columns - 2)
        super().__init__(prog, indent_increment, max_help_position, width)


def _queue_limit(text: str) -> int:
    """``--max-queue N``: a whole number of jobs, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of jobs") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _engine_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", default="auto", metavar="SPEC",
                        help="'auto' (NVML, else a simulated 24 GiB GPU), 'nvml', or "
                             "'sim:24GiB[,sim:8GiB…]' (default: auto)")
    parser.add_argument("--backends", action="append", default=[], metavar="PATH",
                        help="a backend descriptor file or directory (repeatable)")


COMMANDS = ("submit", "status", "queue", "jobs", "result", "cancel", "retry", "priority",
            "events", "backends", "evict", "respawn", "preload", "kill", "zero", "drain",
            "reload", "logs", "doctor", "calibrate", "recalibrate", "import-vramd",
            *("completion", "install-service", "web"))
# Commands of the HTTP front door's side (vramtui/extra_commands.py runs them).
EXTRA_COMMANDS = frozenset({"completion", "install-service", "web"})
_VALUE_OPTIONS = frozenset({"--gpus", "--backends", "--attach", "--log-file", "--allow-group",
                            "--dynamo", "--http", "--http-token-file", "--max-queue",
                            "--theme"})


class _Skipped:
    """Stands in for the parser of a command that is not on the command line."""

    def add_argument(self, *args: object, **kwargs: object) -> None:
        return None

    def add_mutually_exclusive_group(self, *args: object, **kwargs: object) -> _Skipped:
        return self


def command_named(argv: Sequence[str]) -> str | None:
    """The subcommand on a command line (None: none, or help asked for the whole command)."""
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in ("-h", "--help"):
            return None
        elif token in _VALUE_OPTIONS:
            skip = True
        elif not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, just that subcommand's (a command starts faster)."""
    parser = argparse.ArgumentParser(
        prog="vramtui",
        description="Let many generative models share GPUs that cannot hold them all: "
                    "admission by real peak VRAM, a priority queue, eviction, one process "
                    "per model.",
        epilog=EXAMPLES + "\n" + EXIT_CODES,
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"vramtui {__version__}")
    _engine_options(parser)
    parser.add_argument("--attach", metavar="SOCKET",
                        help="the control socket of a running engine (default: the runtime "
                             "directory's)")
    parser.add_argument("--serve", action="store_true",
                        help="run the engine headless on this terminal (logs to stderr)")
    parser.add_argument("--log-file", metavar="FILE", help="with --serve: also log to FILE")
    parser.add_argument("--allow-group", metavar="GROUP",
                        help="with --serve: let members of GROUP use the control socket (it "
                             "becomes 0660 and the runtime directory 0710, both of group "
                             "GROUP; every directory above must be searchable by GROUP)")
    parser.add_argument("--dynamo", metavar="NAMESPACE",
                        help="with --serve: also serve each backend as the NVIDIA Dynamo "
                             "endpoint NAMESPACE.BACKEND.generate (needs vramtui[dynamo])")
    parser.add_argument("--max-queue", metavar="N", type=_queue_limit,
                        help="with --serve: refuse new jobs (queue full) while N wait "
                             "(default: $VRAMTUI_MAX_QUEUE, else config.yaml's engine: "
                             "max_queue, else 512)")
    parser.add_argument("--http", metavar="ADDR",
                        help="with --serve: also serve the HTTP API on ADDR (127.0.0.1:8080, "
                             "[::1]:8080, or unix:/PATH; anything but loopback needs a token); "
                             "config.yaml's http: section does the same (needs vramtui[http])")
    parser.add_argument("--http-token-file", metavar="FILE",
                        help="with --http: the bearer token, in a file only you can read "
                             "(or set VRAMTUI_HTTP_TOKEN)")
    parser.add_argument("--readonly", action="store_true",
                        help="TUI: show everything, change nothing")
    parser.add_argument("--no-confirm", action="store_true",
                        help="TUI: do not ask before evict/cancel/zero/kill/drain")
    parser.add_argument("--theme", metavar="NAME",
                        help="TUI: the colour theme (e.g. textual-dark, nord, gruvbox, "
                             "textual-light; ctrl+p lists them all; default: $VRAMTUI_THEME, "
                             "else textual-dark).  NO_COLOR=1 turns colour off")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help_text: str) -> Any:
        if only is not None and name != only:
            return _Skipped()
        p = sub.add_parser(name, help=help_text, description=help_text,
                           epilog=EXIT_CODES, formatter_class=_Formatter)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--attach", metavar="SOCKET", default=argparse.SUPPRESS,
                       help="the control socket of the engine (default: the runtime "
                            "directory's)")
        return p

    p = command("submit", "submit a job to BACKEND")
    p.add_argument("backend")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--data", metavar="JSON", help="the request, as JSON text")
    source.add_argument("--data-file", metavar="FILE", help="the request, read from FILE")
    source.add_argument("-", dest="stdin", action="store_true", help="read the request from stdin")
    p.add_argument("--priority", type=int, help="higher runs first (default: the backend's)")
    p.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds")
    p.add_argument("--wait", action="store_true", help="wait for the result, with progress")
    p.add_argument("--stream", action="store_true", help="print streamed chunks as they come")
    p.add_argument("--metadata", metavar="JSON", help="metadata passed to the worker (JSON)")

    def watch(p: Any) -> None:
        p.add_argument("--watch", "-w", action="store_true",
                       help="keep showing it, refreshed every -n seconds (ctrl+c stops)")
        p.add_argument("-n", "--interval", type=float, metavar="SECONDS", default=None,
                       help="with --watch: seconds between refreshes (default 2; alone, "
                            "implies --watch)")

    p = command("status", "the engine, its GPUs and backends at a glance")
    watch(p)
    p.add_argument("--history", action="store_true",
                   help="with --json: also the GPUs' memory history, the recent jobs and "
                        "the event log (left out by default: they are large)")
    p = command("queue", "jobs waiting, in the order they will run")
    watch(p)
    p = command("jobs", "running, queued and recent jobs (newest first)")
    p.add_argument("--state", action="append", metavar="STATE",
                   choices=("queued", "starting", "running", "succeeded", "failed",
                            "cancelled", "timed_out"),
                   help="only jobs in this state (repeatable)")
    p.add_argument("--backend", action="append", metavar="B", help="only this backend's "
                   "jobs (repeatable)")
    p.add_argument("--limit", type=int, metavar="N", help="at most N jobs")
    watch(p)
    p = command("result", "the result of a job")
    p.add_argument("job")
    p.add_argument("--wait", action="store_true", help="wait for it to finish")
    p.add_argument("--output", "-o", metavar="FILE", help="write the result data to FILE")
    p = command("cancel", "cancel queued or running jobs")
    p.add_argument("jobs", nargs="+", metavar="JOB")
    p = command("retry", "run a finished job's request again, as a new job")
    p.add_argument("job")
    p.add_argument("--wait", action="store_true", help="wait for the new job's result")
    p = command("priority", "change a queued job's priority (higher runs first)")
    p.add_argument("job")
    p.add_argument("priority", type=int)
    p = command("events", "follow the engine's events as they happen (ctrl+c stops)")
    p.add_argument("--kind", action="append", metavar="KIND",
                   choices=("log", "job", "worker", "chunk", "sample"),
                   help="only these kinds (repeatable; default: log, job, worker)")
    command("backends", "configured backends with their footprints and state")
    for name, text in (("evict", "stop an idle backend's worker to free its memory"),
                       ("respawn", "restart a backend's worker (new code, or after failures)"),
                       ("preload", "start a backend's worker now, before any job"),
                       ("kill", "SIGKILL a stuck backend's worker now (its jobs fail)")):
        p = command(name, text)
        p.add_argument("backend")
    command("zero", "evict every idle backend")
    p = command("drain", "drain a GPU: running work finishes, nothing new is admitted there")
    p.add_argument("gpu", type=int, metavar="GPU", help="the GPU's index")
    p.add_argument("--off", action="store_true", help="admit work on it again")
    command("reload", "read the backend descriptors again and apply what changed (as "
                      "SIGHUP to --serve does)")
    p = command("logs", "a backend's worker log")
    p.add_argument("backend")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("-n", "--lines", type=int, default=50, help="lines to show (default 50)")
    command("doctor", "check NVML, the runtime directory, the journal and every backend")
    p = command("calibrate", "measure BACKEND's real VRAM footprint: a run alone on a GPU that "
                             "writes a report and, when it can be trusted, an overlay")
    p.add_argument("backend")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="requests to run, one after another (default 3; 2 or more tell a "
                        "leak or a warm-up apart)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--request", metavar="JSON",
                        help="the request each repeat sends, as JSON text (default: the "
                             "backend's calibration_request)")
    source.add_argument("--request-file", metavar="FILE", help="the request, read from FILE")
    p.add_argument("--settle", type=float, default=1.0, metavar="S",
                   help="seconds to watch the memory settle after loading and after each "
                        "request (default 1)")
    p.add_argument("--out", metavar="FILE",
                   help="also write the measured descriptor overlay (YAML) to FILE, as "
                        "vramd's --out does (nothing is written when the run earns none)")
    p.add_argument("--report", metavar="FILE", help="also copy the JSON report to FILE")
    p = command("recalibrate", "re-run the analysis on a stored calibration report (no GPU, "
                               "no engine) and say what changed")
    p.add_argument("report", metavar="REPORT.json")
    p.add_argument("--write-overlay", action="store_true",
                   help="write the measured figures into the config's backends.d (when the "
                        "report justifies them)")
    p = command("import-vramd", IMPORT_VRAMD_HELP)
    if not isinstance(p, _Skipped):
        from .import_vramd import add_arguments as import_vramd_arguments

        import_vramd_arguments(p)
    from .extra_commands import add_parsers

    add_parsers(command, only)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_named(argv))
    args = parser.parse_args(argv)
    if args.serve and args.command is not None:
        parser.error(f"--serve runs the engine; it does not go with {args.command!r}")
    try:
        if args.command in EXTRA_COMMANDS:
            from .extra_commands import run_extra

            return run_extra(args)
        if args.command is not None:
            from .commands import run_command

            return run_command(args)
        if args.serve:
            from .serve import run_serve

            return run_serve(args)
        from .app import run_app

        return run_app(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return Exit.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
