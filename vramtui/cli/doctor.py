"""``vramtui doctor``: check what vramtui needs and say what to fix.

NVML and the driver, the runtime directory (owner, permissions, socket path length), a running
engine, the state directory and the journal, and every backend: its descriptor, its command,
its interpreter (venv) and whether that interpreter can import ``worker_sdk``.  Works without
an engine.  Exit 0 when nothing failed (warnings allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.paths import Paths, PathsError

from ..exits import Exit

if TYPE_CHECKING:
    from supervisor.backends.errors import DescriptorError

OK, WARN, FAIL = "ok", "warn", "fail"
_MARK = {OK: "[green]✓[/]", WARN: "[yellow]![/]", FAIL: "[bold red]✗[/]"}


@dataclass
class Report:
    checks: list[dict[str, str]] = field(default_factory=list)
    # The descriptor files the running engine's backends come from (None: no engine), so
    # that the backends checked are the engine's even when it was given other --backends.
    engine_files: list[Path] | None = None

    def add(self, status: str, what: str, detail: str, fix: str = "") -> None:
        self.checks.append({"status": status, "check": what, "detail": detail, "fix": fix})

    @property
    def failed(self) -> bool:
        return any(c["status"] == FAIL for c in self.checks)


def check_nvml(r: Report) -> None:
    try:
        from supervisor.gpu.errors import GpuUnavailable
        from supervisor.gpu.nvml import NvmlProbe
    except ImportError as exc:
        r.add(FAIL, "NVML", f"cannot import the NVML bindings: {exc}",
              "pip install nvidia-ml-py in vramtui's environment")
        return
    try:
        probe = NvmlProbe()
    except GpuUnavailable as exc:
        reason = str(exc).removeprefix("NVML: ")
        r.add(WARN, "NVML", f"{reason}; the engine will use a SIMULATED GPU",
              "install the NVIDIA driver (nvidia-smi should work), or use --gpus sim:24GiB "
              "on purpose, or --gpus host for models on the CPU")
        return
    try:
        devices = probe.devices()
        names = ", ".join(f"GPU{d.index} {d.name} {d.total_mib} MiB" for d in devices)
        r.add(OK if devices else WARN, "NVML", f"{probe.device_count} device(s): {names}"
              if devices else "NVML works but reports no GPU",
              "" if devices else "check that the GPU is visible (nvidia-smi)")
        r.add(OK if probe.driver_version else WARN, "driver",
              f"version {probe.driver_version}" if probe.driver_version else "unknown version")
    finally:
        probe.close()


def check_runtime(r: Report, paths: Paths) -> None:
    rd = paths.runtime_dir
    try:
        paths.check_socket_paths()
    except PathsError as exc:
        r.add(FAIL, "socket paths", str(exc), "set VRAMTUI_RUNTIME_DIR to a shorter directory")
    try:
        st = os.lstat(rd)
    except FileNotFoundError:
        r.add(OK, "runtime directory", f"{rd} does not exist yet (created 0700 on start)")
        return
    except OSError as exc:
        r.add(FAIL, "runtime directory", f"cannot inspect {rd}: {exc.strerror}",
              "set VRAMTUI_RUNTIME_DIR to a directory of your own")
        return
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        r.add(FAIL, "runtime directory", f"{rd} is a symbolic link (to {os.readlink(rd)})",
              "remove it, or set VRAMTUI_RUNTIME_DIR to a directory of your own")
    elif st.st_uid != os.geteuid():
        r.add(FAIL, "runtime directory", f"{rd} belongs to uid {st.st_uid}, not to you",
              f"remove it, or set VRAMTUI_RUNTIME_DIR (e.g. /tmp/vramtui-{os.getuid()})")
    elif mode & 0o007 or mode & 0o060:
        r.add(FAIL, "runtime directory", f"{rd} is mode {mode:04o}: others can reach sockets",
              f"chmod 700 {rd}")
    elif mode & 0o010:
        r.add(OK, "runtime directory", f"{rd} mode {mode:04o} (group may reach the socket: "
              "--allow-group)")
    else:
        r.add(OK, "runtime directory", f"{rd} mode {mode:04o}, yours")


def check_engine(r: Report, paths: Paths, socket_path: Path) -> int | None:
    """The running engine, checked over its socket; its pid (None: none runs)."""
    from supervisor.control.errors import UntrustedEngine
    from supervisor.errors import VramtuiError

    from ..connect import attach, lock_holder

    try:
        client = attach(socket_path, wait_starting=0)
    except UntrustedEngine as exc:  # a socket someone else controls: say so, never "none"
        r.add(FAIL, "engine", str(exc), "see the message")
        return None
    except VramtuiError as exc:
        holder = lock_holder(paths)
        if holder is not None:
            r.add(FAIL, "engine", f"pid {holder} holds {paths.lock_path} but its socket does "
                  f"not answer: {exc}", f"stop it (kill {holder}) and start again")
            return holder
        r.add(OK, "engine", "none running (start one with `vramtui --serve`, or `vramtui`)")
        return None
    try:
        rtt = client.ping()
        info = client.info
        pid = info.get("pid")
        r.add(OK, "engine", f"pid {pid} ({info.get('mode')}) answers on "
              f"{socket_path} in {rtt * 1000:.2f} ms")
        smode = stat.S_IMODE(os.stat(socket_path).st_mode)
        r.add(OK if smode & 0o007 == 0 else FAIL, "control socket", f"mode {smode:04o}",
              "" if smode & 0o007 == 0 else f"chmod 600 {socket_path}")
        snap = client.snapshot(light=True, data_limit=0)
        from ..output import devices_kind

        kind = devices_kind(snap)
        r.add(OK, "engine state", f"{kind}: {len(snap.gpus)} device(s), {len(snap.backends)} "
              f"backend(s), {len(snap.running)} job(s) running, {len(snap.queued)} queued"
              + (", stopping" if snap.stopping else ""))
        r.engine_files = list(dict.fromkeys(
            Path(f) for b in snap.backends for f in b.source.split(" + ") if f))
        for problem in snap.descriptor_errors:
            r.add(FAIL, "engine descriptor", problem,
                  "fix the file at the line shown, then `vramtui reload`")
        failed = [b.name for b in snap.backends if b.state == "failed"]
        if failed:
            r.add(FAIL, "engine backends", f"failed to start: {', '.join(failed)}",
                  "see `vramtui logs NAME`, fix it, then `vramtui respawn NAME`")
        return int(pid) if isinstance(pid, int) or str(pid).isdigit() else -1
    finally:
        client.close()


def check_state(r: Report, paths: Paths, engine_pid: int | None = None) -> None:
    sd = paths.state_dir
    if sd.exists() and not os.access(sd, os.W_OK | os.X_OK):
        r.add(FAIL, "state directory", f"{sd} is not writable",
              "fix its permissions, or set VRAMTUI_STATE_DIR")
    else:
        r.add(OK, "state directory", f"{sd}" + ("" if sd.exists() else " (created on start)"))
    journal = paths.journal_path
    if not journal.exists():
        r.add(OK, "journal", f"{journal} not created yet")
        return
    if engine_pid is not None:
        # The engine holds it (SQLite locks it): never open it under a running engine.
        who = f"engine pid {engine_pid}" if engine_pid > 0 else "the running engine"
        r.add(OK, "journal", f"{journal}: in use by {who} (checked through the engine "
              "instead)")
        return
    try:
        con = sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=2)
        try:
            result = con.execute("PRAGMA quick_check").fetchone()
        finally:
            con.close()
    except sqlite3.Error as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            r.add(WARN, "journal", f"{journal}: in use by another process ({exc})",
                  "is an engine starting or stopping? run doctor again in a moment")
            return
        r.add(FAIL, "journal", f"{journal}: {exc}",
              "the engine moves a damaged journal aside (to <journal>.corrupt-<time>, never "
              "deleted) when it starts and says so; start it twice")
        return
    ok = result is not None and result[0] == "ok"
    r.add(OK if ok else FAIL, "journal", f"{journal}: {'intact' if ok else result}",
          "" if ok else "the engine moves a damaged journal aside (never deleted) when it "
          "starts and says so; start it twice")


def check_backends(r: Report, paths: Paths, extra: list[str]) -> None:
    from supervisor.backends.loader import (
        default_layers,
        demo_backends_dir,
        load_backends,
        named_layers,
    )

    given = [Path(b) for b in extra]
    layers = default_layers(paths.config_dir, given)
    if r.engine_files:  # the engine's own --backends too, which this command was not given
        skip = [Path(os.path.abspath(d)) for d in layers]
        skip += [demo] if (demo := demo_backends_dir()) else []
        more = [f for f in r.engine_files if not any(f == d or d in f.parents for d in skip)]
        given += more
        layers = default_layers(paths.config_dir, given)
    loaded = load_backends(layers, demo_fallback=not named_layers(given))
    told = [c["detail"] for c in r.checks if c["check"] == "engine descriptor"]
    for problem in loaded.errors:
        if not _told_by_engine(problem, told):
            r.add(FAIL, "descriptor", str(problem), "fix the file at the line shown")
    for warning in loaded.warnings:
        r.add(WARN, "descriptor", str(warning), "see the README's 'Coming from vramd' or "
              "'Coming from llama-swap'")
    if loaded.demo:
        r.add(WARN, "backends", "none configured: the simulated demo backends are used",
              f"add descriptors to {paths.backends_dir}")
    elif not loaded.backends and not loaded.errors:
        r.add(WARN, "backends", "none: the descriptor files define no backend",
              "add one (see the README's 'Describing a backend'), then run `vramtui reload`")
    checked: dict[str, str | None] = {}
    for name, spec in sorted(loaded.backends.items()):
        if not spec.command:
            r.add(FAIL, f"backend {name}", "no command", "give 'command' or 'script'")
            continue
        exe = spec.command[0]
        found = exe if os.sep in exe else shutil.which(exe)
        if found is None or not os.access(found, os.X_OK):
            r.add(FAIL, f"backend {name}", f"cannot run {exe!r} (not found or not executable)",
                  "fix 'command' or 'python' (the venv's bin/python) in its descriptor")
            continue
        if not Path(spec.cwd).is_dir():
            r.add(FAIL, f"backend {name}", f"working directory {spec.cwd} does not exist",
                  "fix 'cwd'")
            continue
        if "python" in Path(found).name and "worker_sdk" in spec.command:
            if found not in checked:
                checked[found] = _python_problem(found, spec.env)
            problem = checked[found]
            if problem:
                r.add(FAIL, f"backend {name}", f"{found}: {problem}",
                      f"install vramtui's worker_sdk into that venv ({found} -m pip install "
                      "vramtui)")
                continue
        r.add(OK, f"backend {name}", " ".join(spec.command)[:100])


def _told_by_engine(problem: DescriptorError, told: list[str]) -> bool:
    """Whether the running engine already reported ``problem`` (its path may be written
    relative to the engine's own working directory, so the file is matched by its name)."""
    from supervisor.backends.errors import display_path

    if problem.file is None:
        return str(problem) in told
    mine = str(problem)
    where = display_path(problem.file)
    rest = mine[len(where):]  # ":LINE: backend ...: message"
    tail = problem.file.name + rest
    return any(line in (mine, tail) or line.endswith("/" + tail) for line in told)


def _python_problem(python: str, env: dict[str, str]) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import worker_sdk"], capture_output=True,
                              text=True, timeout=30, env={**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run it: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["failed"])[-1]
        return f"cannot import worker_sdk: {last}"
    return None


def run(args: argparse.Namespace) -> int:
    from ..connect import control_socket

    paths = Paths.from_env()
    report = Report()
    check_nvml(report)
    check_runtime(report, paths)
    engine_pid = check_engine(report, paths, control_socket(args))
    check_state(report, paths, engine_pid)
    check_backends(report, paths, list(getattr(args, "backends", None) or []))
    if args.json:
        from ..output import print_json

        print_json({"ok": not report.failed, "checks": report.checks})
    else:
        from rich.markup import escape

        from ..output import out

        for c in report.checks:
            line = f"{_MARK[c['status']]} {escape(c['check'])}: {escape(c['detail'])}"
            out.print(line, markup=True, highlight=False)
            if c["fix"] and c["status"] != OK:
                out.print(f"    fix: {c['fix']}", markup=False)
        out.print("all good" if not report.failed else "[bold red]problems found[/]")
    return Exit.JOB_FAILED if report.failed else Exit.OK
