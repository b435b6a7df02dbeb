"""Building the immutable :class:`EngineSnapshot` from the engine's parts.

Runs on the engine loop (it reads state only there); everything it returns is frozen and
safe to hand to any thread.  Times leave as wall clock, converted by the engine's one
:class:`~supervisor.clock.WallClock` (the job table's views, the GPU history here).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..clock import WallClock
from ..jobs.table import JobTable
from ..ledger import Book
from ..paths import Paths
from ..results import YieldInfo
from ..snapshot import BackendView, EngineSnapshot, GpuProcess, GpuView
from .monitor import Monitor
from .notes import Notes
from .pool import WorkerPool
from .process_facts import process_name, process_user
from .reload import Descriptors
from .runtime import BackendRuntime


@dataclass(frozen=True, slots=True)
class Parts:
    """What a snapshot reads: the engine's parts, named."""

    wall: WallClock
    monitor: Monitor
    pool: WorkerPool
    jobs: JobTable
    notes: Notes
    descriptors: Descriptors
    paths: Paths
    reserve_mib: Mapping[int, int]  # GPU -> kept free there
    draining: frozenset[int]
    notice: str | None
    stopping: bool
    started_at: float
    others: Mapping[int, int]  # GPU -> what admission holds back for strangers
    yielded: Mapping[int, YieldInfo]  # GPU -> its yield
    job_s: Mapping[str, float] = field(default_factory=dict)  # backend -> what a job of it
    # takes, expected (measured)


def build_snapshot(parts: Parts, book: Book) -> EngineSnapshot:
    """The whole engine at this instant."""
    now = parts.wall.clock()
    monitor = parts.monitor
    probe = monitor.probe
    offset = parts.wall.offset
    procs = gpu_processes(monitor)
    gpus = []
    for index, r in sorted(monitor.readings.items()):
        accounts = book.gpus.get(index)
        # On the host device, ours includes what our workers placed elsewhere hold there.
        elsewhere = monitor.elsewhere.get(index, 0)
        ours = (accounts.ours_observed_mib if accounts is not None else 0) + elsewhere
        foreign = monitor.strangers_mib(index) if r.used_mib is not None else None
        gpus.append(GpuView(
            index=index, name=r.name or f"GPU{index}", total_mib=r.total_mib,
            used_mib=r.used_mib, free_mib=r.free_mib,
            reserved_mib=accounts.held_mib if accounts is not None else 0, ours_mib=ours,
            foreign_mib=foreign, util_pct=r.util_pct, temp_c=r.temp_c, power_w=r.power_w,
            simulated=(r.source or probe.source) == "simulated",
            reserve_mib=parts.reserve_mib.get(index, 0),
            history=tuple((t + offset, v) for t, v in monitor.history.points(index)),
            draining=index in parts.draining, processes=procs.get(index, ()),
            others_mib=parts.others.get(index, 0),
            yielded_by=y.by if (y := parts.yielded.get(index)) is not None else None,
            yielded_until=y.until if y is not None else None,
            yielded_rule=y is not None and y.rule,
            source=r.source or probe.source,
            budget_mib=0 if accounts is None or index in parts.draining
            or index in parts.yielded else accounts.budget_mib,
        ))
    queued_by: dict[str, int] = {}
    for job in parts.jobs.queue:
        queued_by[job.backend] = queued_by.get(job.backend, 0) + 1
    backends = [backend_view(rt, now, book, queued_by.get(name, 0), parts.paths, parts.wall,
                             parts.job_s.get(name)) for name, rt in sorted(parts.pool.items())]
    table = parts.jobs
    running = tuple(table.view(job) for rt in parts.pool.runtimes() for j in rt.admitted
                    if (job := table.get(j)) is not None)
    queued = tuple(table.view(job, i + 1) for i, job in enumerate(table.queue))
    recent = tuple(table.view(job) for job in table.recent())
    return EngineSnapshot(
        taken_at=parts.wall.now(), uptime_s=now - parts.started_at,
        source=probe.source, simulated=probe.simulated,
        driver_version=probe.driver_version, notice=parts.notice,
        gpus=tuple(gpus), backends=tuple(backends), running=running, queued=queued,
        recent=recent, descriptor_errors=parts.descriptors.errors,
        log=tuple(parts.notes.lines), stopping=parts.stopping, pid=os.getpid(),
        python=sys.version.split()[0],
    )


def backend_view(rt: BackendRuntime, now: float, book: Book, queued: int,
                 paths: Paths, wall: WallClock, job_s: float | None = None) -> BackendView:
    w, m, spec = rt.worker, rt.measures, rt.spec
    keep_left = rt.keep_alive_left_s(now)
    peaks = sorted(m.observed_peaks)
    p95 = peaks[min(len(peaks) - 1, int(0.95 * len(peaks)))] if peaks else None
    info = rt.info()
    # Its processes: its live worker's, and those of a calibration run of it or of a worker
    # of it that stopped and has not left the GPU yet (each counted in the GPU's "ours").
    live = m.observed_mib if w is not None else None
    apart = book.observed_by(spec.name, ("ghost", "calibration"))
    observed = None if live is None and apart is None else (live or 0) + (apart or 0)
    return BackendView(
        name=spec.name, state=rt.state, pid=w.command_pid if w is not None else None,
        gpu=w.gpu if w is not None else None,
        observed_mib=observed,
        declared_peak_mib=spec.peak, learned_peak_mib=m.learned.peak_mib,
        observed_p95_mib=p95, reserved_mib=book.held_by(spec.name),
        priority=spec.priority, jobs_served=rt.usage.jobs_served,
        last_used=wall.maybe_wall(rt.usage.last_used), keep_alive_left_s=keep_left,
        last_error=rt.health.last_error, init_failures=rt.health.init_failures,
        queued=queued, running=len(rt.admitted), tunnels=rt.usage.tunnels,
        description=spec.description,
        log_path=str(paths.worker_log_path(spec.name)), pinned=spec.pinned,
        simulated=spec.simulated, source=spec.source,
        features=tuple(sorted(w.features)) if w is not None else (),
        learned_resident_mib=m.learned.resident_mib, admission_peak_mib=info.peak_mib,
        over_mib=rt.conduct.over_mib if w is not None else 0,
        accepting=rt.conduct.accepting, on_overuse=spec.on_overuse,
        reload_cost_s=info.reload_cost_s, job_s=job_s, distrusted=m.distrusted,
        can_sleep=rt.can_sleep, sleep_residual_mib=m.sleep_residual_mib,
        wake_cost_s=info.wake_cost_s, no_sleep=rt.health.no_sleep, api=tuple(spec.api),
    )


def gpu_processes(monitor: Monitor) -> dict[int, tuple[GpuProcess, ...]]:
    """The processes on each GPU at the last process sample, largest first, each named by
    the backend whose worker (or a descendant of it, or a stopped one not yet gone) it is, as
    the engine attributed it for the ledger; else foreign."""
    owners = monitor.owners
    out: dict[int, list[GpuProcess]] = {}
    for p in monitor.processes:
        backend = owners.get(p.pid)
        out.setdefault(p.gpu_index, []).append(GpuProcess(
            p.pid, p.used_mib, process_user(p.pid), backend,
            process_name(p.pid) if backend is None else backend))
    return {gpu: tuple(sorted(ps, key=lambda x: -(x.used_mib or 0)))
            for gpu, ps in out.items()}
