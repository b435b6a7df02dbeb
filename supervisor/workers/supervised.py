"""What every worker handle shares, whatever protocol its worker speaks: its process group
and its state.

:class:`SupervisedProcess` owns the state changes (along the table of :mod:`.states`; each
told to the handle's observer; the first READY stamps ``ready_at``), the start of the process
(a start that fails is reported as a crash), the end of a stop (the handle's own ``begin_stop`` asks
the worker to exit its way; then SIGTERM, then SIGKILL of the whole process group), the wait
for the process to be gone, and the pids that belong to the worker (itself, its descendants,
and those seen before that may outlive it on the GPU). A descendant that left the worker's
process group (``setsid``) is out of reach of a signal to the group: those seen when the
worker is stopped or killed are killed by pid once it is gone, and so are those that carry
the worker's mark (``WORKER_MARK``, which its children inherit) though they left its tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from supervisor.clock import monotonic

from . import process
from .lifeline import WORKER_MARK, start_ticks, strays
from .states import HOT, INITIAL, WorkerState, check


@dataclass(slots=True)
class SleepOutcome:
    """How a sleep or a wake went, as the worker said it: ``error`` (None when ``ok``), and
    what a sleeping worker says it keeps on the GPU and took in host memory (None: not said).
    """

    ok: bool
    error: str | None = None
    kept_mib: int | None = None
    host_mib: int | None = None

#: Registrations that may wait for a process's pid while it is being started (a worker
#: opens two connections; the rest are decided at once, and refused).
MAX_STARTED_WAITERS = 8


class SupervisedProcess:
    """The process and state side of a worker handle (the base of each handle class)."""

    def __init__(
        self,
        *,
        backend: str,
        name: str,
        gpu: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        log_path: Path,
        observer: Any,  # a WorkerObserver
    ) -> None:
        self.backend = backend
        self.name = name
        self.gpu = gpu
        self.argv = tuple(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.log_path = log_path
        self.observer = observer
        self.state = INITIAL  # changed only by _set_state, along the table of .states
        self.proc: asyncio.subprocess.Process | None = None
        self.pid: int | None = None
        self.features: frozenset[str] = frozenset()
        self.started_at = monotonic()
        self.ready_at: float | None = None
        self.init_error: str | None = None
        self.exit_code: int | None = None
        # (wall time, status) of each status event, stamped by the worker itself when it can.
        self.status_marks: list[tuple[float, str]] = []
        self._exited = asyncio.Event()
        self._stopping = False
        # pid -> the process, which knows its start time: a pid reused by another process
        # is no descendant
        self._descendants: dict[int, psutil.Process] = {}
        self._strangers: set[int] = set()  # pids on a GPU seen not to be ours (see pids)
        self._escaped: dict[int, psutil.Process] = {}  # descendants out of its group
        self._noted = False  # what escaped its group was read (it was stopped or killed)
        self._since = 0  # its start, in clock ticks after boot
        self._reaped = False  # started under the reaper (supervisor/workers/reaper.py)
        self._command_pid: int | None = None  # the reaper's child, once seen
        self._started_waiters: list[Callable[[], None]] = []  # see when_started

    async def _start_process(self, *, pipes: bool = False, reaped: bool = False) -> bool:
        """Start the worker's process (``pipes``: stdin and stdout are the handle's;
        ``reaped``: under :mod:`.reaper`, which adopts what its tree orphans); False,
        reported to the observer as a crash, when it cannot start."""
        try:
            self.proc = await process.spawn(
                self.argv, env=self.env, cwd=self.cwd, log_path=self.log_path, pipes=pipes,
                reaped=reaped,
            )
        except (OSError, ValueError, TypeError) as exc:  # missing binary, NUL in argv/env…
            self._start_failed()
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self.init_error = f"cannot start {self.argv[0]!r}: {why}"
            self._set_state(WorkerState.CRASHED)
            self._exited.set()
            self._started()
            self.observer.worker_exited(self, None, self.init_error)
            return False
        self.pid = self.proc.pid
        self._reaped = reaped
        self._since = start_ticks(self.pid) or 0  # (read now: once it exits, it cannot be)
        self._started()
        return True

    def when_started(self, then: Callable[[], None]) -> bool:
        """While the process is being started (its pid not known yet): ``then`` runs once it
        is (or the start failed), and True; False: nothing to wait for (at most
        ``MAX_STARTED_WAITERS`` wait; any more are decided at once)."""
        if self.pid is not None or self._exited.is_set() or \
                len(self._started_waiters) >= MAX_STARTED_WAITERS:
            return False
        self._started_waiters.append(then)
        return True

    def _started(self) -> None:
        waiters, self._started_waiters = self._started_waiters, []
        for then in waiters:
            then()

    def _start_failed(self) -> None:
        """Undo what the handle set up for a process that never started (before it is
        reported)."""

    def _set_state(self, state: WorkerState) -> None:
        if self.state == state:
            return
        check(self.state, state)
        self.state = state
        if state == WorkerState.READY and self.ready_at is None:
            self.ready_at = monotonic()
        self.observer.worker_state(self)

    @property
    def hot(self) -> bool:
        """READY or BUSY: it can take a request."""
        return self.state in HOT

    @property
    def command_pid(self) -> int | None:
        """The pid of the command its descriptor names: the process started (``pid``), or
        under the reaper, the reaper's child, as the reaper's name says (``pid`` still leads
        the group and is what is signalled); None for the moment before the reaper started
        it, so the pid shown never changes."""
        if not self._reaped or self._command_pid is not None:
            return self._command_pid or self.pid
        if self.pid is not None and not self._exited.is_set():
            self._command_pid = process.reaped_pid(self.pid)
        return self._command_pid

    def begin_stop(self) -> None:
        """Take no more jobs and ask the worker to exit, its own way (``_ask_to_go``), once."""
        if self._stopping or self._exited.is_set():
            return
        self._stopping = True
        self._set_state(WorkerState.STOPPING)
        self._ask_to_go()

    def _ask_to_go(self) -> None:
        """How this kind of worker is asked to exit (a message, a command, a signal)."""
        raise NotImplementedError

    async def sleep(self, level: int, timeout: float) -> SleepOutcome:
        """Ask the (ready, idle) worker to give its memory back and stay alive: it is
        ``asleep`` from now on.  A handle whose worker cannot sleep says so."""
        return SleepOutcome(False, "this worker cannot sleep")

    async def wake(self, timeout: float) -> SleepOutcome:
        """Ask the sleeping worker to take its memory again: ``ready`` once it did."""
        return SleepOutcome(False, "this worker cannot sleep")

    async def stop(self, grace: float = 10.0) -> None:
        """Ask the worker to go, then SIGTERM, then SIGKILL its process group; returns once
        it exited."""
        if self._exited.is_set():
            return
        self._note_escaped()
        self.begin_stop()
        if await self._wait_exit(grace):
            return
        if self.pid is not None:
            process.signal_group(self.pid, signal.SIGTERM)
        if await self._wait_exit(min(grace, 2.0)):
            return
        self.kill()
        await self._wait_exit(5.0)

    def kill(self) -> None:
        """SIGKILL the process group now (an unplanned end: reported as a crash)."""
        if self.pid is not None and not self._exited.is_set():
            self._note_escaped()
            process.signal_group(self.pid, signal.SIGKILL)

    def _note_escaped(self) -> None:
        """Remember the worker's processes that are not in its process group (a signal to
        the group misses them): its descendants, and what carries its mark (``WORKER_MARK``:
        a daemon that forked twice is out of its tree too). :meth:`_gone` kills them."""
        if self.pid is None:
            return
        self._noted = True
        mark = self.env.get(WORKER_MARK)
        for pid in strays({self.pid}, f"{WORKER_MARK}={mark}".encode() if mark else None,
                          self._since):
            with contextlib.suppress(psutil.Error):
                self._escaped.setdefault(pid, psutil.Process(pid))

    def _gone(self) -> None:
        """The worker's process has exited: said to whoever waits, and what escaped its
        group goes too (by pid: the process object knows its start time, so a reused pid is
        never signalled): what was read when it was stopped or killed, else (it crashed, its
        tree gone with it) what carries its mark."""
        self._exited.set()
        if not self._noted and self.pid is not None and \
                start_ticks(self.pid) in (None, self._since):  # (not a reused pid's tree)
            self._note_escaped()
        escaped, self._escaped = self._escaped, {}
        for proc in escaped.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()

    async def wait_exited(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to be gone; True once it is."""
        return await self._wait_exit(timeout)

    async def _wait_exit(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited.wait(), timeout)
        return self._exited.is_set()

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    def accepts_pid(self, pid: int | None) -> bool:
        """Whether ``pid`` is the worker or one of its descendants (remembered once seen)."""
        if pid is None or self.pid is None:
            return False
        if pid == self.pid:
            return True
        known = self._descendants.get(pid)
        if known is not None:
            if known.is_running():  # the same process (its start time says so)
                return True
            del self._descendants[pid]
        try:
            proc = psutil.Process(pid)
            parents = {p.pid for p in proc.parents()}
        except psutil.Error:
            return False
        if self.pid in parents:
            self._descendants[pid] = proc
            return True
        return False

    def known_descendants(self) -> set[int]:
        """The worker's children seen so far (they may outlive it on the GPU)."""
        return set(self._descendants)

    def pids(self, on_gpu: Collection[int]) -> set[int]:
        """The worker's process and those of its descendants among ``on_gpu`` (the pids a
        sample saw on the GPUs): for per-process GPU memory, only those can count.

        Each pid there is looked up once (:meth:`accepts_pid`) and remembered, as ours or
        not, while it stays on a GPU (one that left may come back as another process); no
        scan of every process on the host.
        """
        if self.pid is None or self._exited.is_set():
            return set()
        present = set(on_gpu)
        self._strangers &= present
        for gone in self._descendants.keys() - present:
            del self._descendants[gone]
        found = {self.pid}
        for pid in present - self._strangers:
            if self.accepts_pid(pid):
                found.add(pid)
            else:
                self._strangers.add(pid)
        return found
