"""The ``vramtui`` command: the TUI (default), ``--serve``, and the client subcommands.

This is the CLI's main module: :func:`main` parses the line (:mod:`vramtui.cli.parser`) and
runs the command the registry names for it (:mod:`vramtui.cli.registry`; one module per
command, or per small group), else ``--serve``, else the TUI.  Each is imported only when it
runs, so that ``vramtui status`` never imports Textual and starts fast; this module itself
imports nothing at the top.  Handlers return an exit code (:mod:`vramtui.exits`).

Nothing under ``vramtui.cli`` imports this module: the commands do not know the CLI that
runs them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from .registry import Command


def main(argv: Sequence[str] | None = None) -> int:
    from ..exits import Exit
    from .parser import parse

    parser, args = parse(sys.argv[1:] if argv is None else argv)
    if args.serve and args.command is not None:
        parser.error(f"--serve runs the engine; it does not go with {args.command!r}")
    try:
        if args.command is not None:
            from .registry import command

            return _run(command(args.command), args)
        if args.serve:
            from ..serve import run_serve

            return run_serve(args)
        if not _terminal():
            from ..output import error

            error("the TUI needs a terminal (stdin and stderr are not both one); headless, "
                  "`vramtui --serve` runs the engine, `vramtui status` shows it, "
                  "`vramtui web` serves the dashboard to a browser")
            return Exit.USAGE
        from ..app import run_app

        return run_app(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return Exit.INTERRUPTED


def _terminal() -> bool:
    """Whether the TUI has a terminal to run on: Textual reads keys from stdin and draws on
    stderr (stdout may go elsewhere).  A driver named in ``TEXTUAL_DRIVER`` needs none:
    textual-serve's web driver (``vramtui web``, ``--serve --http``'s ``/ui``) speaks over
    pipes.  Without one, the TUI would wait forever for keys that never come (CI, a
    pipeline, ``vramtui < /dev/null``)."""
    import os

    if os.environ.get("TEXTUAL_DRIVER"):
        return True
    streams = (sys.__stdin__, sys.__stderr__)
    try:
        return all(s is not None and s.isatty() for s in streams)
    except (AttributeError, ValueError):  # closed
        return False


def _run(row: Command, args: argparse.Namespace) -> int:
    """Run one command.  Every error the user can cause is one line on stderr (``vramtui:
    error: ...``) and a non-zero exit code, never a traceback; with ``--json`` the error is
    also printed on stdout as ``{"error": ..., "type": ...}``.

    The TUI's options given with a command (``args.tui_flags``) do nothing: a line on stderr
    says so first, as a command that attaches does for the options that start an engine."""
    if getattr(args, "tui_flags", ()):
        from ..output import ignored

        ignored(args.tui_flags, "such options are the TUI's (`vramtui` with no command) and "
                                f"do nothing for `vramtui {row.name}`")
    handler = row.handler()
    if not row.reports_errors:
        return handler(args)
    import os

    from supervisor.errors import VramtuiError

    from ..exits import Exit, UsageError, exit_code

    as_json = bool(getattr(args, "json", False))
    try:
        return handler(args)
    except (UsageError, VramtuiError) as exc:
        code = Exit.USAGE if isinstance(exc, UsageError) else exit_code(exc)
        _report(str(exc), type(exc).__name__, as_json)
        return code
    except BrokenPipeError:  # `vramtui jobs | head`: stop quietly
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
        return Exit.OK
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: still one line unless asked for more
        if os.environ.get("VRAMTUI_DEBUG"):
            raise
        _report(f"internal error: {type(exc).__name__}: {exc} (run with VRAMTUI_DEBUG=1 for "
                "the traceback, and please report it)", "InternalError", as_json)
        return Exit.INTERNAL


def _report(text: str, kind: str, as_json: bool) -> None:
    from ..output import error

    error(text)
    if as_json:
        import json

        sys.stdout.write(json.dumps({"error": text, "type": kind}) + "\n")
