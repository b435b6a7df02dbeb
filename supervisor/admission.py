"""How a job's fit is decided: from what the engine knows to the scheduler's snapshot.

This is the one place that turns the engine's state into the inputs of the pure decision:

1. each backend's admission figures (``ledger.figures``: declared, calibrated and learned
   figures merged) become a ``BackendInfo``;
2. each live worker, ghost of a stopped worker and calibration run becomes a ledger
   ``Holder`` (and what a worker was seen to hold during a job that has ended since, until
   the next sample, a ``settling`` one: counted, and coming back like a ghost's), and
   ``ledger.book`` adds them up per GPU beside the foreign memory;
3. the ``Book`` gives every ``WorkerInfo.reserved_mib`` and every GPU's foreign and leaving
   memory: the scheduler's ``Snapshot``.

A sleeping worker is a holder of its own kind (``asleep``), counted at what it keeps asleep —
measured once it slept (what the device shows of its processes), never zero — and never below
what it is seen to hold; while its sleep is under way, what it gives back is still counted, as
memory on its way back (a ``settling`` holder).  A worker waking up is counted whole, as one
that starts.

``decide_inputs`` is pure (plain facts in, ``(Snapshot, Book)`` out), so the engine, the
trace simulator (``supervisor.tracesim``) and tests build the very same snapshot from their
own state, and ``plan(snapshot, now)`` decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

from .backends.http import fixed_address
from .backends.schema import HOST_GPU, BackendSpec, VramSpec
from .ledger import Book, Declared, Device, Holder, Learned, Reserve, book, figures, reserve_on
from .scheduler.expect import Expectations
from .scheduler.model import BackendInfo, GpuState, QueuedJob, Snapshot, WorkerInfo

#: What a reload costs before any load was measured, when the descriptor does not say.
DEFAULT_RELOAD_COST_S = 1.0
#: What a wake costs, as a part of a reload, before any wake was measured, when the
#: descriptor gives no ``wake_cost``.
DEFAULT_WAKE_FRACTION = 0.1
#: What a sleeping worker keeps on its GPU before a sleep of it was measured, when the
#: descriptor says neither ``sleep.residual`` nor ``vram.context`` (a CUDA context stays).
DEFAULT_SLEEP_RESIDUAL_MIB = 512


def reload_cost_s(prior_s: float | None, loads_s: Iterable[float]) -> float:
    """What a (re)load costs: the mean of the measured start-to-ready times; before any was
    measured, the descriptor's ``reload_cost`` (else ``DEFAULT_RELOAD_COST_S``), the prior."""
    loads = list(loads_s)
    if loads:
        return sum(loads) / len(loads)
    return prior_s if prior_s is not None else DEFAULT_RELOAD_COST_S


def wake_cost_s(prior_s: float | None, wakes_s: Iterable[float], reload_s: float) -> float:
    """What a wake costs: the mean of the measured wakes; before any, the descriptor's
    ``wake_cost``, else ``DEFAULT_WAKE_FRACTION`` of a reload."""
    wakes = list(wakes_s)
    if wakes:
        return sum(wakes) / len(wakes)
    return prior_s if prior_s is not None else reload_s * DEFAULT_WAKE_FRACTION


def sleep_figures(spec: BackendSpec, resident_mib: int, residual_mib: int | None = None,
                  host_mib: int | None = None) -> tuple[int, int]:
    """(what a worker of ``spec`` keeps on its GPU asleep, the host memory its sleep takes):
    measured when given, else the descriptor's ``sleep`` priors, else a CUDA context
    (``vram.context``, else ``DEFAULT_SLEEP_RESIDUAL_MIB``) and the weights it gives back
    (level 1 moves them to host memory)."""
    prior = spec.sleep
    if residual_mib is None:
        residual_mib = prior.residual_mib
        if residual_mib is None:
            context = spec.vram.context_mib
            residual_mib = context if context is not None else DEFAULT_SLEEP_RESIDUAL_MIB
    if host_mib is None:
        host_mib = prior.host_mib
        if host_mib is None:
            host_mib = 0 if prior.level == 2 else max(0, resident_mib - residual_mib)
    return residual_mib, host_mib


def declared(vram: VramSpec) -> Declared:
    """The figures a descriptor gives: the peak, and the resident part when the split is known."""
    peak = vram.peak
    resident: int | None = None
    if vram.weights_mib is not None:
        resident = vram.weights_mib + (vram.context_mib or 0)
    elif peak is not None and vram.activation_mib is not None:
        resident = max(0, peak - vram.activation_mib)
    return Declared(peak, resident)


def backend_info(spec: BackendSpec, learned: Learned, reload_cost_s: float | None = None,
                 *, distrusted: bool = False, wake_s: float | None = None,
                 sleep_mib: tuple[int | None, int | None] = (None, None)) -> BackendInfo:
    """``spec`` as admission sizes it. A ``distrusted`` backend (it was caught above its
    figures) is sized by what was measured of it, its declared peak only a floor: it runs
    alone until a job of it was sampled often enough (``learned.peak_confirmed``). ``wake_s``
    and ``sleep_mib`` (residual, host) are what was measured of its wakes and sleeps (None:
    the descriptor's priors, see ``wake_cost_s`` and ``sleep_figures``)."""
    claimed = declared(spec.vram)
    if distrusted:
        peak, activation = figures(Declared(), learned)
        if peak is not None and claimed.peak_mib is not None and claimed.peak_mib > peak:
            # what it resides at stays what was measured; the rest of the claim is per job
            activation = None if activation is None else activation + claimed.peak_mib - peak
            peak = claimed.peak_mib
    else:
        peak, activation = figures(claimed, learned)
    if reload_cost_s is None:
        reload_cost_s = (spec.reload_cost_s if spec.reload_cost_s is not None
                         else DEFAULT_RELOAD_COST_S)
    if wake_s is None:
        wake_s = wake_cost_s(spec.wake_cost_s, (), reload_cost_s)
    resident = 0 if peak is None else peak - (activation or 0)
    residual, host = sleep_figures(spec, resident, *sleep_mib)
    return BackendInfo(
        name=spec.name, peak_mib=peak, activation_mib=activation, safety_mib=spec.safety_mib,
        priority=spec.priority, allowed_gpus=spec.gpus, concurrency=spec.concurrency,
        pinned=spec.pinned, reload_cost_s=reload_cost_s, wake_cost_s=wake_s,
        sleep_residual_mib=residual, sleep_host_mib=host,
        address=fixed_address(spec.http.url) if spec.http is not None else None,
    )


def placed(info: BackendInfo, host_gpus: Sequence[int]) -> BackendInfo:
    """``info`` with ``gpus: [host]`` turned into the host device's index (kept as is, and so
    present nowhere, when there is no host device)."""
    allowed = info.allowed_gpus
    if allowed is None or HOST_GPU not in allowed or not host_gpus:
        return info
    return replace(info, allowed_gpus=tuple(
        dict.fromkeys(g for a in allowed for g in (host_gpus if a == HOST_GPU else (a,)))))


class _Admitted(Protocol):
    """A job admitted to a worker that still loads, as ``loading_facts`` reads it."""

    @property
    def priority(self) -> int: ...
    @property
    def submitted_at(self) -> float: ...
    @property
    def blocked_since(self) -> float | None: ...


class Loading(NamedTuple):
    """What a worker loads for, as ``WorkerFacts`` (and ``sched.WorkerInfo``) carry it."""

    loading_for: int | None = None
    loading_since: float | None = None
    loading_submitted_at: float | None = None


NOT_LOADING = Loading()


def loading_facts(jobs: Sequence[_Admitted]) -> Loading:
    """The facts of a worker loading for ``jobs`` (none begun): their highest priority, when
    the first of them was first found blocked (else submitted), and when the first of them
    was submitted; none for none."""
    if not jobs:
        return NOT_LOADING
    return Loading(max(j.priority for j in jobs),
                   min(j.submitted_at if j.blocked_since is None else j.blocked_since
                       for j in jobs),
                   min(j.submitted_at for j in jobs))


@dataclass(frozen=True, slots=True)
class WorkerFacts:
    """One live worker process of a backend. ``state`` is the scheduler's word for it
    (starting, initializing, ready, busy, asleep, stopping); ``exclusive``: it was spawned with
    an unknown footprint and holds its GPU whole. An ``asleep`` worker is counted at
    ``sleep_mib`` (what it keeps: measured, or the backend's figure while ``falling`` asleep,
    when what it gives back is still counted as on its way back); ``can_sleep``: it may be put
    to sleep rather than stopped; ``loading_for``, ``loading_since``, ``loading_submitted_at``
    ``running_priority`` and ``leaves_at``: see ``WorkerInfo``."""

    name: str
    backend: str
    gpu: int
    state: str
    jobs: int = 0
    exclusive: bool = False
    observed_mib: int | None = None
    idle_since: float | None = None
    accepting: bool = True
    over_declared: bool = False  # seen above the figures it was admitted with
    settling: bool = False  # a job of it ended since it was last seen: its memory comes back
    pids: frozenset[int] = frozenset()
    sleep_mib: int | None = None
    falling: bool = False
    can_sleep: bool = False
    loading_for: int | None = None
    loading_since: float | None = None
    loading_submitted_at: float | None = None
    running_priority: int | None = None
    leaves_at: float | None = None


@dataclass(frozen=True, slots=True)
class GhostFacts:
    """A worker that exited, whose processes have not been seen to leave the GPU yet."""

    name: str
    backend: str
    gpu: int
    mib: int  # what it held when it exited
    observed_mib: int | None = None
    pids: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class RunFacts:
    """A calibration run: a fresh worker alone on ``gpu``."""

    name: str
    backend: str
    gpu: int
    observed_mib: int | None = None
    pids: frozenset[int] = frozenset()


def holders(
    devices: Sequence[Device],
    backends: Mapping[str, BackendInfo],
    workers: Iterable[WorkerFacts],
    ghosts: Iterable[GhostFacts] = (),
    runs: Iterable[RunFacts] = (),
    *,
    reserve_mib: Reserve = 0,
    foreign: Mapping[int, int] | None = None,
) -> list[Holder]:
    """Every ledger holder: live workers by their figures, ghosts by what they held, runs by
    their whole GPU."""
    foreign = foreign or {}
    whole = {d.index: max(0, d.total_mib - reserve_on(reserve_mib, d.index)
                          - int(foreign.get(d.index, 0)))
             for d in devices}
    out: list[Holder] = []
    for w in workers:
        info = backends.get(w.backend)
        if w.exclusive or info is None or info.peak_mib is None:
            figure = whole.get(w.gpu, 0)
        else:
            figure = info.holds_mib(w.jobs)
        if w.state == "asleep" and w.sleep_mib is not None:
            out.extend(_asleep(w, figure))
            continue
        observed = w.observed_mib
        if w.settling and observed is not None and observed > figure:
            # Seen while a job ran that has ended since: what it held above its figures is
            # still counted, as memory on its way back until the next sample says.
            out.append(Holder(f"{w.name}~settling", w.backend, w.gpu, "settling",
                              observed - figure))
            observed = None
        out.append(Holder(w.name, w.backend, w.gpu, "worker", figure, observed, w.jobs,
                          w.pids))
    for gh in ghosts:
        out.append(Holder(gh.name, gh.backend, gh.gpu, "ghost", gh.mib, gh.observed_mib, 0,
                          gh.pids))
    for r in runs:
        out.append(Holder(r.name, r.backend, r.gpu, "calibration", whole.get(r.gpu, 0),
                          r.observed_mib, 1, r.pids))
    return out


def _asleep(w: WorkerFacts, figure: int) -> list[Holder]:
    """A sleeping worker: what it keeps (never less than it is seen to hold); while its sleep
    is under way, the rest of what it held as memory on its way back."""
    keeps = w.sleep_mib or 0
    if not w.falling:
        return [Holder(w.name, w.backend, w.gpu, "asleep", keeps, w.observed_mib, 0, w.pids)]
    held = max(figure, w.observed_mib or 0)
    out = [Holder(w.name, w.backend, w.gpu, "asleep", keeps, None, 0, w.pids)]
    if held > keeps:
        out.append(Holder(f"{w.name}~sleeping", w.backend, w.gpu, "settling", held - keeps))
    return out


def decide_inputs(
    devices: Sequence[Device],
    backends: Mapping[str, BackendInfo],
    workers: Sequence[WorkerFacts],
    queue: Sequence[QueuedJob],
    *,
    ghosts: Sequence[GhostFacts] = (),
    runs: Sequence[RunFacts] = (),
    queued_counts: Mapping[tuple[str, str], int] | None = None,
    reserve_mib: Reserve = 0,
    foreign: Mapping[int, int] | None = None,
    draining: Iterable[int] = (),
    sleep_host_room_mib: int = 0,
    closed: Mapping[int, str] | None = None,
    expected: Expectations | None = None,
) -> tuple[Snapshot, Book]:
    """The scheduler's snapshot and the ledger's book, from the same facts; ``closed`` GPUs
    (yielded: why) are drained like ``draining`` ones, saying why."""
    accounts = book(
        devices,
        holders(devices, backends, workers, ghosts, runs, reserve_mib=reserve_mib,
                foreign=foreign),
        reserve_mib=reserve_mib, foreign=foreign,
    )
    closed = closed or {}
    draining = set(draining) | set(closed)
    leaving: dict[int, int] = {}
    for gpu in accounts.gpus.values():
        leaving[gpu.index] = sum(h.holds_mib for h in gpu.holders
                                 if h.kind in ("ghost", "settling"))
    gpus = tuple(
        GpuState(d.index, d.total_mib, d.free_mib, reserve_on(reserve_mib, d.index),
                 foreign_mib=accounts.gpus[d.index].foreign_mib,
                 draining=d.index in draining, leaving_mib=leaving.get(d.index, 0),
                 closed_why=closed.get(d.index, ""))
        for d in sorted(devices, key=lambda d: d.index)
    )
    held_by = {h.name: h for g in accounts.gpus.values() for h in g.holders}
    infos: dict[str, WorkerInfo] = {}
    for w in workers:
        h = held_by.get(w.name)
        reserved = h.holds_mib if h is not None else 0  # 0: on a GPU that is not present
        infos[w.backend] = WorkerInfo(
            backend=w.backend, gpu=w.gpu, state=w.state, active_jobs=w.jobs,
            reserved_mib=reserved, idle_since=w.idle_since, accepting=w.accepting,
            over_declared=w.over_declared or (h is not None and h.over_mib > 0),
            can_sleep=w.can_sleep and w.state == "ready" and not w.jobs,
            loading_for=w.loading_for if w.state in ("starting", "initializing") else None,
            loading_since=w.loading_since, loading_submitted_at=w.loading_submitted_at,
            running_priority=w.running_priority, leaves_at=w.leaves_at,
        )
    snapshot = Snapshot(gpus=gpus, backends=backends, workers=infos, queue=queue,
                        queued_counts=queued_counts,
                        calibrating={r.gpu: r.backend for r in runs},
                        sleep_host_room_mib=max(0, sleep_host_room_mib), expected=expected)
    return snapshot, accounts
