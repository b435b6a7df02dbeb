"""Finding the engine: attach to a running one, or (for the TUI) start an embedded one.

``open_engine(args, allow_embedded=...)`` returns an :class:`supervisor.api.EngineAPI` and a
one-line description of where it runs ("embedded", or "attached to pid N at PATH").  The CLI
passes ``allow_embedded=False`` and gets :class:`EngineNotRunning` (saying how to start one)
when none runs; the TUI passes True and, when none runs, starts the engine in a thread of its
own process — which also serves the control socket, so CLI commands can attach to it.

An engine that holds the lock but does not answer yet (it is starting) is waited for.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.client import Client
from supervisor.control.errors import EngineNotRunning
from supervisor.errors import VramtuiError
from supervisor.paths import Paths, PathsError

from . import __version__

if TYPE_CHECKING:
    from supervisor.api import EngineAPI
    from supervisor.control.server import ControlServer
    from supervisor.facade import Supervisor

STARTING_WAIT_S = 15.0


class EngineStartError(VramtuiError):
    """The embedded engine could not be built (bad --gpus, no NVML with --gpus nvml, paths).

    ``usage``: the user's input is at fault (a bad --gpus or directory: exit 2, as --serve
    says), else the machine is (no NVML: exit 1)."""

    def __init__(self, message: str, *, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


def control_socket(args: argparse.Namespace | None = None) -> Path:
    """The socket to use: ``--attach PATH``, else the runtime directory's."""
    attach = getattr(args, "attach", None) if args is not None else None
    return Path(attach) if attach else Paths.from_env().control_socket


def lock_holder(paths: Paths) -> int | None:
    """The pid written in the engine lock file, if that process is alive."""
    try:
        text = paths.lock_path.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def attach(path: Path, *, wait_starting: float = STARTING_WAIT_S,
           paths: Paths | None = None) -> Client:
    """A client of the engine at ``path``; waits a little for one that is starting."""
    deadline = time.monotonic() + wait_starting
    while True:
        try:
            return Client(path, version=__version__)
        except EngineNotRunning:
            holder = lock_holder(paths) if paths is not None else None
            if holder is None:
                raise
            if time.monotonic() > deadline:
                assert paths is not None
                raise EngineNotRunning(
                    f"the engine pid {holder} holds {paths.lock_path} but does not answer on "
                    f"{path}; is it stuck? (stop it: kill {holder})") from None
        time.sleep(0.05)  # an engine holds the lock but its socket is not up yet


def describe(client: Client) -> str:
    """"attached to the engine at PATH" (its pid changes when it restarts: the TUI reads it
    from each snapshot)."""
    kind = " (embedded in another TUI)" if client.info.get("mode") == "embedded" else ""
    return f"attached to the engine at {client.path}{kind}"


def open_engine(args: argparse.Namespace, *, allow_embedded: bool) -> tuple[EngineAPI, str]:
    """The engine to use and a one-line description of where it runs.

    Raises :class:`EngineNotRunning` (CLI, or an explicit ``--attach`` that does not answer),
    or whatever starting an embedded engine raises (each with a one-line message).
    """
    explicit = getattr(args, "attach", None)
    paths = Paths.from_env()
    path = Path(explicit) if explicit else paths.control_socket
    try:
        client = attach(path, paths=None if explicit else paths)
        return client, describe(client)
    except EngineNotRunning:
        if explicit or not allow_embedded:
            raise
    return _embedded(args, paths)


def open_client(args: argparse.Namespace) -> Client:
    """The running engine for a CLI command (never starts one): EngineNotRunning if none.

    The options that only matter when an engine starts (``--gpus``, ``--backends``, ``--serve``'s
    ``--http`` …: ``args.engine_flags``) have no effect here: a line on stderr says so, once."""
    explicit = getattr(args, "attach", None)
    paths = Paths.from_env()
    path = Path(explicit) if explicit else paths.control_socket
    client = attach(path, paths=None if explicit else paths)
    given = tuple(getattr(args, "engine_flags", ()))
    if given:
        from .output import ignored

        args.engine_flags = ()  # said once, however often the command attaches
        ignored(given, already_runs(client))
    return client


def already_runs(client: Client) -> str:
    """Why options that start an engine did nothing: one already runs (its pid, its devices)."""
    try:
        snap = client.snapshot(data_limit=0, light=True)
    except VramtuiError:
        where = f" at {client.path}"
    else:
        devices = " + ".join(g.name + (f" ({g.total_mib // 1024} GiB)" if g.host else "")
                             for g in snap.gpus)
        where = f" (pid {snap.pid}) already runs" + (f" on {devices}" if devices else "")
    return (f"the engine{where}; such options take effect only when an engine starts "
            "(`vramtui stop` first to start one with them)")


def _embedded(args: argparse.Namespace, paths: Paths) -> tuple[EngineAPI, str]:
    from supervisor.facade import EngineRunning, Supervisor
    from supervisor.gpu.errors import BadGpuSpec, GpuUnavailable
    from supervisor.limits import BadLimit

    try:
        from .serve import engine_config  # the same settings as --serve: flags, env, file

        config = engine_config(args, paths)
        sup = Supervisor.from_config(gpus=config.gpus,
                                     backends=getattr(args, "backends", None) or (),
                                     config=config)
    except (BadGpuSpec, PathsError, BadLimit) as exc:
        raise EngineStartError(str(exc)) from None
    except VramtuiError as exc:  # a bad --max-queue, VRAMTUI_MAX_QUEUE or config.yaml
        raise EngineStartError(str(exc)) from None
    except GpuUnavailable as exc:
        raise EngineStartError(str(exc), usage=False) from None
    serve_control(sup, mode="embedded")
    try:
        sup.start_in_thread()
    except EngineRunning as exc:
        if exc.socket is None:  # another engine's journal (state directory): none to attach
            raise
        # Another engine won the race to start: attach to it instead.
        client = attach(paths.control_socket, paths=paths)
        return client, describe(client)
    return sup, "embedded"


def serve_control(sup: Supervisor, *, mode: str, allow_group: int | None = None,
                  on_ready: Callable[[ControlServer], None] | None = None) -> ControlServer:
    """Add the control server to ``sup`` (before it starts)."""
    from supervisor.control.server import ControlServer

    server = ControlServer(sup.engine, sup.paths.control_socket, mode=mode,
                           version=__version__, allow_group=allow_group,
                           on_ready=on_ready, max_request=sup.limits.max_request)
    sup.add_service(server)
    return server
