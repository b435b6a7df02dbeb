"""The planner: the engine's state as the pure scheduler's input, and the decisions it keeps.

Each scheduling step, :meth:`Planner.inputs` gathers the facts (the GPUs as last read, every
backend's admission figures, each live worker, ghost and calibration run, the queue) and
:func:`supervisor.admission.decide_inputs` turns them into the ledger's book and the
scheduler's snapshot; :meth:`Planner.plan` asks the pure :func:`~supervisor.scheduler.plan.plan`
what to evict and start.  The planner also holds what outlives one step: the GPUs being
drained, and why a backend's jobs could never run here (remembered while its figures and the
GPUs' sizes stay the same, so a submit does not pay for the check each time), and how each
backend's requests arrive and how long its jobs run (``supervisor.scheduler.expect``: what
the scheduler expects of the requests that have not come yet).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from .. import admission
from ..errors import UnknownGpu
from ..gpu.model import GpuReading
from ..jobs.record import Job
from ..jobs.states import JobState
from ..ledger import Book, Device
from ..scheduler import model as sched
from ..scheduler.expect import Learner
from ..scheduler.plan import Plan
from ..scheduler.plan import plan as make_plan
from ..scheduler.submit import check_submit
from ..workers.states import WorkerState
from .config import EngineConfig
from .runtime import BackendRuntime

GONE = frozenset({WorkerState.CRASHED, WorkerState.COLD})


def host_gpus(readings: Mapping[int, GpuReading]) -> list[int]:
    """The indices of the host device (``--gpus host``): none, or one."""
    return [i for i, r in sorted(readings.items()) if r.source == "host"]


class Planner:
    """Admission's inputs and memory between steps (see the module doc)."""

    def __init__(self, config: EngineConfig, clock: Callable[[], float],
                 job: Callable[[str], Job | None] = lambda _id: None) -> None:
        self.clock = clock  # the engine's: when requests arrive, and now
        self.job = job  # the engine's jobs by id: the priorities of a worker's jobs
        self.config = sched.SchedulerConfig(
            patience_factor=config.patience_factor,
            max_patience_s=config.max_patience_s,
            aging_interval_s=config.aging_interval_s,
            max_queue_depth=config.max_queue_depth,
        )
        self.reserve_mib = config.reserve_mib
        self.gpu_reserve_mib = dict(config.gpu_reserve_mib)  # per GPU, in its place
        self.draining: set[int] = set()
        self.expect = Learner()  # how requests arrive, per backend and priority
        # backend -> (its figures, the GPUs' sizes, why a job of it could never run)
        self._refusals: dict[str, tuple[sched.BackendInfo, tuple[tuple[int, int], ...],
                                        str | None]] = {}

    def reserves(self, readings: Mapping[int, GpuReading]) -> dict[int, int]:
        """GPU -> what is kept free there (``reserve`` of config.yaml, else the default)."""
        return {i: self.gpu_reserve_mib.get(i, self.reserve_mib) for i in readings}

    @staticmethod
    def devices(readings: Mapping[int, GpuReading]) -> list[Device]:
        return [Device(i, r.total_mib, r.used_mib, r.free_mib)
                for i, r in sorted(readings.items())]

    def inputs(self, readings: Mapping[int, GpuReading], runtimes: Iterable[BackendRuntime],
               runs: Sequence[admission.RunFacts], foreign: Mapping[int, int],
               queue: tuple[sched.QueuedJob, ...] = (),
               counts: Mapping[tuple[str, str], int] | None = None,
               sleep_host_room_mib: int = 0, closed: Mapping[int, str] | None = None,
               ) -> tuple[sched.Snapshot, Book]:
        """The scheduler's snapshot and the ledger's book of the engine now; ``closed``: the
        GPUs where nothing of ours may run (yielded), and why; with a queue, what is expected
        of requests yet to come."""
        calibrating = {r.backend for r in runs}
        now = self.clock()
        backends: dict[str, sched.BackendInfo] = {}
        targets: dict[str, float] = {}
        workers: list[admission.WorkerFacts] = []
        ghosts: list[admission.GhostFacts] = []
        hosts = host_gpus(readings)
        for rt in runtimes:
            name = rt.spec.name
            backends[name] = admission.placed(rt.info(), hosts)
            if rt.spec.target_wait_s is not None:
                targets[name] = rt.spec.target_wait_s
            w = rt.worker
            if w is not None and w.state not in GONE:
                # A backend being calibrated takes no new job on its old worker, which the
                # run stops once its running jobs are done.
                workers.append(self._facts(rt, "stopping" if name in calibrating else None,
                                           self._loading_for(rt),
                                           running_priority=self._running_priority(rt),
                                           now=now))
            for gh in rt.ghosts:
                ghosts.append(admission.GhostFacts(gh.name, name, gh.gpu, gh.mib,
                                                   gh.observed_mib))
        return admission.decide_inputs(
            self.devices(readings), backends, workers, queue, ghosts=ghosts, runs=runs,
            queued_counts=counts if counts is not None else {},
            reserve_mib=self.reserves(readings),
            foreign=foreign, draining=self.draining, sleep_host_room_mib=sleep_host_room_mib,
            closed=closed,
            expected=self.expect.view(now, targets) if queue else None)

    def arrived(self, job: Job) -> None:
        """A job was submitted: learn when its backend's requests come."""
        if job.kind == "job":
            self.expect.arrived(job.backend, job.priority, job.submitted_at)

    def given_up(self, backend: str, for_backend: str, loaded_s: float) -> None:
        """A load of ``backend`` was given up for a request of ``for_backend``, ``loaded_s``
        after it began: its next load waits for a better moment while that stream's requests
        would do it again."""
        self.expect.given_up(backend, for_backend, loaded_s)

    def ended(self, job: Job) -> None:
        """A job ended: a success teaches how long its backend's jobs run."""
        if job.kind != "job" or job.state is not JobState.SUCCEEDED or job.finished_at is None:
            return
        start = next((t for t, state, _ in reversed(job.history) if state == "running"), None)
        if start is not None:
            self.expect.ran(job.backend, job.finished_at - start)

    def _loading_for(self, rt: BackendRuntime) -> admission.Loading:
        """While ``rt``'s worker loads (a spawn, not a wake), ``admission.loading_facts`` of
        the jobs admitted to it, none begun yet; nothing otherwise."""
        w = rt.worker
        if w is None or rt.slumber is not None or w.state not in (
                WorkerState.STARTING, WorkerState.INITIALIZING):
            return admission.NOT_LOADING
        jobs = [j for job_id in rt.admitted if (j := self.job(job_id)) is not None
                and j.state is JobState.STARTING]
        if len(jobs) != len(rt.admitted):
            return admission.NOT_LOADING
        return admission.loading_facts(jobs)

    def _running_priority(self, rt: BackendRuntime) -> int | None:
        """The highest priority of the jobs ``rt``'s worker runs (None: it runs none)."""
        return max((j.priority for job_id in rt.admitted if (j := self.job(job_id)) is not None
                    and j.state is JobState.RUNNING), default=None)

    @staticmethod
    def _facts(rt: BackendRuntime, state: str | None, loading: admission.Loading, *,
               running_priority: int | None, now: float) -> admission.WorkerFacts:
        """``rt``'s live worker as the ledger and the scheduler see it at ``now``: a sleeping
        one at what it keeps (while it falls asleep, what it gives back on its way back), a
        waking one whole, as one that starts; ``loading`` (what it loads for),
        ``running_priority`` and when its keep-alive may unload it (``leaves_at``): see
        ``sched.WorkerInfo``."""
        w = rt.worker
        assert w is not None
        m, c, slumber = rt.measures, rt.conduct, rt.slumber
        sleep_mib: int | None = None
        if state is None:
            state = w.state.value
            if w.state == WorkerState.ASLEEP and slumber is not None:
                if slumber.phase == "waking":
                    state = "starting"
                else:
                    sleep_mib = slumber.keeps_mib
        return admission.WorkerFacts(
            name=w.name, backend=rt.spec.name, gpu=w.gpu, state=state, jobs=len(rt.admitted),
            exclusive=c.exclusive, observed_mib=m.observed_mib,
            idle_since=rt.usage.idle_for_eviction(), accepting=c.accepting,
            over_declared=c.over_mib > 0, settling=m.settling, sleep_mib=sleep_mib,
            falling=slumber is not None and slumber.phase == "falling",
            can_sleep=rt.can_sleep, running_priority=running_priority,
            leaves_at=None if (left := rt.leaves_in_s(now)) is None else now + left,
            **loading._asdict())

    @staticmethod
    def with_extra(queue: tuple[sched.QueuedJob, ...], counts: Mapping[tuple[str, str], int],
                   extra: tuple[sched.QueuedJob, ...]
                   ) -> tuple[tuple[sched.QueuedJob, ...], Mapping[tuple[str, str], int]]:
        """The queue with ``extra`` entries (preloads) after it."""
        if not extra:
            return queue, counts
        return queue + extra, counts + Counter((q.kind, q.backend) for q in extra)

    def drain(self, gpu: int, on: bool, readings: Mapping[int, GpuReading]) -> str | None:
        """Flag ``gpu`` draining (or not): what to say of it, None when nothing changed;
        Refused for a GPU that is not there."""
        if gpu not in readings:
            present = ", ".join(f"GPU{i}" for i in sorted(readings)) or "none"
            raise UnknownGpu(f"unknown GPU {gpu}: there is no GPU{gpu} (present: {present})")
        if on and gpu not in self.draining:
            self.draining.add(gpu)
            return (f"draining GPU{gpu}: running jobs finish, nothing new starts there, idle "
                    "workers are evicted")
        if not on and gpu in self.draining:
            self.draining.discard(gpu)
            return f"GPU{gpu} takes jobs again"
        return None

    def plan(self, snap: sched.Snapshot, now: float) -> Plan:
        return make_plan(snap, now, self.config)

    @staticmethod
    def admitted(job_id: str, start: sched.Start, snap: sched.Snapshot, spawn: bool) -> str:
        """The event log's line for a job admitted by ``start``."""
        gpu = next((g for g in snap.gpus if g.index == start.gpu), None)
        free = ""
        if gpu is not None:
            room = gpu.total_mib - gpu.foreign_mib - sum(
                w.reserved_mib for w in snap.workers.values() if w.gpu == start.gpu)
            free = f" ({max(0, room - gpu.reserve_mib)} MiB free before)"
        how = "spawning its worker" if spawn else "on its worker"
        return (f"admitted {job_id} ({start.backend}) on GPU{start.gpu}, {how}: takes "
                f"{start.reserve_mib} MiB{free}")

    def holds(self, rt: BackendRuntime, readings: Mapping[int, GpuReading],
              foreign: Mapping[int, int]) -> int:
        """What the ledger says ``rt``'s live worker holds now."""
        w = rt.worker
        if w is None:
            return 0
        fact = admission.WorkerFacts(w.name, rt.spec.name, w.gpu, "ready", len(rt.admitted),
                                     rt.conduct.exclusive, rt.measures.observed_mib)
        slumber = rt.slumber
        if slumber is not None and slumber.phase != "waking":  # (asleep, or falling asleep)
            fact = replace(fact, state="asleep", sleep_mib=slumber.keeps_mib,
                           falling=slumber.phase == "falling")
        held = admission.holders(self.devices(readings), {rt.spec.name: rt.info()}, [fact],
                                 reserve_mib=self.reserves(readings), foreign=foreign)
        return sum(h.holds_mib for h in held)

    # -- refusals -------------------------------------------------------------------------------
    def refusal(self, rt: BackendRuntime, readings: Mapping[int, GpuReading],
                kind: str = "job") -> str | None:
        """Why a job (``kind``) of ``rt`` could never run here (None: it can); a job's is
        remembered while the backend's figures and the GPUs' sizes stay the same."""
        info = rt.info()
        name = rt.spec.name
        if kind != "job":
            return check_submit(self._view(name, info, readings), name, self.config,
                                kind=kind)
        sizes = tuple((i, r.total_mib) for i, r in sorted(readings.items()))
        known = self._refusals.get(name)
        if known is not None and known[0] is info and known[1] == sizes:
            return known[2]
        reason = check_submit(self._view(name, info, readings), name, self.config)
        self._refusals[name] = (info, sizes, reason)
        return reason

    def _view(self, backend: str, info: sched.BackendInfo,
              readings: Mapping[int, GpuReading]) -> sched.Snapshot:
        """What ``check_submit`` reads: the GPUs and that backend's figures (no ledger: a
        refusal at submit depends on sizes, never on what runs now)."""
        gpus = [sched.GpuState(i, r.total_mib, None, self.gpu_reserve_mib.get(i, self.reserve_mib))
                for i, r in sorted(readings.items())]
        return sched.Snapshot(gpus=gpus,
                              backends={backend: admission.placed(info, host_gpus(readings))})
