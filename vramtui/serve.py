"""``vramtui --serve``: the engine, headless, on the main thread, with its control socket.

Logs go to stderr (and ``--log-file``) with timestamps; one line on stdout says where the
control socket is and whether the GPU is simulated.  SIGTERM or SIGINT stops it cleanly: no new
jobs, queued ones are cancelled, running ones get their backend's stop grace, workers are
stopped; then it exits 0.  A second ``--serve`` for the same runtime directory refuses at once,
naming the running engine's pid and socket.  With ``--dynamo NS`` each backend is also served
as the NVIDIA Dynamo endpoint ``NS.BACKEND.generate`` (see :mod:`vramtui.dynamo_bridge`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from supervisor.errors import VramtuiError
from supervisor.paths import Paths, PathsError

from . import __version__
from .cli import Exit
from .connect import attach, serve_control

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(log_file: str | None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=handlers, force=True)


def _fail(text: str, code: int) -> int:
    print(f"vramtui --serve: {text}", file=sys.stderr)
    return code


def run_serve(args: argparse.Namespace) -> int:
    try:
        setup_logging(args.log_file)
    except OSError as exc:
        return _fail(f"cannot open --log-file {args.log_file}: {exc.strerror}", Exit.USAGE)
    group: int | None = None
    if args.allow_group:
        from supervisor.control.peer import resolve_group

        try:
            group = resolve_group(args.allow_group)
        except ValueError as exc:
            return _fail(f"--allow-group: {exc}", Exit.USAGE)
    if getattr(args, "dynamo", None):
        from .dynamo_bridge import check_dynamo

        problem = check_dynamo(args.dynamo)
        if problem is not None:
            return _fail(problem, Exit.USAGE)
    paths = Paths.from_env()
    # Refuse at once when an engine already answers here (before touching anything).
    try:
        running = attach(paths.control_socket, wait_starting=0)
    except VramtuiError:
        running = None
    if running is not None:
        pid = running.info.get("pid", "?")
        running.close()
        return _fail(f"another vramtui engine (pid {pid}) already serves {paths.control_socket}"
                     "; attach to it (vramtui status), or stop it first", Exit.REFUSED)
    return _serve(args, group)


def _serve(args: argparse.Namespace, group: int | None) -> int:
    from supervisor.facade import EngineRunning, Supervisor
    from supervisor.gpu.errors import BadGpuSpec, GpuUnavailable
    from supervisor.limits import BadLimit

    try:
        sup = Supervisor.from_config(gpus=args.gpus, backends=args.backends)
    except (BadGpuSpec, PathsError, BadLimit) as exc:
        return _fail(str(exc), Exit.USAGE)
    except GpuUnavailable as exc:
        return _fail(str(exc), Exit.FAILED)

    def ready(server: object) -> None:
        snap = sup.engine.snapshot()
        sizes = ", ".join(f"GPU{g.index} {g.total_mib} MiB" for g in snap.gpus) or "no GPU"
        kind = "SIMULATED" if snap.simulated else "NVIDIA"
        print(f"vramtui {__version__}: engine pid {os.getpid()} serving "
              f"{sup.paths.control_socket} — GPU {kind}: {sizes}"
              + (f" ({snap.notice})" if snap.notice else ""), flush=True)

    serve_control(sup, mode="serve", allow_group=group, on_ready=ready)
    bridge = None
    if getattr(args, "dynamo", None):
        from .dynamo_bridge import DynamoBridge

        bridge = DynamoBridge(sup, args.dynamo)
        sup.add_service(bridge)
    try:
        sup.run()
    except EngineRunning as exc:
        return _fail(str(exc), Exit.REFUSED)
    except (VramtuiError, OSError) as exc:
        text = str(exc) if isinstance(exc, VramtuiError) else f"{exc.strerror or exc}"
        return _fail(f"the engine could not start: {text}", Exit.FAILED)
    if bridge is not None and bridge.error is not None:
        return _fail(f"Dynamo could not start: {bridge.error}", Exit.FAILED)
    logging.getLogger("vramtui").info("stopped")
    return Exit.OK
