"""The engine's live record of one backend: its descriptor, its worker, and what is known of it.

A :class:`BackendRuntime` groups what the engine keeps per backend into small records, each
with one concern: how its workers have fared (:class:`Health`), how the live worker behaves
against the figures it was admitted with (:class:`Conduct`), what production measured of it
(:class:`Measures`), how it is used (:class:`Usage`), and where the live worker's sleep stands
(:class:`Slumber`).  The worker pool owns the records;
the engine's parts change them on the engine loop only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import admission
from ..backends.schema import BackendSpec
from ..ledger import Learned
from ..scheduler import model as sched
from ..workers.base import Worker


@dataclass
class Ghost:
    """A stopped worker whose memory is still held until its processes leave the GPU."""

    name: str
    gpu: int
    mib: int
    pids: set[int]
    deadline: float
    observed_mib: int | None = None


MAX_INIT_FAILURES = 3  # starts in a row that never became ready before a backend is failed


@dataclass
class Health:
    """How the backend's workers have fared."""

    init_failures: int = 0  # starts in a row that never became ready
    failed: bool = False  # too many: no new worker until a respawn
    last_error: str | None = None
    kill_reason: str | None = None  # why the engine killed the live worker (its jobs fail so)
    # why the engine no longer puts its workers to sleep (a sleep or a wake that failed, a
    # worker that gave nothing back or lied about what it keeps); None: it may. A respawn, or
    # a reload that changes its sleep settings, forgets it.
    no_sleep: str | None = None
    # MiB others over-committed its GPU by when its loaded worker's jobs were held (None: none)
    held_for_others: int | None = None

    def record_exit(self, name: str, reason: str, init_error: str | None, log_hint: str, *,
                    killed_for: str | None, expected: bool,
                    never_ready: bool) -> tuple[str, str] | None:
        """What a worker's exit says of the backend (its last error, its failed starts in a
        row), and the event-log line to write for it, (level, text), if any."""
        if killed_for is not None:
            self.last_error = killed_for
            return None
        if expected:
            return "info", f"{name} stopped"
        if never_ready:
            self.init_failures += 1
            self.last_error = init_error or reason
            self.failed = self.init_failures >= MAX_INIT_FAILURES
            return "error", (f"{name} failed to start ({self.init_failures}/"
                             f"{MAX_INIT_FAILURES}): {self.last_error}; {log_hint}")
        self.last_error = f"{reason}; {log_hint}"
        return "error", f"{name} crashed: {self.last_error}"


@dataclass
class Conduct:
    """The live worker against the figures it was admitted with."""

    exclusive: bool = False  # it holds a whole GPU (footprint unknown at spawn)
    baseline: sched.BackendInfo | None = None  # the figures it was admitted with
    over_mib: int = 0  # how far it was last seen above its baseline
    over_noted: bool = False
    accepting: bool = True  # it takes new jobs (False: evicted once idle)
    # caught above its figures (past tolerance), holding at most this: once it exits, the
    # backend is distrusted (None: not caught)
    caught_mib: int | None = None

    def reset(self) -> None:
        """A new worker (or none): nothing known of its conduct yet."""
        self.baseline = None
        self.over_mib, self.over_noted, self.accepting = 0, False, True


#: Load and wake times kept per backend (their mean is its reload and wake cost).
TIMES_KEPT = 20


@dataclass
class Measures:
    """What production measured of the backend."""

    learned: Learned = Learned()
    distrusted: bool = False  # caught lying: its descriptor only a floor
    observed_mib: int | None = None  # the live worker's processes at the last sample
    settling: bool = False  # a job ended since that sample: its memory is on its way back
    ended_at: float = 0.0  # when a job of it last ended (the sampler's clock): a sample taken
    # before shows that job's memory, which is on its way back
    observed_peaks: deque[int] = field(default_factory=lambda: deque(maxlen=200))
    load_times: deque[float] = field(default_factory=lambda: deque(maxlen=TIMES_KEPT))
    timed_worker: str | None = None  # the worker whose load time was last recorded
    wake_times: deque[float] = field(default_factory=lambda: deque(maxlen=TIMES_KEPT))
    times_revision: int = 0  # counts each change of the times (``.timings`` writes them)
    old_launch_worker: str | None = None  # started before its launch changed: what it
    # measures is another launch's, forgotten again when it goes
    sleep_residual_mib: int | None = None  # what its last measured sleep kept on the GPU
    sleep_host_mib: int | None = None  # the host memory its last sleep took

    def timed(self, load_s: float | None = None, wake_s: float | None = None) -> None:
        """A load, or a wake, of its worker took that long."""
        if load_s is not None:
            self.load_times.append(load_s)
        if wake_s is not None:
            self.wake_times.append(wake_s)
        self.times_revision += 1

    def restore_times(self, loads: Iterable[float], wakes: Iterable[float]) -> None:
        """Load and wake times a previous engine measured (``.timings``)."""
        self.load_times.extend(loads)
        self.wake_times.extend(wakes)
        self.times_revision += 1

    def forget_times(self, worker: str | None) -> None:
        """Its load and wake times are another launch's (``worker``, if one runs, started
        with it)."""
        self.load_times.clear()
        self.wake_times.clear()
        self.old_launch_worker = worker
        self.times_revision += 1


@dataclass
class Slumber:
    """The live worker's sleep: ``falling`` (its sleep hook runs), ``asleep`` (measured), or
    ``waking`` (its wake hook runs)."""

    phase: str
    since: float  # engine clock, when this phase began
    keeps_mib: int  # counted on its GPU asleep: the backend's figure until measured
    host_mib: int  # host memory counted against the sleepers' budget
    held_mib: int  # what it held when its sleep was asked
    wake_wanted: bool = False  # a job (or a wake) came while it fell asleep


@dataclass
class Usage:
    """How a backend is used: its jobs, and the websockets open through ``/upstream`` to its
    server (*tunnels*). An open tunnel is use: the server is not unloaded by ``keep_alive``
    while one is open, and it looks just used to eviction (its idle time counts from the
    last tunnel's close or message); room for a job may still evict it, which closes them."""

    jobs_served: int = 0
    last_used: float | None = None  # engine clock
    idle_since: float | None = None  # engine clock
    tunnels: int = 0
    unload_after: Worker | None = None  # this worker unloads once idle (keep_alive 0)

    def tunnel_opened(self, now: float) -> None:
        self.tunnels += 1
        self.touched(now)

    def tunnel_closed(self, now: float) -> None:
        self.tunnels = max(0, self.tunnels - 1)
        self.touched(now)

    def touched(self, now: float) -> None:
        """A tunnel carried a message (or opened, or closed): used now. A worker with jobs
        has no idle time to restart."""
        self.last_used = now
        if self.idle_since is not None:
            self.idle_since = now

    def idle_for_eviction(self) -> float | None:
        """When it went idle, as eviction counts it: unknown (so, just now) while a tunnel
        is open."""
        return None if self.tunnels else self.idle_since


@dataclass
class BackendRuntime:
    """The engine's live record of one backend."""

    spec: BackendSpec
    worker: Worker | None = None
    generation: int = 0
    admitted: list[str] = field(default_factory=list)  # jobs holding a slot on the worker
    health: Health = field(default_factory=Health)
    conduct: Conduct = field(default_factory=Conduct)
    measures: Measures = field(default_factory=Measures)
    usage: Usage = field(default_factory=Usage)
    ghosts: list[Ghost] = field(default_factory=list)
    preload_until: float | None = None  # start the worker without a job, until then
    respawn_of: int | None = None  # the generation a respawn under way replaces (None: none)
    slumber: Slumber | None = None  # the live worker's sleep (None: it is not asleep)
    _info: sched.BackendInfo | None = None
    _info_key: tuple[Any, ...] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def reload_cost_s(self) -> float:
        """What a (re)load costs, learned from measured start-to-ready times."""
        return admission.reload_cost_s(self.spec.reload_cost_s, self.measures.load_times)

    @property
    def wake_cost_s(self) -> float:
        """What a wake costs, learned from measured wakes."""
        return self._wake_cost_s(self.reload_cost_s)

    def _wake_cost_s(self, reload_s: float) -> float:
        """:attr:`wake_cost_s`, given :attr:`reload_cost_s` (its prior is a part of it)."""
        return admission.wake_cost_s(self.spec.wake_cost_s, self.measures.wake_times, reload_s)

    def _keep_s(self) -> float | None:
        """Its worker's keep-alive once idle: 0 when asked to unload once idle (Ollama's
        ``keep_alive: 0`` while it worked), pinned too; None while nothing unloads it (no
        worker, a tunnel open, pinned, kept for ever)."""
        w = self.worker
        asked = w is not None and w is self.usage.unload_after
        keep = 0.0 if asked else self.spec.keep_alive_s
        if (w is None or self.usage.tunnels or (self.spec.pinned and not asked)
                or not math.isfinite(keep)):
            return None
        return keep

    def keep_alive_left_s(self, now: float) -> float | None:
        """Seconds until ``keep_alive`` unloads its idle worker (0: due); None while it has no
        worker, runs jobs, has a tunnel open, is pinned or is kept for ever."""
        keep, idle = self._keep_s(), self.usage.idle_since
        if keep is None or idle is None or self.admitted:
            return None
        return max(0.0, keep - (now - idle))

    def leaves_in_s(self, now: float) -> float | None:
        """Seconds until ``keep_alive`` may unload its worker, at the soonest: an idle one's
        ``keep_alive_left_s``; a busy one's whole keep-alive (it counts from its jobs' end);
        None while nothing unloads it."""
        left = self.keep_alive_left_s(now)
        return left if left is not None else self._keep_s()

    @property
    def can_sleep(self) -> bool:
        """Its live worker may be put to sleep: it offered the capability, its descriptor
        allows it, it has not failed a sleep, and it does not hold its GPU whole."""
        w = self.worker
        return (w is not None and "sleep" in w.features and self.spec.sleep.enabled
                and self.health.no_sleep is None and not self.conduct.exclusive
                and not self.spec.pinned)

    def info(self) -> sched.BackendInfo:
        """What admission knows of this backend (rebuilt only when its figures move)."""
        m = self.measures
        reload_s = self.reload_cost_s  # (read once: the wake's prior is a part of it)
        reload = round(reload_s, 2)
        wake = round(self._wake_cost_s(reload_s), 2)
        # The spec itself, compared by identity: a replaced spec's id may be reused by the next.
        key = (self.spec, m.learned, m.distrusted, reload, wake, m.sleep_residual_mib,
               m.sleep_host_mib)
        if self._info is None or self._info_key is None or self._info_key[0] is not key[0] \
                or self._info_key[1:] != key[1:]:
            self._info = admission.backend_info(
                self.spec, m.learned, reload, distrusted=m.distrusted, wake_s=wake,
                sleep_mib=(m.sleep_residual_mib, m.sleep_host_mib))
            self._info_key = key
        return self._info

    @property
    def peak(self) -> int | None:
        """The peak admission uses (declared, calibrated or learned; None: unknown)."""
        return self.info().peak_mib

    def new_worker(self) -> None:
        """A worker is about to start: nothing is known of its conduct, and it is admitted at
        the backend's figures now, or holds its GPU whole while its footprint is unknown."""
        c = self.conduct
        c.reset()
        c.exclusive = self.peak is None
        c.baseline = None if c.exclusive else self.info()
        self.health.kill_reason = None
        self.health.held_for_others = None
        self.measures.observed_mib = None
        self.slumber = None

    @property
    def state(self) -> str:
        """Its state as views show it: its worker's, else ``failed`` or ``cold``."""
        w = self.worker
        return w.state.value if w is not None else ("failed" if self.health.failed else "cold")
