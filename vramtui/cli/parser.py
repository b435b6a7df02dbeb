"""The ``vramtui`` parser: the top-level options, and a subparser per registered command.

The commands come from :mod:`vramtui.cli.registry`; each one's own arguments come from its
module, imported only when that command is on the command line (or when the whole parser is
wanted: ``vramtui completion``).  Without a command (the TUI, ``--serve``, ``--help``) no
command module is imported at all: :func:`parse` lists the commands from the registry alone.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from .. import __version__
from ..exits import EXIT_CODES
from .registry import COMMANDS, REGISTRY

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


def _named_path(text: str) -> str:
    """``--backends PATH``: a path, never empty (an empty one read the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: name a descriptor file or folder")
    return text


def _recorded(base: type[argparse.Action], into: str) -> type[argparse.Action]:
    """``base`` that also notes its option in ``into``, the namespace's tuple of the options
    given that a command does not use: ``engine_flags``, those that only matter when an
    engine starts (a command that attaches to a running one says they were ignored:
    :func:`vramtui.connect.open_client`), and ``tui_flags``, the TUI's own (every command
    says they were ignored: :func:`vramtui.cli.main`).  A dest of its own: a command's
    same-named argument (``yield``'s GPUs, ``install-service``'s ``--gpus``, ``web``'s
    ``--readonly``) cannot hide it."""

    class Recorded(base):  # type: ignore[valid-type,misc]
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                     values: object, option_string: str | None = None) -> None:
            super().__call__(parser, namespace, values, option_string)
            given = tuple(getattr(namespace, into, ()))
            if self.option_strings[0] not in given:
                setattr(namespace, into, (*given, self.option_strings[0]))

    return Recorded


_STORE = _recorded(argparse._StoreAction, "engine_flags")
_APPEND = _recorded(argparse._AppendAction, "engine_flags")
_TUI_STORE = _recorded(argparse._StoreAction, "tui_flags")
_TUI_SWITCH = _recorded(argparse._StoreTrueAction, "tui_flags")


def _engine_options(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(engine_flags=())
    parser.add_argument("--gpus", default=None, metavar="SPEC", action=_STORE,
                        help="'auto' (NVML, else a simulated 24 GiB GPU), 'nvml', "
                             "'sim:24GiB[,sim:8GiB…]', 'host[:SIZE]' (the host's memory), "
                             "or one of them then the host ('auto,host') (default: "
                             "config.yaml's engine: gpus, else auto)")
    parser.add_argument("--backends", action=_APPEND, default=[], metavar="PATH",
                        type=_named_path,
                        help="a backend descriptor file or directory (repeatable)")


_VALUE_OPTIONS = frozenset({"--gpus", "--backends", "--attach", "--log-file", "--allow-group",
                            "--dynamo", "--http", "--http-token-file", "--max-queue",
                            "--theme"})


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


def glue_negative_values(argv: Sequence[str]) -> list[str]:
    """``--for -1s`` as ``--for=-1s``: argparse takes a value that starts with ``-`` and is not
    a plain number (``-1s``, ``-2GiB``) for an unknown option and answers "expected one
    argument"; glued, the option's own check sees the value and says what is wrong with it."""
    out: list[str] = []
    for token in argv:
        prev = out[-1] if out else ""
        if (len(token) > 1 and token[0] == "-" and token[1].isdigit()
                and prev.startswith("--") and "=" not in prev and prev != "--"):
            out[-1] = f"{prev}={token}"
        else:
            out.append(token)
    return out


def parse(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser for ``argv`` and what it parsed (argparse exits on bad usage, as ever).

    The parser holds the arguments of the command on the line only.  When a quick look does
    not find it (none is named, or an abbreviated option hides it), a first pass with every
    command listed but none of their arguments finds it, and then its own parser parses.
    """
    argv = glue_negative_values(argv)
    named = command_named(argv)
    if named is None:
        listing = build_parser(arguments=False)
        named = listing.parse_known_args(argv)[0].command
        if named is None:
            return listing, listing.parse_args(argv)
    parser = build_parser(named)
    args, extra = parser.parse_known_args(argv)
    sub = parser._subparsers._group_actions[0].choices[named]  # type: ignore[union-attr]
    if extra:  # a flag nobody takes: the usage of the part of the line it was given to
        before = extra[0] in argv and named in argv and argv.index(extra[0]) < argv.index(named)
        (parser if before else sub).error(f"unrecognized arguments: {' '.join(extra)}")
    # A TUI switch the command takes too (`vramtui --readonly web`) is its own, not ignored:
    # the command's default would otherwise hide it (a dashboard that can change things).
    for flag in getattr(args, "tui_flags", ()):
        action = sub._option_string_actions.get(flag)
        if isinstance(action, argparse._StoreTrueAction):
            setattr(args, action.dest, True)
            args.tui_flags = tuple(f for f in args.tui_flags if f != flag)
    return parser, args


def build_parser(only: str | None = None, *,
                 arguments: bool = True) -> argparse.ArgumentParser:
    """The whole parser; with ``only``, just that subcommand's (a command starts faster).

    ``arguments=False`` lists every command with its help but none of their arguments
    (their modules are not imported): enough for ``vramtui --help`` and to tell which command
    a line names.
    """
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
                             "directory's; not with --serve, which serves its own)")
    parser.add_argument("--serve", action="store_true",
                        help="run the engine headless on this terminal (logs to stderr)")
    parser.add_argument("--log-file", action=_STORE, metavar="FILE",
                        help="with --serve: also log to FILE (appended, made 0600; a link "
                             "or another user's file is refused)")
    parser.add_argument("--allow-group", action=_STORE, metavar="GROUP",
                        help="with --serve: let members of GROUP use the control socket (it "
                             "becomes 0660 and the runtime directory 0710, both of group "
                             "GROUP; every directory above must be searchable by GROUP)")
    parser.add_argument("--dynamo", action=_STORE, metavar="NAMESPACE",
                        help="with --serve: also serve each backend as the NVIDIA Dynamo "
                             "endpoint NAMESPACE.BACKEND.generate (needs vramtui[dynamo])")
    parser.add_argument("--max-queue", action=_STORE, metavar="N", type=_queue_limit,
                        help="with --serve: refuse new jobs (queue full) while N wait "
                             "(default: $VRAMTUI_MAX_QUEUE, else config.yaml's engine: "
                             "max_queue, else 512)")
    parser.add_argument("--http", action=_STORE, metavar="ADDR",
                        help="with --serve: also serve the HTTP API on ADDR (127.0.0.1:8080, "
                             "[::1]:8080, or unix:/PATH; anything but loopback needs a token); "
                             "config.yaml's http: section does the same (needs vramtui[http])")
    parser.add_argument("--http-token-file", action=_STORE, metavar="FILE",
                        help="with --http: the bearer token, in a file only you can read "
                             "(or set VRAMTUI_HTTP_TOKEN)")
    parser.set_defaults(tui_flags=())
    parser.add_argument("--readonly", action=_TUI_SWITCH,
                        help="TUI: show everything, change nothing")
    parser.add_argument("--no-confirm", action=_TUI_SWITCH,
                        help="TUI: do not ask before evict/cancel/zero/kill/drain")
    parser.add_argument("--theme", action=_TUI_STORE, metavar="NAME",
                        help="TUI: the colour theme (e.g. textual-dark, nord, gruvbox, "
                             "textual-light; ctrl+p lists them all; default: $VRAMTUI_THEME, "
                             "else textual-dark).  NO_COLOR=1 turns colour off")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for row in REGISTRY:
        if only is not None and row.name != only:
            continue
        if not arguments:  # a name to choose; what follows it is left unparsed
            sub.add_parser(row.name, help=row.help, add_help=False)
            continue
        p = sub.add_parser(row.name, help=row.help, description=row.help,
                           epilog=EXIT_CODES, formatter_class=_Formatter)
        if "--json" in row.common:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            p.set_defaults(json=False)  # (read by the code that reports errors)
        if "--attach" in row.common:
            p.add_argument("--attach", metavar="SOCKET", default=argparse.SUPPRESS,
                           help="the control socket of the engine (default: the runtime "
                                "directory's)")
        row.add_arguments(p)
    return parser
