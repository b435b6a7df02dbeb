"""The engine's settings: its limits, its pace, and what it keeps (one dataclass, defaults that
suit a desk; ``vramtui --serve`` reads some of them from flags and ``config.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

from .. import validate
from .rules import YieldRule


def default_sleep_host_budget_mib() -> int:
    """Half of the host's memory: what sleeping workers' weights may take there at most."""
    return int(psutil.virtual_memory().total // 2 // (1024 * 1024))


@dataclass
class EngineConfig:
    reserve_mib: int = 256  # kept free on every GPU for the driver and foreign processes
    gpus: str = "auto"  # the devices when --gpus is not given (config.yaml's engine: gpus)
    host_reserve_mib: int = 1024  # the host device leaves this to the desktop and the engine
    max_queue_depth: int = 512
    patience_factor: float = 4.0  # see SchedulerConfig: batching against switch costs
    max_patience_s: float = 300.0  # the hard bound on how long a job first in line is passed
    aging_interval_s: float = 60.0
    recent_jobs: int = 200
    cancel_grace_s: float = 5.0
    tick_s: float = 0.5
    sample_hz: float = 10.0  # GPU devices and processes: the memory ledger's eyes
    ping_interval_s: float = 1.0  # every live worker is pinged this often
    journal: bool = True  # jobs survive a crash of the engine (SQLite, WAL)
    keep_finished: int = 1000  # finished results kept in the journal…
    keep_age_s: float = 7 * 86400  # …for at most this long
    # What one job may make the engine hold (see supervisor.validate and the README): its
    # request, all queued requests together, and its result (data, or stream chunks in all);
    # a result over max_result_bytes fails the job with a reason saying so.
    max_payload_bytes: int = 64 * 1024 * 1024
    max_queued_bytes: int = 1024 * 1024 * 1024
    max_result_bytes: int = field(default_factory=validate.default_max_result_bytes)
    # Results of finished jobs kept in memory, all together (the oldest go first; with the
    # journal they stay retrievable from it).
    max_recent_result_bytes: int = 256 * 1024 * 1024
    # Host memory that sleeping workers may take in all (their weights moved out of the
    # GPU); a sleep that would take more is a stop instead.
    sleep_host_budget_mib: int = field(default_factory=default_sleep_host_budget_mib)
    # Strangers (processes on a GPU that are not ours): how long one must stay before memory
    # is held back for it, and be gone before it is taken again (see scheduler/strangers.py);
    # a yield_when rule's program likewise, before the rule yields its GPU and resumes it.
    others_arrive_s: float = 3.0
    others_leave_s: float = 3.0
    # "wait": running jobs finish even on a GPU others over-commit (the default); "cancel":
    # they are cancelled once it has stayed over for CANCEL_AFTER_S with no idle model left.
    others_policy: str = "wait"
    others_cancel_after_s: float = 3.0
    yield_when: tuple[YieldRule, ...] = ()  # yield a GPU while a program runs (rules.py)
    gpu_reserve_mib: dict[int, int] = field(default_factory=dict)  # per GPU, over reserve_mib


def reserve_problem(reserve: dict[int, int], totals: dict[int, int]) -> str | None:
    """Why ``engine.reserve`` (GPU -> MiB kept free) cannot be kept on these devices (GPU ->
    size in MiB), in one line; None when it can (a GPU it names that is not here is
    :func:`reserve_unknown`'s, a warning: a config may be shared by machines, or run with
    ``--gpus`` naming fewer)."""
    for gpu, mib in sorted(reserve.items()):
        total = totals.get(gpu)
        if total is not None and mib >= total:
            return (f"config.yaml engine.reserve keeps {mib} MiB free on GPU{gpu}, which has "
                    f"{total} MiB: nothing could ever run there; keep less free")
    return None


def reserve_unknown(reserve: dict[int, int], totals: dict[int, int]) -> str | None:
    """The line saying which GPUs ``engine.reserve`` names that are not here (ignored)."""
    unknown = sorted(set(reserve) - set(totals))
    if not unknown:
        return None
    have = ", ".join(f"GPU{i}" for i in sorted(totals)) or "none"
    return (f"config.yaml engine.reserve names {', '.join(f'GPU{g}' for g in unknown)}, "
            f"which this engine does not have (it has {have}): ignored")
