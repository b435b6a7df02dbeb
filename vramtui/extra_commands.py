"""The subcommands around the HTTP front door: ``completion``, ``install-service``, ``web``.

Their parsers are added to the one ``vramtui`` parser (so ``--help`` and the completion
script show them); each handler lives in its own module and is imported only when run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_parsers(command: Callable[[str, str], Any], only: str | None = None) -> None:
    """Add the subcommands through the parser's own ``command(name, help)`` helper."""
    p = command("completion", "print a shell completion script (bash, zsh or fish)")
    p.add_argument("shell", nargs="?", choices=("bash", "zsh", "fish"),
                   help="the shell (bash, zsh, fish)")
    p.add_argument("--list-backends", action="store_true", help=argparse.SUPPRESS)

    p = command("install-service", "write a systemd user unit that runs `vramtui --serve` "
                                   "(KillMode=mixed, Restart=on-failure)")
    p.add_argument("--gpus", default="auto", metavar="SPEC", help="the engine's --gpus")
    p.add_argument("--backends", action="append", default=[], metavar="PATH",
                   help="the engine's --backends (repeatable)")
    p.add_argument("--http", metavar="ADDR", help="the engine's --http")
    p.add_argument("--http-token-file", metavar="FILE", help="the engine's --http-token-file")
    p.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    p.add_argument("--force", action="store_true", help="replace an existing unit")

    p = command("web", "the dashboard in a browser, attached to the running engine "
                       "(needs vramtui[http]; --serve --http serves it at /ui too)")
    p.add_argument("--listen", default="127.0.0.1:8081", metavar="ADDR",
                   help="where to listen (default 127.0.0.1:8081; anything but loopback "
                        "needs a token)")
    p.add_argument("--token-file", metavar="FILE",
                   help="the bearer token (or VRAMTUI_HTTP_TOKEN); open /ui/?token=TOKEN once")
    p.add_argument("--readonly", action="store_true",
                   help="the browser may look but change nothing")


def run_extra(args: argparse.Namespace) -> int:
    if args.command == "completion":
        from .completion import run_completion

        return run_completion(args)
    if args.command == "install-service":
        from .service_unit import run_install_service

        return run_install_service(args)
    from .web import run_web

    return run_web(args)
