"""``python -m worker_sdk.dynamo main.py --endpoint NS.COMPONENT.ENDPOINT``: serve on Dynamo."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from ..registry import REGISTRY, WorkerScriptError
from ..runner import ScriptLoadError, load_script
from ..worker import ExitCode, configure_logging
from . import DynamoFailed, DynamoMissing, DynamoWorkerConfig, apply_discovery_dir, import_dynamo
from .shapes import KINDS
from .worker import stop_on_signal

log = logging.getLogger("worker_sdk.dynamo")

EPILOG = """\
request and response shapes per --type: pydoc worker_sdk.dynamo.shapes.  Discovery and
transport come from Dynamo's environment (DYN_DISCOVERY_BACKEND, ETCD_ENDPOINTS,
DYN_REQUEST_PLANE, DYN_TCP_RPC_HOST, ...); --discovery-dir DIR means file discovery in DIR
with the TCP request plane: no etcd, no NATS.  Dynamo's own log level is DYN_LOG (default
here: warn; info with --debug).  With DYN_SYSTEM_PORT set (below 32768: Dynamo 1.6.1 reads
it as an i16), GET /engine/hardware_health on that port runs @hardware_health.

exit codes:
  0  graceful shutdown (SIGTERM or SIGINT)
  1  the script could not be loaded, or registers no / two @predict functions
  2  bad flags, or NVIDIA Dynamo is not installed
  3  an @initialize function raised
  4  Dynamo failed (discovery unreachable, registration or serving failed)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker_sdk.dynamo",
        description="Serve a worker script (functions decorated with @worker_sdk.predict, ...) "
        "as an NVIDIA Dynamo endpoint.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("script", help="the worker script (main.py)")
    parser.add_argument(
        "--endpoint", required=True, metavar="NS.COMPONENT.ENDPOINT", help="where to serve"
    )
    parser.add_argument(
        "--type",
        choices=KINDS,
        default="raw",
        help="request/response shapes: raw bytes (default), or the OpenAI-style image, video "
        "or embedding shapes of a Dynamo frontend (then the model is registered)",
    )
    parser.add_argument(
        "--model-name",
        help="name a frontend serves it as (default: --model-path, else the component)",
    )
    parser.add_argument("--model-path", help="model path or id recorded in the model card")
    parser.add_argument(
        "--discovery-dir", metavar="DIR", help="file discovery in DIR and the TCP request plane"
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="predict threads (default 1: one at a time)"
    )
    parser.add_argument(
        "--progress", action="store_true", help="raw, video: stream ctx.progress() calls as items"
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="on SIGTERM, wait S seconds for requests in flight, then cancel them (default 30)",
    )
    parser.add_argument("--debug", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = DynamoWorkerConfig(
            args.type,
            args.model_path,
            endpoint=args.endpoint,
            model_name=args.model_name,
            concurrency=args.concurrency,
            progress=args.progress,
            drain_timeout=args.drain_timeout,
        )
    except ValueError as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    os.environ.setdefault("DYN_LOG", "info" if args.debug else "warn")
    try:
        import_dynamo()  # before loading the script, which may take long (torch, weights)
    except DynamoMissing as exc:
        print(exc, file=sys.stderr)
        return ExitCode.USAGE
    if args.discovery_dir:
        apply_discovery_dir(args.discovery_dir)
    configure_logging(args.debug)
    try:
        load_script(args.script)
        REGISTRY.require_predict(args.script)
    except (ScriptLoadError, WorkerScriptError) as exc:
        log.error("%s", exc)
        return ExitCode.SCRIPT
    if os.environ.get("VRAMTUI_SIM_DIR"):  # as python -m worker_sdk does (runner.py)
        from .. import sim

        sim.attach()
    from .server import FunctionWorker, InitializeFailed
    from .worker import run_worker

    worker = FunctionWorker(REGISTRY, config, script=args.script)
    try:
        with stop_on_signal(worker):
            worker.setup()
    except InitializeFailed as exc:
        log.error("initialize failed: %s", exc)
        return ExitCode.INIT_FAILED
    try:
        run_worker(worker, setup=False)
    except DynamoFailed as exc:
        log.error("%s", exc)
        return ExitCode.SERVER_LOST
    return ExitCode.OK


def _exit(code: int) -> None:
    """Exit with ``code``; without joining a predict thread stuck past the drain timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    for thread in threading.enumerate():
        if thread.name.startswith("worker-predict"):
            thread.join(timeout=0.5)  # an idle one exits at once: its pool was shut down
    if any(t.name.startswith("worker-predict") and t.is_alive() for t in threading.enumerate()):
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
