"""What the engine watches of each backend's worker as it runs, and what it does about it.

- **Memory**, each process sample: what every worker's processes (and their descendants)
  hold, which sizes its backend's figures — a job's peak, an idle worker's resident memory —
  so figures that proved too small are replaced by what was observed; a backend with an
  unknown footprint stops holding a GPU alone once a job of it was measured.
- **Models that lie**: a worker above the figures it was admitted with is reported, and its
  backend's ``on_overuse`` applies (warn, evict once idle, kill); one that over-commits its GPU
  is killed at once whatever the policy, and its backend is distrusted (its descriptor only a
  floor) until measured again.
- **Liveness**: every ready, busy or sleeping worker is pinged; one that stops answering is
  killed (as is a model server whose requests stopped being answered: ``kill_unanswering``),
  through one path, ``kill_for``: its jobs fail with the reason, or are retried once.
- **Idleness**: a worker idle past its backend's ``keep_alive`` is unloaded (asleep or not).
- **Ghosts**: a stopped worker's memory stays counted until its processes leave the GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Protocol

from ..gpu.sampler import Sample
from ..jobs import Job, JobState
from ..jobs.table import JobTable
from ..ledger import Book
from ..workers.states import WorkerState
from .loop import EngineLoop
from .monitor import Monitor
from .notes import Notes
from .pool import WorkerPool
from .runtime import BackendRuntime

MIN_OVERUSE_TOLERANCE_MIB = 64
MIN_PEAK_SAMPLES = 3  # a job's peak is trusted to size a backend once sampled this often


class Run(Protocol):
    """A calibration run, as the watch sees it: a worker alone on a GPU."""

    gpu: int
    backend: str
    observed_mib: int | None

    def pids(self, on_gpu: set[int]) -> set[int]: ...


class WorkerWatch:
    """See the module doc; it acts through the pool, notes through the notes."""

    def __init__(self, pool: WorkerPool, jobs: JobTable, monitor: Monitor, notes: Notes,
                 loop: EngineLoop, book: Callable[[], Book], clock: Callable[[], float]
                 ) -> None:
        self.pool = pool
        self.jobs = jobs
        self.monitor = monitor
        self.notes = notes
        self.loop = loop
        self.book = book
        self.clock = clock

    # -- memory ---------------------------------------------------------------------------------
    def observe(self, sample: Sample, runs: Iterable[Run]) -> None:
        """What every worker's processes hold now: learning, foreign memory, models that lie."""
        per_gpu = self.monitor.per_gpu()
        on_gpu = self.monitor.on_gpu()
        ours: dict[int, set[int]] = {}
        owners: dict[int, str] = {}  # the one attribution of a GPU process to a backend
        for rt in self.pool.runtimes():
            worker, m = rt.worker, rt.measures
            name = rt.spec.name
            if worker is not None and not worker.exited:
                pids = worker.pids(on_gpu)
                ours.setdefault(worker.gpu, set()).update(pids)
                owners.update(dict.fromkeys(pids & on_gpu, name))
                mine = per_gpu.get(worker.gpu, {})
                mib = sum(mine.get(pid, 0) for pid in pids)
                seen = bool(pids & set(mine))
                m.observed_mib = mib if seen or worker.hot else None
                # A sample taken before the last job ended (processed after it) still shows
                # that job's memory: on its way back, not what the idle worker holds.
                fresh = sample.t >= m.ended_at
                if fresh:
                    m.settling = False
                if seen and fresh and m.observed_mib is not None:
                    if not rt.admitted and worker.state == WorkerState.READY:
                        self.learn_idle(rt, mib)
                    if len(rt.admitted) == 1:
                        job = self.jobs.get(rt.admitted[0])
                        if job is not None and job.state is JobState.RUNNING:
                            job.peak_mib = max(job.peak_mib or 0, mib)
                            job.peak_samples += 1
            for gh in list(rt.ghosts):
                mine = per_gpu.get(gh.gpu, {})
                if not (gh.pids & on_gpu):
                    rt.ghosts.remove(gh)
                    continue
                gh.observed_mib = sum(mine.get(pid, 0) for pid in gh.pids)
                ours.setdefault(gh.gpu, set()).update(gh.pids)
                owners.update(dict.fromkeys(gh.pids & on_gpu, name))
        for run in runs:
            pids = run.pids(on_gpu)
            ours.setdefault(run.gpu, set()).update(pids)
            owners.update(dict.fromkeys(pids & on_gpu, run.backend))
            run.observed_mib = sum(per_gpu.get(run.gpu, {}).get(pid, 0) for pid in pids)
        self.monitor.attributed(ours, owners, per_gpu)
        for pid in sorted(self.monitor.news("estimated")):
            whose = owners.get(pid)
            self.notes.note("warning", f"host memory: the PSS of pid {pid}"
                            + (f" ({whose})" if whose else "") + " cannot be read (another "
                            "user's process?): counted at its resident set, an over-estimate",
                            whose)
        for pid in sorted(self.monitor.news("orphans")):
            whose = owners.get(pid)
            self.notes.note("warning", f"host memory: pid {pid}, a child of a worker"
                            + (f" of {whose}" if whose else "") + ", outlived it: counted "
                            + ("as its backend's" if whose else "as foreign")
                            + " until it exits", whose)
        self.check_overuse()

    def learn(self, rt: BackendRuntime, job: Job, ok: bool) -> None:
        """The job's observed peak becomes the backend's learned peak when it is larger."""
        peak = job.peak_mib
        if peak is None:
            return
        m = rt.measures
        m.observed_peaks.append(peak)
        learned = m.learned
        if learned.peak_mib is None or peak > learned.peak_mib:
            learned = replace(learned, peak_mib=peak)
        measured = ok and job.peak_samples >= MIN_PEAK_SAMPLES
        if measured and not learned.peak_confirmed:
            learned = replace(learned, peak_confirmed=True)
        m.learned = learned
        if m.distrusted and measured:
            m.distrusted = False
            how = "measured alone" if rt.conduct.exclusive else "measured again"
            self.notes.note("info", f"{rt.spec.name} {how}: peak {peak} MiB; it shares GPUs "
                            "again, at what it was seen to use", rt.spec.name)
        self._maybe_share(rt)

    def learn_idle(self, rt: BackendRuntime, mib: int) -> None:
        """An idle, ready worker holds ``mib``: what the backend keeps resident at least."""
        m = rt.measures
        if m.learned.resident_mib is not None and mib <= m.learned.resident_mib:
            return
        m.learned = replace(m.learned, resident_mib=mib)
        self._maybe_share(rt)

    def _maybe_share(self, rt: BackendRuntime) -> None:
        """A worker that held its GPU alone (its footprint was unknown) stops doing so once
        production measured it."""
        m = rt.measures
        if rt.conduct.exclusive and not m.distrusted and m.learned.peak_confirmed:
            rt.conduct.exclusive = False
            resident = m.learned.resident_mib
            self.notes.note("info", f"{rt.spec.name} measured in production: peak "
                            f"{m.learned.peak_mib} MiB"
                            + (f", resident {resident} MiB" if resident is not None else "")
                            + "; it no longer needs a GPU to itself", rt.spec.name)
            self.loop.schedule()

    # -- models that lie ------------------------------------------------------------------------
    def check_overuse(self) -> None:
        """Workers above the figures they were admitted with: the reservation follows what
        they hold (the ledger does that, and learning sizes the next admissions), they are
        reported, and their backend's ``on_overuse`` applies; one over-committing its GPU is
        killed at once, whatever the policy."""
        liars: dict[str, int] = {}
        for rt in self.pool.runtimes():
            w, c, m = rt.worker, rt.conduct, rt.measures
            over = self.over_declared(rt)
            c.over_mib = over
            if over <= 0 or w is None or w.state == WorkerState.STOPPING:
                continue
            liars[w.name] = over
            policy = rt.spec.on_overuse
            name = rt.spec.name
            if not c.over_noted:
                c.over_noted = True
                figure = m.observed_mib - over if m.observed_mib is not None else 0
                self.notes.note("warning", f"{name} holds {m.observed_mib} MiB on "
                                f"GPU{w.gpu}, {over} MiB above what it was admitted with "
                                f"({figure} MiB for {len(rt.admitted)} job(s)): admission now "
                                f"counts what it holds; on_overuse: {policy}", name)
                self.notes.overuse(name, f"{over} MiB over its figures")
            tolerance = max(MIN_OVERUSE_TOLERANCE_MIB, rt.spec.safety_mib)
            if over <= tolerance or policy == "warn":
                continue
            c.caught_mib = max(c.caught_mib or 0, m.observed_mib or 0)
            if policy == "kill":
                self.kill_liar(rt, f"killed: it held {m.observed_mib} MiB, {over} MiB "
                               "above what it was admitted with (on_overuse: kill)")
            elif c.accepting:
                c.accepting = False
                if rt.admitted:
                    self.notes.note("warning", f"{name} takes no new job and is evicted "
                                    "once its job ends (on_overuse: evict)", name)
                else:
                    self.notes.note("warning", f"evicting {name}: idle and {over} MiB "
                                    "above what it was admitted with (on_overuse: evict)",
                                    name)
                    self.notes.counters.evicted(name, "overuse")
                    self.pool.evict_now(rt)
        for gpu in self.book().gpus.values():
            excess = gpu.overcommit_mib
            if excess <= 0:
                continue
            culprits = sorted((h for h in gpu.holders if h.name in liars),
                              key=lambda h: -liars[h.name])
            for h in culprits:
                rt = self.pool.get(h.backend)
                if rt is None or rt.worker is None or rt.worker.name != h.name:
                    continue
                self.kill_liar(rt, f"killed: it held {h.observed_mib} MiB, {liars[h.name]} "
                               f"MiB above what it was admitted with, and GPU{gpu.index} was "
                               f"over-committed by {excess} MiB", distrust=True)
                excess -= liars[h.name]
                if excess <= 0:
                    break

    @staticmethod
    def over_declared(rt: BackendRuntime) -> int:
        """How far ``rt``'s live worker was last seen above the figures it was admitted with
        (0 for a worker that holds its GPU whole, or was not seen yet)."""
        w, baseline = rt.worker, rt.conduct.baseline
        observed = rt.measures.observed_mib
        if w is None or w.exited or baseline is None or observed is None \
                or rt.conduct.exclusive or rt.measures.settling:
            return 0  # (settling: what it was seen to hold is a job's, on its way back)
        return max(0, observed - baseline.holds_mib(len(rt.admitted)))

    @staticmethod
    def distrust(rt: BackendRuntime, seen_mib: int) -> None:
        """``rt`` was caught above its figures, holding up to ``seen_mib``: its descriptor is
        only a floor now, and unless a confirmed measurement covers what it was seen to hold,
        it runs alone until one of its jobs is measured again (a peak reached with two jobs
        running, or between two samples, was never measured), so an over-commit never
        recurs."""
        m = rt.measures
        m.distrusted = True
        learned = m.learned
        if not (learned.peak_confirmed and (learned.peak_mib or 0) >= seen_mib):
            m.learned = replace(learned, peak_confirmed=False)

    def kill_liar(self, rt: BackendRuntime, reason: str, *, distrust: bool = False) -> None:
        w, m = rt.worker, rt.measures
        if w is None or w.exited or rt.health.kill_reason is not None:
            return
        if distrust:
            self.distrust(rt, m.observed_mib or 0)
        if m.observed_mib is not None:
            key = "peak_mib" if rt.admitted else "resident_mib"
            old = getattr(m.learned, key)
            if old is None or m.observed_mib > old:
                m.learned = replace(m.learned, **{key: m.observed_mib})
        self.kill_for(rt, f"{rt.spec.name} {reason}")

    def kill_for(self, rt: BackendRuntime, reason: str) -> None:
        """Kill ``rt``'s live worker (its process tree) for ``reason``, said in the event log;
        its running jobs fail with it, or are retried once (``Engine.worker_exited``), and the
        backend restarts on its next job. Nothing when it is gone or being killed already."""
        w = rt.worker
        if w is None or w.exited or rt.health.kill_reason is not None:
            return
        rt.health.kill_reason = reason
        self.notes.note("error", reason, rt.spec.name)
        w.kill()

    def kill_unanswering(self, rt: BackendRuntime, why: str) -> None:
        """``rt``'s model server stopped answering requests (``why``: its answers' silence,
        ``Outcome.unanswered``), its health check alive or not: killed as a hung one."""
        w = rt.worker
        if w is not None:
            self.kill_for(rt, f"{rt.spec.name} stopped answering: {why}; killed its "
                          f"{rt.spec.runner} (pid {w.command_pid}), the backend restarts on its "
                          "next job")

    # -- ghosts ---------------------------------------------------------------------------------
    async def confirm_ghosts(self, rt: BackendRuntime) -> None:
        """Look at the GPU's process list right after an exit, not at the next sample (with
        the devices read after it: a ghost let go is free in the readings too)."""
        try:
            procs = await self.monitor.processes_now()
        except Exception:  # noqa: BLE001 - the periodic samples will confirm it instead
            return
        on_gpu = {p.pid for p in procs}
        before = len(rt.ghosts)
        rt.ghosts = [gh for gh in rt.ghosts if gh.pids & on_gpu]
        if len(rt.ghosts) != before:
            self.loop.schedule()

    def expire_ghosts(self) -> None:
        now = self.clock()
        on_gpu = self.monitor.on_gpu()
        for rt in self.pool.runtimes():
            for gh in list(rt.ghosts):
                if now >= gh.deadline:
                    if gh.pids & on_gpu:
                        what = "host memory" if gh.gpu in self.monitor.host_gpus() \
                            else "GPU memory"
                        self.notes.note("warning", f"{rt.spec.name}: processes "
                                        f"{sorted(gh.pids)} still hold {what} after "
                                        "exiting; counting it as foreign", rt.spec.name)
                    rt.ghosts.remove(gh)

    # -- liveness and idleness ------------------------------------------------------------------
    def check_liveness(self, now: float) -> None:
        """Ping every ready, busy or sleeping worker; kill one whose last ping went unanswered
        too long. The factory checks its own watch over them too (the lifeline)."""
        mended = self.pool.factory.check()
        if mended is not None:
            self.notes.note("warning", mended)
        for rt in self.pool.runtimes():
            w = rt.worker
            if w is None or w.exited or not (w.hot or w.state == WorkerState.ASLEEP) \
                    or rt.health.kill_reason is not None:
                continue
            overdue = w.ping_overdue(now)
            limit = rt.spec.timeouts.ping_s
            if overdue >= limit:
                self.kill_for(rt, f"{rt.spec.name} hung: its {rt.spec.runner} (pid "
                              f"{w.command_pid}) answered no ping for {overdue:.1f} s "
                              f"(timeouts.ping {limit:g} s); killed it, the backend restarts "
                              "on its next job")
            else:
                w.ping()

    def expire_keep_alive(self) -> None:
        now = self.clock()
        for rt in self.pool.runtimes():
            w, spec = rt.worker, rt.spec
            asleep = rt.slumber is not None and rt.slumber.phase == "asleep"
            left = rt.keep_alive_left_s(now)
            if (w is not None and (w.state == WorkerState.READY or asleep) and left is not None
                    and left <= 0):
                why = "asked to unload once idle" if w is rt.usage.unload_after else \
                    f"idle for {spec.keep_alive_s:g} s (keep_alive)"
                self.notes.note("info", f"{spec.name} {why}: unloading", spec.name)
                self.notes.counters.evicted(spec.name, "idle")
                rt.usage.idle_since = None
                self.pool.evict_now(rt)
