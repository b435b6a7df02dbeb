"""``python -m worker_sdk main.py --control-socket P --data-socket P --name N``: run a worker."""

from __future__ import annotations

import argparse
import os
import sys

from .config import ConfigError, resolve
from .runner import run_worker
from .worker import ExitCode

EPILOG = """\
settings come from, lowest to highest: defaults, the config file (-c or
$VERDA_IO_WORKER_CONFIG; keys script, control-socket, data-socket, name,
max-reconnect-count, debug, environment), $VERDA_IO_WORKER_<KEY> variables, flags.

exit codes:
  0  graceful shutdown (SHUTDOWN from the server, SIGTERM or SIGINT)
  1  the script could not be loaded, or registers no / two @predict functions
  2  bad flags or config file
  3  an @initialize function raised (reported to the server first)
  4  the server could not be reached, or was lost after the reconnect attempts
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m worker_sdk",
        description="Serve a worker script (functions decorated with @worker_sdk.predict, ...) "
        "to a vramtui engine or any verda-io server.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("script", nargs="?", help="the worker script (main.py)")
    parser.add_argument("-c", "--config", help="YAML config file (verda-io keys)")
    parser.add_argument("--control-socket", help="control socket path")
    parser.add_argument("--data-socket", help="data socket path")
    parser.add_argument("--name", help="worker name the server knows it by")
    parser.add_argument(
        "--max-reconnect-count", type=int, help="reconnect attempts before giving up (default 5)"
    )
    parser.add_argument("--debug", action="store_true", default=None, help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cli = {
        "script": args.script,
        "control_socket": args.control_socket,
        "data_socket": args.data_socket,
        "name": args.name,
        "max_reconnect_count": args.max_reconnect_count,
        "debug": args.debug,
    }
    try:
        config = resolve(cli, args.config or os.environ.get("VERDA_IO_WORKER_CONFIG"))
    except ConfigError as exc:
        print(f"worker_sdk: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if not config.script:
        print(
            "worker_sdk: error: no worker script given; pass it as the first argument, as "
            "'script:' in the config file, or in $VERDA_IO_WORKER_SCRIPT",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    os.environ.update(config.environment)
    return int(
        run_worker(
            config.script,
            config.control_socket,
            config.data_socket,
            config.name,
            config.max_reconnect_count,
            config.debug,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
