"""Building the immutable :class:`EngineSnapshot` from the engine's live state.

Runs on the engine loop (it reads state only there); everything it returns is frozen and
safe to hand to any thread.  Times leave as wall clock (the engine's own clock is monotonic):
jobs convert themselves (:meth:`Job.view`), the GPU history is converted here.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import TYPE_CHECKING

from .jobs import wall_offset
from .snapshot import BackendView, EngineSnapshot, GpuProcess, GpuView

if TYPE_CHECKING:
    from .engine import BackendRuntime, Engine


def backend_state(rt: BackendRuntime) -> str:
    """A backend's state as views show it: its worker's, else ``failed`` or ``cold``."""
    w = rt.worker
    return w.state.value if w is not None else ("failed" if rt.failed else "cold")


def build_snapshot(engine: Engine) -> EngineSnapshot:
    """The whole engine at this instant."""
    now = engine.clock()
    book = engine.book()
    gpus = []
    w = wall_offset(engine.clock)
    procs = gpu_processes(engine)
    draining = engine.draining
    for index, r in sorted(engine.readings.items()):
        accounts = book.gpus.get(index)
        ours = accounts.ours_observed_mib if accounts is not None else 0
        foreign = engine.foreign.get(index) if r.used_mib is not None else None
        gpus.append(GpuView(
            index=index, name=r.name or f"GPU{index}", total_mib=r.total_mib,
            used_mib=r.used_mib, free_mib=r.free_mib,
            reserved_mib=accounts.held_mib if accounts is not None else 0, ours_mib=ours,
            foreign_mib=foreign, util_pct=r.util_pct, temp_c=r.temp_c, power_w=r.power_w,
            simulated=engine.probe.simulated, reserve_mib=engine.config.reserve_mib,
            history=tuple((t + w, v) for t, v in engine.history.points(index)),
            draining=index in draining, processes=procs.get(index, ()),
        ))
    backends = []
    queued_by: dict[str, int] = {}
    for job in engine.queue:
        queued_by[job.backend] = queued_by.get(job.backend, 0) + 1
    for name, rt in sorted(engine.backends.items()):
        w = rt.worker
        state = backend_state(rt)
        keep_left = None
        if (w is not None and rt.idle_since is not None and not rt.admitted
                and math.isfinite(rt.spec.keep_alive_s)):
            keep_left = max(0.0, rt.spec.keep_alive_s - (now - rt.idle_since))
        peaks = sorted(rt.observed_peaks)
        p95 = peaks[min(len(peaks) - 1, int(0.95 * len(peaks)))] if peaks else None
        info = rt.info()
        backends.append(BackendView(
            name=name, state=state, pid=w.pid if w is not None else None,
            gpu=w.gpu if w is not None else None, observed_mib=rt.observed_mib,
            declared_peak_mib=rt.spec.peak, learned_peak_mib=rt.learned.peak_mib,
            observed_p95_mib=p95, reserved_mib=book.held_by(name),
            priority=rt.spec.priority, jobs_served=rt.jobs_served, last_used=rt.last_used,
            keep_alive_left_s=keep_left, last_error=rt.last_error,
            init_failures=rt.init_failures, queued=queued_by.get(name, 0),
            running=len(rt.admitted), description=rt.spec.description,
            log_path=str(engine.paths.logs_dir / f"{name}.log"), pinned=rt.spec.pinned,
            simulated=rt.spec.simulated, source=rt.spec.source,
            features=tuple(sorted(w.features)) if w is not None else (),
            learned_resident_mib=rt.learned.resident_mib, admission_peak_mib=info.peak_mib,
            over_mib=rt.over_mib if w is not None else 0,
            accepting=rt.accepting, on_overuse=rt.spec.on_overuse,
            reload_cost_s=info.reload_cost_s, distrusted=rt.distrusted,
        ))
    running = tuple(engine.jobs[j].view() for rt in engine.backends.values()
                    for j in rt.admitted if j in engine.jobs)
    queued = tuple(engine.view_of(job, i + 1) for i, job in enumerate(engine.queue))
    recent = tuple(engine.jobs[j].view() for j in reversed(engine.recent) if j in engine.jobs)
    return EngineSnapshot(
        taken_at=time.time(), uptime_s=now - engine.started_at,
        source=engine.probe.source, simulated=engine.probe.simulated,
        driver_version=engine.probe.driver_version, notice=engine.notice,
        gpus=tuple(gpus), backends=tuple(backends), running=running, queued=queued,
        recent=recent, descriptor_errors=engine.descriptor_errors,
        log=tuple(engine.log_lines), stopping=engine.stopping, pid=os.getpid(),
        python=sys.version.split()[0],
    )


_USERS: dict[int, tuple[float, str]] = {}  # pid -> (create time, user name)


def _user(pid: int) -> str:
    import psutil

    try:
        proc = psutil.Process(pid)
        created = proc.create_time()
        known = _USERS.get(pid)
        if known is not None and known[0] == created:
            return known[1]
        name = proc.username()
    except (psutil.Error, KeyError, OSError):
        return "?"
    if len(_USERS) > 4096:
        _USERS.clear()
    _USERS[pid] = (created, name)
    return name


def gpu_processes(engine: Engine) -> dict[int, tuple[GpuProcess, ...]]:
    """The processes on each GPU at the last process sample, largest first, each named by
    the backend whose worker (or a descendant of it, or a stopped one not yet gone) it is, as
    the engine attributed it for the ledger; else foreign."""
    owners = engine.gpu_owners
    out: dict[int, list[GpuProcess]] = {}
    for p in engine.gpu_processes:
        out.setdefault(p.gpu_index, []).append(GpuProcess(p.pid, p.used_mib, _user(p.pid),
                                                          owners.get(p.pid)))
    return {gpu: tuple(sorted(ps, key=lambda x: -(x.used_mib or 0)))
            for gpu, ps in out.items()}
