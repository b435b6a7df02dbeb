"""A calibration run without the engine, on a private simulated GPU (tests, model authors).

``run_with_wire_server`` is the reference runner: it starts a ``WireServer`` and a private
``SimulatedProbe`` in a temporary directory, spawns ``python -m worker_sdk <script>``, samples
the worker's process tree at 20 Hz with the engine's ``Sampler``, marks the phases from the
worker's own status events exactly as ``record`` describes, and returns the
``CalibrationRecord`` for ``analysis.analyze``.  Only simulated memory is measured here (the
worker declares it through ``worker_sdk.sim``); a real GPU is calibrated by the engine.

    record = run_with_wire_server("examples/calibration/steady.py", {"SIM_WEIGHTS_MIB": "2048"})
    print(analyze(record).summary())

The runner waits on events and replies, never on a polling sleep; the only timed waits are
the settle windows (the measurement itself) and the time-outs.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

import worker_sdk
from supervisor.clock import monotonic
from supervisor.gpu.sampler import FAST_HZ, Sample, Sampler
from supervisor.gpu.sim import DEFAULT_CONTEXT_MIB, SimulatedProbe
from worker_sdk.connection import ConnectionLost
from worker_sdk.events import Status
from worker_sdk.protocol import KNOWN_FEATURES, ProtocolError
from worker_sdk.testing import WireServer, WorkerLink
from worker_sdk.worker import ExitCode

from .record import (
    ASLEEP,
    END,
    EXITED,
    INITIALIZE,
    SETTLE_LOAD,
    SHUTDOWN,
    SLEEP,
    START,
    WAKE,
    WOKEN,
    CalibrationRecord,
    CalSample,
    PhaseMark,
    predict_phase,
    settle_phase,
)

GPU = 0
_GONE = object()  # put in a link's event queue when the worker process has exited
_LOG_TAIL_LINES = 6
_GRACE_S = 1.0  # after the worker exited: for its last messages to be read


class _Stop(Exception):
    """The run ends early with ``outcome`` and ``error``."""

    def __init__(self, outcome: str, error: str | None) -> None:
        super().__init__(error)
        self.outcome = outcome
        self.error = error


class _Run:
    """The state of one run: its clock, marks, samples, worker process and link."""

    def __init__(self, proc: subprocess.Popen[bytes], t0: float) -> None:
        self.t0 = t0
        self.proc = proc
        self.root_pid = root_pid = proc.pid
        self.marks: list[PhaseMark] = []
        self.samples: list[CalSample] = []
        self.exited = threading.Event()
        self.link: WorkerLink | None = None
        self._tree: dict[int, bool] = {root_pid: True}

    def mark(self, phase: str) -> None:
        self.marks.append(PhaseMark(monotonic() - self.t0, phase))

    def ours(self, pid: int) -> bool:
        """``pid`` is the worker or one of its descendants (remembered per pid)."""
        known = self._tree.get(pid)
        if known is None:
            try:
                known = any(p.pid == self.root_pid for p in psutil.Process(pid).parents())
            except psutil.Error:
                known = False
            self._tree[pid] = known
        return known

    def on_sample(self, sample: Sample) -> None:  # on the sampler thread
        if sample.processes is None:
            return
        procs = {
            p.pid: p.used_mib
            for p in sample.processes
            if p.gpu_index == GPU and p.used_mib is not None and self.ours(p.pid)
        }
        device = next((d.used_mib for d in sample.devices if d.index == GPU), None)
        self.samples.append(CalSample(sample.t - self.t0, procs, device, sample.read_s))

    def watch(self) -> None:  # on the watcher thread
        self.proc.wait()
        self.exited.set()
        link = self.link
        if link is not None:
            link.events.put(_GONE)  # type: ignore[arg-type]


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-_LOG_TAIL_LINES:])


def _worker_env(probe: SimulatedProbe, name: str, env: Mapping[str, str] | None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    sdk_root = str(Path(worker_sdk.__file__).resolve().parents[1])
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [sdk_root, out.get("PYTHONPATH")]))
    out.update(probe.env)
    out["VRAMTUI_SIM_GPU"] = str(GPU)
    out["VRAMTUI_BACKEND"] = name
    out.update(env or {})
    return out


def _exit_stop(run: _Run, before: str) -> _Stop:
    """How a worker that exited before ``before`` ended, from its exit code.

    (Its own report may be lost: a worker that dies at once can close its control socket
    before the server has even registered its data socket.)
    """
    code = run.proc.returncode
    if code == ExitCode.INIT_FAILED:
        return _Stop("failed", "initialize failed")
    if code in (ExitCode.SCRIPT, ExitCode.USAGE):
        return _Stop("failed", f"the worker could not start (exit code {code})")
    return _Stop("crashed", f"the worker exited (code {code}) before {before}")


def _register(server: WireServer, run: _Run, name: str, deadline: float) -> WorkerLink:
    """The worker's link once both sockets registered (or ``_Stop`` if it died or hung)."""
    while True:
        remaining = deadline - monotonic()
        gone = run.exited.is_set()  # (it may still have registered: one last look below)
        if remaining <= 0 and not gone:
            raise _Stop("failed", "the worker did not connect in time")
        try:  # short slices: a dead worker must not cost the whole start time-out
            link = server.wait_worker(name, timeout=_GRACE_S if gone else min(0.25, remaining),
                                      ready=False)
        except TimeoutError:
            if gone:
                raise _exit_stop(run, "connecting") from None
            continue
        run.link = link
        if run.exited.is_set():
            link.events.put(_GONE)  # type: ignore[arg-type]
        return link


def _await_status(run: _Run, link: WorkerLink, wanted: str, deadline: float) -> None:
    """Wait for the worker's status event ``wanted``; ``_Stop`` on failure, exit or time-out."""
    gone = False
    while True:
        remaining = deadline - monotonic()
        if remaining <= 0 and not gone:
            raise _Stop("failed", f"no '{wanted}' status from the worker in time")
        try:
            message: Any = link.events.get_nowait() if gone else link.events.get(timeout=remaining)
        except queue.Empty:
            if gone:
                raise _exit_stop(run, f"saying '{wanted}'") from None
            continue
        if message is _GONE:
            # The exit can be seen before the worker's last messages are read: let the control
            # reader reach the end of the stream, then look through what is left.
            gone = True
            link.closed.wait(_GRACE_S)
            continue
        if not isinstance(message, Status):
            continue
        if message.status == "failed":
            raise _Stop("failed", f"initialize failed: {message.error}")
        if message.status == wanted:
            return


def _phases(
    run: _Run,
    server: WireServer,
    name: str,
    repeats: int,
    request: bytes,
    settle_s: float,
    pause: threading.Event,
    timeouts: tuple[float, float, float],
) -> None:
    """Walk the worker through its phases, marking each; raises ``_Stop`` to end early."""
    start_timeout, request_timeout, stop_timeout = timeouts
    deadline = monotonic() + start_timeout
    link = _register(server, run, name, deadline)
    _await_status(run, link, "initializing", deadline)
    run.mark(INITIALIZE)
    _await_status(run, link, "ready", deadline)
    run.mark(SETTLE_LOAD)
    if pause.wait(settle_s):
        raise _Stop("cancelled", "cancelled")
    for i in range(1, repeats + 1):
        run.mark(predict_phase(i))
        try:
            reply = link.request(request, timeout=request_timeout)
        except (ConnectionLost, OSError, TimeoutError) as exc:
            if run.exited.wait(1.0):
                raise _Stop("crashed", f"the worker died during request {i}") from None
            raise _Stop("failed", f"request {i}: {exc}") from None
        except ProtocolError as exc:
            raise _Stop("failed", f"request {i}: the worker broke the protocol: {exc}") from None
        run.mark(settle_phase(i))
        if reply.kind == "error":
            raise _Stop("failed", f"request {i} failed: {(reply.error or {}).get('error')}")
        if pause.wait(settle_s):
            raise _Stop("cancelled", "cancelled")
    if "sleep" in link.features:
        _sleep_and_wake(run, link, settle_s, pause, start_timeout)
    run.mark(SHUTDOWN)
    link.shutdown()
    if not run.exited.wait(stop_timeout):
        raise _Stop("failed", f"the worker did not exit within {stop_timeout:g} s of SHUTDOWN")
    run.mark(EXITED)
    if pause.wait(settle_s):
        raise _Stop("cancelled", "cancelled")


def _sleep_and_wake(run: _Run, link: WorkerLink, settle_s: float, pause: threading.Event,
                    timeout: float) -> None:
    """A worker that can sleep: mark its sleep and its wake (a failed one ends them early)."""
    run.mark(SLEEP)
    try:
        if link.sleep(timeout=timeout).status != "asleep":
            return
        run.mark(ASLEEP)
        if pause.wait(settle_s):
            raise _Stop("cancelled", "cancelled")
        run.mark(WAKE)
        if link.wake(timeout=timeout).status != "awake":
            return
    except (ConnectionLost, OSError, TimeoutError, ProtocolError):
        return  # (a worker that died is seen at its shutdown)
    run.mark(WOKEN)
    if pause.wait(settle_s):
        raise _Stop("cancelled", "cancelled")


def run_with_wire_server(
    script: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    repeats: int = 3,
    request: bytes = b"",
    settle_s: float = 1.0,
    *,
    backend: str | None = None,
    gpu_spec: str = "sim:24GiB",
    context_mib: int = DEFAULT_CONTEXT_MIB,
    start_timeout_s: float = 60.0,
    request_timeout_s: float = 120.0,
    stop_timeout_s: float = 15.0,
    python: str = sys.executable,
    cancel: threading.Event | None = None,
) -> CalibrationRecord:
    """Calibrate worker ``script`` on a private simulated GPU and return the record.

    ``env`` is added to the worker's environment (e.g. the sizes a simulated model reads);
    ``request`` is sent ``repeats`` times; ``settle_s`` is each settle window.  Setting
    ``cancel`` ends the run at the next phase with outcome ``cancelled``.  A worker that fails
    or dies gives a record with outcome ``failed``/``crashed`` and the end of its log in
    ``error``; the worker never outlives the call.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    script_path = Path(script).resolve()
    name = backend or script_path.stem.replace("_", "-")
    pause = cancel if cancel is not None else threading.Event()
    # AF_UNIX socket paths must stay short: under /tmp, not a long $TMPDIR.
    short = "/tmp" if os.path.isdir("/tmp") else None
    with tempfile.TemporaryDirectory(prefix="vtcal-", dir=short) as tmp:
        directory = Path(tmp)
        probe = SimulatedProbe(gpu_spec, directory / "ledger", context_mib)
        server = WireServer(directory, features=KNOWN_FEATURES).start()
        log_path = directory / "worker.log"
        wall0 = time.time()
        t0 = monotonic()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [python, "-m", "worker_sdk", str(script_path),
                 "--control-socket", server.control_path, "--data-socket", server.data_path,
                 "--name", name],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=_worker_env(probe, name, env), cwd=str(script_path.parent),
            )
        run = _Run(proc, t0)
        run.marks.append(PhaseMark(0.0, START))
        sampler = Sampler(probe, run.on_sample)
        sampler.set_fast(True)
        sampler.start()
        threading.Thread(target=run.watch, name="vtcal-watch", daemon=True).start()
        outcome, error = "completed", None
        try:
            _phases(run, server, name, repeats, request, settle_s, pause,
                    (start_timeout_s, request_timeout_s, stop_timeout_s))
        except _Stop as stop:
            outcome, error = stop.outcome, stop.error
            tail = _log_tail(log_path)
            if outcome in ("crashed", "failed") and tail:
                error = f"{error} (worker log: {tail})"
        finally:
            sampler.stop()
            run.mark(END)
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            server.close()
            probe.close()
    return CalibrationRecord(
        backend=name,
        gpu=GPU,
        source=probe.source,
        per_process=True,
        sample_hz=FAST_HZ,
        repeats=repeats,
        request=request,
        started_wall=wall0,
        samples=tuple(run.samples),
        marks=tuple(run.marks),
        device_total_mib=probe.sizes_mib[GPU],
        outcome=outcome,
        error=error,
    )
