"""Loading a worker script and running it: shared by ``run()`` and ``python -m worker_sdk``."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import traceback

from .registry import REGISTRY, WorkerScriptError
from .worker import ExitCode, configure_logging, serve

log = logging.getLogger("worker_sdk")


class ScriptLoadError(Exception):
    """The worker script is missing or raised while being imported."""


def load_script(path: str) -> None:
    """Import the author's script so its decorators register (as module ``pipeline``)."""
    script = os.path.abspath(path)
    if not os.path.isfile(script):
        raise ScriptLoadError(f"worker script not found: {script}")
    folder = os.path.dirname(script)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("pipeline", script)
    if spec is None or spec.loader is None:
        raise ScriptLoadError(f"cannot load {script} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pipeline"] = module
    try:
        spec.loader.exec_module(module)
    except WorkerScriptError:
        raise
    except BaseException as exc:  # noqa: BLE001 - the author's script may raise anything
        traceback.print_exc()
        raise ScriptLoadError(
            f"{script} raised {type(exc).__name__} while loading: {exc}"
        ) from None


def _attach_simulated_gpu() -> None:
    if os.environ.get("VRAMTUI_SIM_DIR"):
        from . import sim

        sim.attach()


def run_worker(
    script_path: str | None,
    control_socket_path: str,
    data_socket_path: str,
    client_id: str,
    max_reconnect_count: int = 5,
    debug: bool = False,
) -> ExitCode:
    """Load ``script_path`` (if given) and serve it; returns the exit code."""
    configure_logging(debug)
    label = script_path or "the calling program"
    try:
        if script_path:
            load_script(script_path)
        REGISTRY.require_predict(label)
        REGISTRY.check_sleep(label)
    except (ScriptLoadError, WorkerScriptError) as exc:
        log.error("%s", exc)
        return ExitCode.SCRIPT
    return serve(
        REGISTRY,
        control_socket_path,
        data_socket_path,
        client_id,
        max_reconnect_count=max_reconnect_count,
        script=label,
        attach_hook=_attach_simulated_gpu,
    )


def run(
    script_path: str | None = None,
    control_socket_path: str = "/tmp/verda-io.ctrl.sock",
    data_socket_path: str = "/tmp/verda-io.data.sock",
    client_id: str = "ml-worker-1",
    max_reconnect_count: int = 5,
    debug: bool = False,
) -> None:
    """Start the worker loop (verda-io's ``run``); exits the process non-zero on failure."""
    code = run_worker(
        script_path, control_socket_path, data_socket_path, client_id, max_reconnect_count, debug
    )
    if code != ExitCode.OK:
        raise SystemExit(int(code))
