"""``vramtui completion bash|zsh|fish``: a completion script generated from the real parser.

shtab walks the argparse parser (the same one ``vramtui --help`` prints), so completion never
drifts from the flags.  Backend names complete too: the script calls
``vramtui completion --list-backends``, which asks the running engine, or else reads the
configured descriptors; job ids (``cancel``, ``result``, ``retry``, ``priority``) through
``vramtui completion --list-jobs``, from the running engine.  Install::

    vramtui completion bash > ~/.local/share/bash-completion/completions/vramtui
    vramtui completion zsh  > "${fpath[1]}/_vramtui"
    vramtui completion fish > ~/.config/fish/completions/vramtui.fish
"""

from __future__ import annotations

import argparse
import os
import sys

SHELLS = ("bash", "zsh", "fish")
LIST_BACKENDS = "vramtui completion --list-backends 2>/dev/null"
LIST_JOBS = "vramtui completion --list-jobs 2>/dev/null"
FILE_OPTIONS = frozenset({"--backends", "--attach", "--log-file", "--http-token-file",
                          "--data-file", "--output", "--out", "--request-file",
                          "--token-file"})


def script(shell: str) -> str:
    """The completion script for ``shell``."""
    import shtab

    from .parser import build_parser

    parser = build_parser()
    backends = shtab.cmd(LIST_BACKENDS)
    jobs = shtab.cmd(LIST_JOBS)
    for p in _parsers(parser):
        for action in p._actions:
            if not action.option_strings and action.dest == "backend":
                action.complete = backends  # type: ignore[attr-defined]
            elif not action.option_strings and action.dest in ("job", "jobs"):
                action.complete = jobs  # type: ignore[attr-defined]
            elif set(action.option_strings) & FILE_OPTIONS:
                action.complete = shtab.FILE  # type: ignore[attr-defined]
    return shtab.complete(parser, shell=shell)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out.extend(_parsers(sub))
    return out


def backend_names() -> list[str]:
    """The running engine's backends, else the configured ones (never raises)."""
    try:
        from supervisor.client import Client
        from supervisor.paths import Paths

        client = Client(Paths.from_env().control_socket)
        try:
            return [b.name for b in client.snapshot(data_limit=0, light=True).backends]
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - no engine: read the descriptors instead
        pass
    try:
        from supervisor.backends.loader import default_layers, load_backends, named_layers
        from supervisor.paths import Paths

        paths = Paths.from_env()
        loaded = load_backends(default_layers(paths.config_dir, [], os.environ),
                               demo_fallback=not named_layers([], os.environ))
        return sorted(loaded.backends)
    except Exception:  # noqa: BLE001 - completion must never print an error
        return []


def job_ids() -> list[str]:
    """The running engine's jobs, running and queued first, then the recent ones (never
    raises; none without an engine)."""
    try:
        from supervisor.client import Client
        from supervisor.paths import Paths

        client = Client(Paths.from_env().control_socket)
        try:
            snap = client.snapshot(data_limit=0)
        finally:
            client.close()
    except Exception:  # noqa: BLE001 - completion must never print an error
        return []
    return list(dict.fromkeys(j.id for j in (*snap.running, *snap.queued, *snap.recent)))


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", nargs="?", choices=SHELLS, help="the shell (bash, zsh, fish)")
    p.add_argument("--list-backends", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--list-jobs", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from ..exits import Exit

    if args.list_backends:
        for name in backend_names():
            print(name)
        return Exit.OK
    if args.list_jobs:
        for job_id in job_ids():
            print(job_id)
        return Exit.OK
    if args.shell is None:
        print("vramtui completion: name a shell: bash, zsh or fish "
              "(e.g. vramtui completion bash > ~/.local/share/bash-completion/completions/"
              "vramtui)", file=sys.stderr)
        return Exit.USAGE
    sys.stdout.write(script(args.shell))
    return Exit.OK
