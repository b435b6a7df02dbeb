"""The Textual control centre: ``run_app(args)`` starts (or attaches to) an engine and shows it.

``VramApp(api, mode)`` takes any :class:`supervisor.api.EngineAPI` — the embedded
``Supervisor``, the control-socket client, or the deterministic ``FixedSource`` that the
snapshot tests and screenshots use (``tests/fixed_source.py``: a test fixture, not shipped).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable

from supervisor.api import EngineAPI

from .app import VramApp

__all__ = ["VramApp", "run_app"]


def _open(args: argparse.Namespace) -> tuple[EngineAPI, str, Callable[[], EngineAPI] | None]:
    from vramtui.connect import open_engine

    api, mode = open_engine(args, allow_embedded=True)
    reconnect = None
    if mode != "embedded":
        def reconnect() -> EngineAPI:
            return open_engine(args, allow_embedded=False)[0]
    return api, mode, reconnect


def _start_failed(exc: BaseException) -> int:
    """One line, and the exit code the CLI and --serve give for the same cause."""
    from vramtui.connect import EngineStartError
    from vramtui.exits import Exit, exit_code
    from vramtui.output import error

    error(str(exc))
    if isinstance(exc, EngineStartError):
        return Exit.USAGE if exc.usage else Exit.FAILED
    from supervisor.facade import EngineRunning

    return Exit.REFUSED if isinstance(exc, EngineRunning) else exit_code(exc)


def run_app(args: argparse.Namespace) -> int:
    """Run the TUI until the user quits; an embedded engine is stopped on the way out."""
    from supervisor.errors import VramtuiError

    # The engine logs through `logging`; with no handler, warnings would be printed on
    # stderr over the screen.  The TUI shows the engine's log itself.
    logging.getLogger("supervisor").addHandler(logging.NullHandler())
    import os

    theme = getattr(args, "theme", None) or os.environ.get("VRAMTUI_THEME") or None
    if theme is not None:
        from textual.theme import BUILTIN_THEMES

        if theme not in BUILTIN_THEMES:
            from vramtui.output import error

            error(f"unknown theme {theme!r}; themes: {', '.join(sorted(BUILTIN_THEMES))}")
            from vramtui.exits import Exit

            return Exit.USAGE
    try:
        api, mode, reconnect = _open(args)
    except VramtuiError as exc:
        return _start_failed(exc)
    app = VramApp(api, mode, readonly=bool(getattr(args, "readonly", False)),
                  confirm=not getattr(args, "no_confirm", False), reconnect=reconnect,
                  theme=theme)
    try:
        code = app.run()
    finally:
        if mode == "embedded":
            print("vramtui: stopping the engine and its workers…", file=sys.stderr)
            api.stop()
        else:
            with contextlib.suppress(Exception):
                getattr(api, "close", lambda: None)()
    return int(code or 0)
