"""The sleep tier: putting idle workers to sleep and waking them, measured, or stopping them.

:class:`Sleeper` owns each live worker's sleep (its :class:`~.runtime.Slumber`): the planner
chose to put a worker to sleep rather than stop it (``Evict.sleep``), or a user asked; a job
(or a wake asked) for a sleeping worker wakes it.  Nothing is taken on the worker's word:

- after its sleep hook returned, what it keeps is *measured* (the GPU reader's reading of its
  processes): that is what the ledger counts it at from then on, never zero, and what
  admission learns for its next sleep; the host memory its weights took (what it says, never
  less than its processes' anonymous memory grew) is counted against
  ``EngineConfig.sleep_host_budget_mib``, and a sleep that took more than the budget left is
  stopped;
- a sleep that gave (almost) nothing back, a worker that says it keeps less than the GPU shows,
  one that takes its memory back while asleep, a sleep or a wake that fails or does not answer
  within ``timeouts.start``: the worker is stopped instead, an event says why, and the backend
  is not put to sleep again until it is respawned (its jobs waiting for the wake go back to
  the queue, for a fresh worker);
- a wake's time is measured from the ask to the answer: wakes teach admission what waking
  costs (against a reload) and are told in an event and in ``/metrics``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..errors import NothingToDo, Refused
from ..gpu.procmem import tree_anon_mib
from ..jobs import Job, JobState
from ..jobs.table import JobTable
from ..ledger import Book
from ..scheduler.evict import MIN_SLEEP_GAIN_MIB, sleep_gain_enough
from ..workers.base import Worker
from ..workers.states import WorkerState
from .loop import EngineLoop
from .monitor import Monitor
from .notes import Notes
from .pool import WorkerPool
from .runtime import BackendRuntime, Slumber
from .watch import MIN_OVERUSE_TOLERANCE_MIB

#: How far what a sleeping worker holds may exceed what it said it keeps (the CUDA context
#: is outside what frameworks count), or what it kept when it slept.
KEEP_TOLERANCE_MIB = 1024
MEASURE_TRIES = 3  # the GPU's reading may lag a release: measure again after a moment
MEASURE_PAUSE_S = 0.5


class Sleeper:
    """See the module doc; it stops workers through the pool, tells through the notes."""

    def __init__(self, pool: WorkerPool, jobs: JobTable, monitor: Monitor, notes: Notes,
                 loop: EngineLoop, clock: Callable[[], float],
                 requeue: Callable[[Job, str], None], budget_mib: int) -> None:
        self.pool = pool
        self.jobs = jobs
        self.monitor = monitor
        self.notes = notes
        self.loop = loop
        self.clock = clock
        self.requeue = requeue
        self.budget_mib = budget_mib

    # -- what admission reads -------------------------------------------------------------------
    def host_held_mib(self) -> int:
        """The host memory that the sleeping (and falling asleep, and waking) workers take."""
        return sum(rt.slumber.host_mib for rt in self.pool.runtimes()
                   if rt.slumber is not None and rt.worker is not None
                   and not rt.worker.exited)

    def host_room_mib(self) -> int:
        """What sleepers may still take of the host budget."""
        return self.budget_mib - self.host_held_mib()

    # -- asked through a door -------------------------------------------------------------------
    def sleep_asked(self, backend: str) -> None:
        """Put ``backend``'s idle worker to sleep now, or say why not (Refused; NothingToDo
        when it is not loaded). Asleep already, it stays so (asking twice is no error)."""
        rt = self.pool.runtime(backend)
        w = rt.worker
        if w is None or w.exited:
            raise NothingToDo(f"{backend} is not loaded: nothing to put to sleep")
        if w.state == WorkerState.ASLEEP:
            if rt.slumber is not None and rt.slumber.phase == "waking":
                raise Refused(f"{backend} is waking up; wait until it is awake, then put it "
                              "to sleep")
            return
        if not rt.can_sleep:
            raise Refused(f"{backend} cannot sleep: {self.why_not(rt)}; `vramtui evict "
                          f"{backend}` stops it instead")
        if rt.admitted or w.state != WorkerState.READY:
            raise Refused(f"{backend} is {w.state.value}"
                          + (f" with job {rt.admitted[0]}" if rt.admitted else "")
                          + "; wait until it is idle, then put it to sleep")
        host = rt.info().sleep_host_mib
        room = self.host_room_mib()
        if host > room:
            raise Refused(f"{backend}'s sleep would take {host} MiB of host memory and "
                          f"sleepers may take {max(0, room)} MiB more (sleep_host_budget "
                          f"{self.budget_mib} MiB); evict it, or wake another one first")
        self.sleep(rt, "asked")

    def wake_asked(self, backend: str, preload: Callable[[BackendRuntime], None]) -> None:
        """Wake ``backend``'s sleeping worker when what waking adds fits (admitted like a
        preload: in room nobody waits for); NothingToDo when it is not loaded. Awake already,
        it stays as it is (asking twice is no error)."""
        rt = self.pool.runtime(backend)
        w = rt.worker
        if w is None or w.exited:
            raise NothingToDo(f"{backend} is not loaded, so not asleep: nothing to wake "
                              f"(`vramtui preload {backend}` loads it)")
        if w.state == WorkerState.ASLEEP:
            preload(rt)

    @staticmethod
    def unwoken(rt: BackendRuntime) -> bool:
        """``rt``'s worker sleeps and no wake of it is under way or wanted (a preload or a
        wake asked of it still waits for room)."""
        w, slumber = rt.worker, rt.slumber
        return (w is not None and w.state == WorkerState.ASLEEP
                and not (slumber is not None
                         and (slumber.phase == "waking" or slumber.wake_wanted)))

    @staticmethod
    def why_not(rt: BackendRuntime) -> str:
        """Why ``rt``'s worker may not be put to sleep (for messages)."""
        w = rt.worker
        if rt.spec.sleep.enabled is False:
            return "its descriptor says sleep: false"
        if rt.health.no_sleep is not None:
            return f"{rt.health.no_sleep} (respawn it to try again)"
        if rt.spec.pinned:
            return "it is pinned"
        if rt.conduct.exclusive:
            return "its footprint is not measured yet (it holds its GPU whole)"
        if w is not None and "sleep" not in w.features:
            if rt.spec.server:
                return "its descriptor's http: section has no sleep and wake requests"
            return ("its worker has no @worker_sdk.sleep and @worker_sdk.wake hooks (or "
                    "speaks a protocol without sleep)")
        return "it is not loaded"

    # -- sleep ----------------------------------------------------------------------------------
    def sleep(self, rt: BackendRuntime, reason: str) -> None:
        """Put ``rt``'s ready, idle worker to sleep (the planner chose it, or a user did)."""
        w = rt.worker
        if w is None or w.state != WorkerState.READY or rt.admitted or not rt.can_sleep \
                or rt.slumber is not None:  # (its sleep is under way: asked once)
            return
        info = rt.info()
        m = rt.measures  # (settling: the last sample saw its job's memory, not what it holds)
        held = max(0 if m.settling else m.observed_mib or 0, info.idle_mib)
        rt.slumber = Slumber("falling", self.clock(), min(info.sleep_residual_mib, held),
                             info.sleep_host_mib, held)
        name = rt.spec.name
        self.notes.note("info", f"putting {name} to sleep on GPU{w.gpu} (it holds {held} "
                        f"MiB; waking it costs about {info.wake_cost_s:.2g} s, a reload "
                        f"{info.reload_cost_s:.2g} s): {reason}", name)
        self.notes.counters.slept(name)
        self.loop.spawn(self._fall_asleep(rt, w))

    async def _fall_asleep(self, rt: BackendRuntime, w: Worker) -> None:
        spec = rt.spec
        slumber = rt.slumber
        before = self._host_memory(w)  # (read now: the sleep is asked in this same turn)
        outcome = await w.sleep(spec.sleep.level, spec.timeouts.start_s)
        if rt.worker is not w or w.exited or rt.slumber is not slumber or slumber is None:
            return
        if w.state != WorkerState.ASLEEP:
            # It did not begin to sleep (a job came in the same turn of the loop): no sleep
            # stays recorded, nor counted as giving its memory back.
            rt.slumber = None
            self.notes.note("info", f"{spec.name} was not put to sleep: {outcome.error}",
                            spec.name, quiet=True)
            self.loop.schedule()
            return
        if not outcome.ok:
            self._fall_back(rt, f"its sleep failed: {outcome.error}")
            return
        keeps = await self._measure(w, slumber.held_mib)
        if rt.worker is not w or w.exited or rt.slumber is not slumber:
            return
        said = outcome.kept_mib
        if keeps is None:  # the GPU reader cannot tell: the worker's word, never less
            keeps = max(slumber.keeps_mib, said or 0)
        elif said is not None and keeps > said + KEEP_TOLERANCE_MIB:
            self._fall_back(rt, f"it said it keeps {said} MiB asleep but GPU{w.gpu} shows "
                            f"{keeps} MiB of it")
            return
        gave = slumber.held_mib - keeps
        if not sleep_gain_enough(slumber.held_mib, keeps):
            self._fall_back(rt, f"its sleep gave nothing back (it held {slumber.held_mib} "
                            f"MiB and still holds {keeps} MiB on GPU{w.gpu}; a sleep must "
                            f"give back at least {MIN_SLEEP_GAIN_MIB} MiB and a tenth)")
            return
        took = self.clock() - slumber.since
        said = outcome.host_mib if outcome.host_mib is not None else slumber.host_mib
        after = self._host_memory(w)
        grew = round(after - before) if after is not None and before is not None else 0
        host = max(said, grew)  # what it said, never less than its processes were seen to take
        others = self.host_held_mib() - slumber.host_mib
        slumber.phase, slumber.since = "asleep", self.clock()
        slumber.keeps_mib, slumber.host_mib = keeps, host
        m = rt.measures
        m.sleep_residual_mib, m.sleep_host_mib = keeps, host
        m.observed_mib = keeps  # measured now: the last sample saw it before it slept
        name = spec.name
        if others + host > self.budget_mib:
            seen = f" (its processes took {grew} MiB more; it said {said})" if grew > said else ""
            self._fall_back(rt, f"its sleep took {host} MiB of host memory{seen}, and "
                            f"sleepers may take {max(0, self.budget_mib - others)} MiB more "
                            f"(sleep_host_budget {self.budget_mib} MiB)", learned=True)
            return
        self.notes.note("info", f"{name} asleep in {took:.2f} s: keeps {keeps} MiB on "
                        f"GPU{w.gpu} (gave back {gave} MiB), {host} MiB of host memory", name)
        self.notes.sleep(name, "asleep", f"keeps {keeps} MiB, gave back {gave} MiB", took)
        if slumber.wake_wanted:
            self._begin_wake(rt, slumber)
        self.loop.schedule()

    @staticmethod
    def _host_memory(w: Worker) -> float | None:
        """The host memory ``w``'s process and its descendants took (anonymous and shared
        pages, not the file pages they map; a few small /proc reads); None when it cannot be
        read."""
        return None if w.pid is None else tree_anon_mib(w.pid)

    async def _measure(self, w: Worker, held: int) -> int | None:
        """What ``w``'s processes hold on its GPU now (None: the reader cannot tell), read
        again after a moment while it still looks like nothing was given back."""
        keeps: int | None = None
        for attempt in range(MEASURE_TRIES):
            if attempt:
                await asyncio.sleep(MEASURE_PAUSE_S)
            keeps = await self._read(w)
            if keeps is None or sleep_gain_enough(held, keeps):
                break
        return keeps

    async def _read(self, w: Worker) -> int | None:
        try:  # (the devices read after it: what its sleep gave back is free in the readings)
            procs = await self.monitor.processes_now()
        except Exception:  # noqa: BLE001 - a reader that fails cannot tell
            return None
        pids = w.pids({p.pid for p in procs})
        mine = [p.used_mib for p in procs
                if p.pid in pids and p.gpu_index == w.gpu and p.used_mib is not None]
        return sum(mine) if mine else None

    # -- wake -----------------------------------------------------------------------------------
    def wake(self, rt: BackendRuntime) -> None:
        """A job (or a wake asked) was admitted for ``rt``'s sleeping worker: wake it (once its
        sleep is done, when it is still falling asleep)."""
        w = rt.worker
        if w is None or w.state != WorkerState.ASLEEP:
            return
        slumber = rt.slumber
        if slumber is None:  # (asleep without a record: count it whole from now on)
            held = max(rt.measures.observed_mib or 0, rt.info().idle_mib)
            slumber = rt.slumber = Slumber("asleep", self.clock(), held, 0, held)
        if slumber.phase == "falling":
            slumber.wake_wanted = True
        elif slumber.phase == "asleep":
            self._begin_wake(rt, slumber)

    def _begin_wake(self, rt: BackendRuntime, slumber: Slumber) -> None:
        w = rt.worker
        assert w is not None
        slumber.phase, slumber.since = "waking", self.clock()
        self.notes.note("info", f"waking {rt.spec.name} on GPU{w.gpu}", rt.spec.name,
                        quiet=True)
        self.loop.spawn(self._wake_up(rt, w, slumber))

    async def _wake_up(self, rt: BackendRuntime, w: Worker, slumber: Slumber) -> None:
        outcome = await w.wake(rt.spec.timeouts.start_s)
        if w.exited and w.state == WorkerState.CRASHED and rt.worker is None \
                and rt.slumber is slumber:
            # it died in its wake (a crash in the hook, the OOM killer; not a stop the engine
            # asked, as a yield's): its waiting jobs went back to the queue as it went; said,
            # and not put to sleep again
            self._fall_back(rt, f"it died in its wake ({outcome.error})")
            return
        if rt.worker is not w or w.exited or rt.slumber is not slumber:
            return
        took = self.clock() - slumber.since
        name = rt.spec.name
        if not outcome.ok:
            self.requeue_admitted(rt, f"requeued: {name} did not wake")
            self._fall_back(rt, f"it did not wake: {outcome.error}")
            return
        rt.slumber = None
        rt.measures.timed(wake_s=took)
        self.notes.counters.woke(name, took)
        self.notes.note("info", f"{name} woke in {took:.2f} s on GPU{w.gpu}", name)
        self.notes.sleep(name, "awake", f"woke in {took:.3f} s", took)
        self.loop.schedule()

    def requeue_admitted(self, rt: BackendRuntime, why: str) -> None:
        """The jobs admitted to ``rt``'s worker that have not begun go back to the queue (it
        did not wake, or its load is given up)."""
        for job_id in list(rt.admitted):
            job = self.jobs.get(job_id)
            if job is not None and job.state is JobState.STARTING:
                rt.admitted.remove(job_id)
                self.requeue(job, why)

    # -- fall-backs -----------------------------------------------------------------------------
    def check(self, book: Callable[[], Book]) -> None:
        """After a sample: a sleeping worker seen holding more than it kept when it slept is
        stopped (its memory came back unasked): by more than ``KEEP_TOLERANCE_MIB``, or by
        more than a reading's noise while its GPU is over-committed or its reserve taken
        (``book``: the ledger now; the room its sleep gave back went to others, and a job
        there may die of it, or the desktop starve)."""
        overcommitted: dict[int, int] | None = None
        for rt in self.pool.runtimes():
            slumber, w = rt.slumber, rt.worker
            observed = rt.measures.observed_mib
            if (slumber is None or slumber.phase != "asleep" or w is None or w.exited
                    or w.state != WorkerState.ASLEEP or observed is None):
                continue
            grew = observed - slumber.keeps_mib
            if grew <= MIN_OVERUSE_TOLERANCE_MIB:
                continue
            if grew <= KEEP_TOLERANCE_MIB:
                if overcommitted is None:
                    overcommitted = {i: g.over_reserve_mib for i, g in book().gpus.items()}
                if overcommitted.get(w.gpu, 0) <= 0:
                    continue
            over = overcommitted.get(w.gpu, 0) if overcommitted is not None else 0
            self._fall_back(rt, f"it took its memory back while asleep (it holds "
                            f"{observed} MiB, {slumber.keeps_mib} MiB when it slept"
                            + (f"; GPU{w.gpu} holds {over} MiB more than it may, its "
                               "reserve counted)" if over > 0 else ")"))

    def _fall_back(self, rt: BackendRuntime, why: str, *, learned: bool = False) -> None:
        """Stop ``rt``'s worker instead of keeping it asleep, and say why; its backend is not
        put to sleep again until respawned (``learned``: it may be, now that what its sleep
        takes is known and checked before the next one)."""
        name = rt.spec.name
        if learned:
            then = "its next sleep is checked against what this one took"
        else:
            rt.health.no_sleep = why
            then = "it is not put to sleep again until respawned"
        self.notes.note("warning", f"{name}: {why}; stopping it instead ({then})", name)
        self.notes.sleep(name, "stopped", why, None)
        self.notes.counters.sleep_failed(name)
        self.pool.evict_now(rt)
        self.loop.schedule()
