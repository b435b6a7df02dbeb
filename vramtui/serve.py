"""``vramtui --serve``: the engine, headless, on the main thread, with its control socket.

Logs go to stderr (and ``--log-file``) with timestamps; one line on stdout says where the
control socket is and whether the GPU is simulated.  SIGTERM or SIGINT stops it cleanly: no new
jobs, queued ones are cancelled, running ones get their backend's stop grace, workers are
stopped; then it exits 0.  A second ``--serve`` for the same runtime directory refuses at once,
naming the running engine's pid and socket.  With ``--dynamo NS`` each backend is also served
as the NVIDIA Dynamo endpoint ``NS.BACKEND.generate`` (see :mod:`supervisor.doors.dynamo`).
With ``--http ADDR`` (or an ``http:`` section in ``config.yaml``) the HTTP front door runs on
the engine's loop too (see :mod:`vramtui.http_serve`), and prints one more line once it
listens.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.engine import EngineConfig
from supervisor.errors import VramtuiError
from supervisor.paths import Paths, PathsError, open_private

from . import __version__
from .connect import attach, serve_control
from .exits import Exit

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(log_file: str | None) -> None:
    """Log to stderr, and to ``log_file`` if given: a file of ours that only we can read (it
    carries what workers and servers say, their errors, their logs' last lines), appended
    to, never through a link (``paths.open_private``: OSError otherwise, EPERM for a file of
    another user, who could read it or make it a link)."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        fd = open_private(Path(log_file).expanduser(),
                          os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        handlers.append(logging.StreamHandler(open(fd, "a", encoding="utf-8")))  # noqa: SIM115
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=handlers, force=True)


def _fail(text: str, code: int) -> int:
    print(f"vramtui --serve: {text}", file=sys.stderr)
    return code


def run_serve(args: argparse.Namespace) -> int:
    named = getattr(args, "attach", None)
    if named:  # a running engine's socket: --serve serves its own
        own = Paths.from_env().control_socket
        if os.path.realpath(os.path.expanduser(named)) != os.path.realpath(own):
            return _fail(f"--attach names a running engine's socket, and --serve serves its "
                         f"own ({own}): leave --attach out (set VRAMTUI_RUNTIME_DIR to serve "
                         "in another directory)", Exit.USAGE)
    if getattr(args, "tui_flags", ()):
        from .output import ignored

        ignored(args.tui_flags, "such options are the TUI's, and --serve runs none")
    try:
        setup_logging(args.log_file)
    except OSError as exc:
        import errno

        why = ("it is a link (a log file is opened only as itself: give the file it points "
               "to; the log goes to stderr as well)" if exc.errno == errno.ELOOP
               else exc.strerror)
        return _fail(f"cannot open --log-file {args.log_file}: {why}", Exit.USAGE)
    group: int | None = None
    if args.allow_group:
        from supervisor.control.peer import resolve_group

        try:
            group = resolve_group(args.allow_group)
        except ValueError as exc:
            return _fail(f"--allow-group: {exc}", Exit.USAGE)
    if getattr(args, "dynamo", None):
        from supervisor.doors.dynamo import check_dynamo

        problem = check_dynamo(args.dynamo)
        if problem is not None:
            return _fail(problem, Exit.USAGE)
    paths = Paths.from_env()
    from .http_serve import http_settings

    try:
        args.http_config = http_settings(args, paths)
    except VramtuiError as exc:
        return _fail(str(exc), Exit.USAGE)
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


ENGINE_KEYS = frozenset({"max_queue", "sleep_host_budget", "yield_when", "reserve",
                         "on_others", "gpus", "host_reserve"})


def engine_config(args: argparse.Namespace, paths: Paths,
                  environ: Mapping[str, str] | None = None) -> EngineConfig:
    """The engine's settings: the flags, else the environment, else ``config.yaml``::

        engine:
          max_queue: 64             # jobs that may wait before new ones are refused (512)
          sleep_host_budget: 16GiB  # host memory sleeping workers may take (half the host's)
          yield_when: [steam, blender]  # yield a GPU while one runs there (or {command: …})
          reserve: {0: 2GiB}        # kept free per GPU, for the desktop (default 256MiB)
          on_others: wait           # others over-commit a GPU: its running jobs finish
                                    # (wait), or are cancelled after 3 s (cancel)
          gpus: [auto, host]        # the devices when --gpus is not given (auto)
          host_reserve: 2GiB        # what the host device leaves to the rest (1GiB)

    (``--max-queue N``, ``VRAMTUI_MAX_QUEUE``, ``VRAMTUI_SLEEP_HOST_BUDGET``).  VramtuiError,
    one line, for a bad value.
    """
    from supervisor.http.config import read_section

    env = os.environ if environ is None else environ
    read: list[dict[str, Any]] = []

    def section() -> dict[str, Any]:
        if not read:
            found = read_section(paths.settings_file, "engine", "max_queue: 64") or {}
            unknown = sorted(set(found) - ENGINE_KEYS)
            if unknown:
                raise VramtuiError(f"{paths.settings_file}: engine: unknown key {unknown[0]!r} "
                                   f"(known: {', '.join(sorted(ENGINE_KEYS))})")
            read.append(found)
        return read[0]

    depth = getattr(args, "max_queue", None)
    if depth is None and env.get("VRAMTUI_MAX_QUEUE", "").strip():
        depth = _queue_depth(env["VRAMTUI_MAX_QUEUE"].strip(), "VRAMTUI_MAX_QUEUE")
    if depth is None and "max_queue" in section():
        depth = _queue_depth(section()["max_queue"],
                             f"{paths.settings_file}: engine: max_queue")
    budget: int | None = None
    if env.get("VRAMTUI_SLEEP_HOST_BUDGET", "").strip():
        budget = _size(env["VRAMTUI_SLEEP_HOST_BUDGET"].strip(), "VRAMTUI_SLEEP_HOST_BUDGET")
    elif "sleep_host_budget" in section():
        budget = _size(section()["sleep_host_budget"],
                       f"{paths.settings_file}: engine: sleep_host_budget")
    config = EngineConfig()
    config.yield_when = _rules(section().get("yield_when"),
                               f"{paths.settings_file}: engine: yield_when")
    config.gpu_reserve_mib = _reserves(section().get("reserve"),
                                       f"{paths.settings_file}: engine: reserve")
    policy = section().get("on_others", "wait")
    if policy not in ("wait", "cancel"):
        raise VramtuiError(f"{paths.settings_file}: engine: on_others: wait or cancel, not "
                           f"{policy!r}")
    config.others_policy = policy
    if getattr(args, "gpus", None):
        config.gpus = str(args.gpus)
    elif "gpus" in section():
        config.gpus = _gpus(section()["gpus"], f"{paths.settings_file}: engine: gpus")
    if "host_reserve" in section():
        config.host_reserve_mib = _size(section()["host_reserve"],
                                        f"{paths.settings_file}: engine: host_reserve")
    if depth is not None:
        config.max_queue_depth = depth
    if budget is not None:
        config.sleep_host_budget_mib = budget
    return config


def _size(value: object, where: str) -> int:
    from supervisor.units import parse_size

    try:
        return parse_size(value)
    except ValueError as exc:
        raise VramtuiError(f"{where}: {exc}") from None


def _rules(value: object, where: str) -> tuple[Any, ...]:
    from supervisor.engine.rules import parse_rules

    return parse_rules(value, where)


def _reserves(value: object, where: str) -> dict[int, int]:
    """``{0: 2GiB, 1: 512MiB}``: what is kept free on each GPU named."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k < 1024 for k in value):
        raise VramtuiError(f"{where}: a map of GPU index to size, like {{0: 2GiB}}")
    return {int(k): _size(v, f"{where}: {k}") for k, v in value.items()}


def _gpus(value: object, where: str) -> str:
    """``[auto, host]`` or ``host:48GiB``: what ``--gpus`` would say."""
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(i, str) and i.strip() for i in items):
        raise VramtuiError(f"{where}={value!r}: expected what --gpus takes, e.g. [host], "
                           "host:48GiB or [auto, host]")
    return ",".join(i.strip() for i in items)


def _queue_depth(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise VramtuiError(f"{where}={value!r} is not a number of jobs")
    try:
        depth = int(value)
    except ValueError:
        raise VramtuiError(f"{where}={value!r} is not a number of jobs") from None
    if depth < 1:
        raise VramtuiError(f"{where} must be at least 1, got {depth}")
    return depth


def _serve(args: argparse.Namespace, group: int | None) -> int:
    from supervisor.facade import EngineRunning, Supervisor
    from supervisor.gpu.errors import BadGpuSpec, GpuUnavailable
    from supervisor.limits import BadLimit

    try:
        config = engine_config(args, Paths.from_env())
    except VramtuiError as exc:
        return _fail(str(exc), Exit.USAGE)
    try:
        sup = Supervisor.from_config(gpus=config.gpus, backends=args.backends, config=config)
    except (BadGpuSpec, PathsError, BadLimit) as exc:
        return _fail(str(exc), Exit.USAGE)
    except GpuUnavailable as exc:
        return _fail(str(exc), Exit.FAILED)

    def ready(server: object) -> None:
        # What the start made (modules, descriptors, the app) lives as long as the
        # process: its garbage collected once, the rest is kept out of the collector's
        # sight, so a full collection no longer walks it (measured with a forwarded request
        # at a time: a 37 ms pause of the engine's loop about every 1,000 requests, gone).
        gc.collect()
        gc.freeze()
        snap = sup.engine.snapshot()
        sizes = ", ".join(f"HOST{g.index} {g.total_mib} MiB" if g.host
                          else f"GPU{g.index} {g.total_mib} MiB" for g in snap.gpus) or "no GPU"
        gpus = [g for g in snap.gpus if not g.host]
        kinds = ["GPU SIMULATED" if any(g.simulated for g in gpus) else "GPU NVIDIA"] \
            if gpus else []
        if len(gpus) < len(snap.gpus):
            kinds.append("host memory")
        kind = " + ".join(kinds) or "no device"
        print(f"vramtui {__version__}: engine pid {os.getpid()} serving "
              f"{sup.paths.control_socket} — {kind}: {sizes}"
              + (f" ({snap.notice})" if snap.notice else ""), flush=True)

    serve_control(sup, mode="serve", allow_group=group, on_ready=ready)
    bridge = None
    if getattr(args, "dynamo", None):
        from supervisor.doors.dynamo import DynamoBridge

        bridge = DynamoBridge(sup, args.dynamo)
        sup.add_service(bridge)
    if getattr(args, "http_config", None) is not None:
        from .http_serve import add_http

        add_http(sup, args.http_config)
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
