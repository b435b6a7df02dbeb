"""``vramtui install-service``: a systemd *user* unit that runs ``vramtui --serve``.

- ``KillMode=mixed``: on stop, systemd sends SIGTERM to the engine alone, which stops its own
  workers gracefully (their stop grace, then their process groups); whatever is left when
  ``TimeoutStopSec`` runs out is killed, so no worker outlives the service.
- ``TimeoutStopSec``: the longest stop grace of the configured backends, plus room for the
  engine's own shutdown — long enough for every unload.
- ``Restart=on-failure``: an engine that dies is started again (its journal requeues jobs).

On a headless box a user's services stop when their last session ends; ``loginctl
enable-linger USER`` keeps them running from boot without anyone logged in.

Before it writes the unit it checks that the unit can start (:func:`unit_problem`): its
``--gpus`` is read as ``--serve`` reads it (without opening NVML), and the HTTP
settings it would run with are read as ``--serve`` reads them, without
``VRAMTUI_HTTP_TOKEN`` (a unit never carries it) — so a non-loopback address needs a token
file that exists and only the user can read — and it refuses with the reason instead of
writing a unit that fails and restarts every five seconds.  ``Documentation=`` names the
README this copy was installed from (left out when there is none).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from supervisor.atomicfile import write_atomic

MIN_STOP_TIMEOUT_S = 60


def stop_timeout(backends: list[str]) -> int:
    """Seconds systemd should wait for a clean stop: the longest stop grace + margins."""
    graces = [10.0]
    try:
        from supervisor.backends.loader import default_layers, load_backends
        from supervisor.paths import Paths

        layers = default_layers(Paths.from_env().config_dir, [Path(b) for b in backends])
        loaded = load_backends(layers, demo_fallback=False)
        graces += [spec.timeouts.stop_grace_s for spec in loaded.backends.values()]
    except Exception:  # noqa: BLE001 - a default timeout is still a good unit
        pass
    return max(MIN_STOP_TIMEOUT_S, int(max(graces)) + 30)


def unit_problem(args: argparse.Namespace) -> str | None:
    """Why the unit ``args`` describe could not start, or None."""
    from supervisor.errors import VramtuiError
    from supervisor.gpu.errors import BadGpuSpec
    from supervisor.gpu.select import check_spec
    from supervisor.http.config import TOKEN_ENV, load_http_config
    from supervisor.paths import Paths

    try:
        check_spec(args.gpus)
    except BadGpuSpec as exc:
        return str(exc)
    environ = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    try:
        load_http_config(listen=args.http, token_file=args.http_token_file,
                         config_file=Paths.from_env().settings_file, environ=environ)
    except VramtuiError as exc:  # (the unit never carries the token's variable: not an answer)
        return str(exc).replace(f"{TOKEN_ENV}, --http-token-file or http.token_file",
                                "--http-token-file or http.token_file")
    return None


def readme() -> Path | None:
    """The README next to the package this runs from (a checkout or an editable install)."""
    import vramtui

    path = Path(vramtui.__file__).resolve().parents[1] / "README.md"
    return path if path.is_file() else None


def render(args: argparse.Namespace) -> str:
    argv = [sys.executable, "-m", "vramtui", "--serve"]
    if args.gpus and args.gpus != "auto":
        argv += ["--gpus", args.gpus]
    for path in args.backends or ():
        argv += ["--backends", os.path.abspath(path)]
    if args.http:
        argv += ["--http", args.http]
    if args.http_token_file:
        argv += ["--http-token-file", os.path.abspath(os.path.expanduser(args.http_token_file))]
    docs = readme()
    doc_line = f"Documentation=file://{docs}\n" if docs is not None else ""
    env_lines = "".join(f"Environment={shlex.quote(f'{k}={v}')}\n"
                        for k, v in sorted(os.environ.items())
                        if k.startswith("VRAMTUI_") and k != "VRAMTUI_HTTP_TOKEN")
    return f"""\
# Written by `vramtui install-service`; rerun it to change the flags.
[Unit]
Description=vramtui engine: many models sharing the GPUs
{doc_line}
[Service]
Type=simple
ExecStart={shlex.join(argv)}
Environment=PYTHONUNBUFFERED=1
{env_lines}# SIGTERM to the engine only: it stops its own workers, each within its stop grace.
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec={stop_timeout(list(args.backends or ()))}
Restart=on-failure
RestartSec=5

[Install]
WantedBy=default.target
"""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default="auto", metavar="SPEC", help="the engine's --gpus")
    p.add_argument("--backends", action="append", default=[], metavar="PATH",
                   help="the engine's --backends (repeatable)")
    p.add_argument("--http", metavar="ADDR", help="the engine's --http")
    p.add_argument("--http-token-file", metavar="FILE", help="the engine's --http-token-file")
    p.add_argument("--print", action="store_true", help="print the unit instead of writing it")
    p.add_argument("--force", action="store_true", help="replace an existing unit")


def run(args: argparse.Namespace) -> int:
    from ..exits import Exit

    problem = unit_problem(args)
    if problem is not None:
        print(f"vramtui install-service: the unit could not start: {problem}; nothing "
              "written", file=sys.stderr)
        return Exit.USAGE
    text = render(args)
    if args.print:
        sys.stdout.write(text)
        return Exit.OK
    from supervisor.paths import service_unit_path

    path = service_unit_path()
    if path.exists() and not args.force:
        old = path.read_text(errors="replace")
        if old == text:
            print(f"{path} is already up to date")
            return Exit.OK
        print(f"vramtui install-service: {path} exists; --force replaces it (or --print to "
              "see the new one)", file=sys.stderr)
        return Exit.REFUSED
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text.encode())
    except OSError as exc:
        print(f"vramtui install-service: cannot write {path}: {exc.strerror or exc}",
              file=sys.stderr)
        return Exit.FAILED
    user = os.environ.get("USER") or "$USER"
    print(f"wrote {path}\n"
          "start it now and at every login:\n"
          "  systemctl --user daemon-reload && systemctl --user enable --now vramtui\n"
          "follow its log:  journalctl --user -u vramtui -f\n"
          "on a headless box, keep it running without a login session (from boot):\n"
          f"  loginctl enable-linger {user}")
    return Exit.OK
