"""Refusal at submit time: ``check_submit(snapshot, backend, config) -> reason | None``.

A job that could never run, or that would overflow the queue, is refused before it is
accepted, with a message that names the numbers. Permanent reasons (unknown backend, no
allowed GPU, too big for every allowed GPU) come before the transient one (queue full).
"""

from __future__ import annotations

from supervisor.scheduler.model import SchedulerConfig, Snapshot

_DEFAULT = SchedulerConfig()


def check_submit(
    snapshot: Snapshot, backend: str, config: SchedulerConfig = _DEFAULT, *, kind: str = "job"
) -> str | None:
    """Why a new job for ``backend`` must be refused now, or None to accept it.

    Usable memory of a GPU is total - reserve (the reserve is never handed out), so a
    backend whose peak + safety exceeds that on every allowed GPU is refused: the scheduler
    could never start it. An unmeasured backend (peak unknown), and a ``calibration`` (it
    runs alone and measures), only need an allowed GPU.
    """
    info = snapshot.backends.get(backend)
    if info is None:
        known = ", ".join(sorted(snapshot.backends)) or "none"
        return f"unknown backend {backend!r} (known: {known})"
    gpus = snapshot.gpus
    if info.allowed_gpus is not None:
        allowed_ids = set(info.allowed_gpus)
        gpus = tuple(g for g in gpus if g.index in allowed_ids)
    if not gpus:
        present = ", ".join(f"GPU{g.index}" for g in snapshot.gpus) or "none"
        wanted = (
            "any GPU"
            if info.allowed_gpus is None
            else ", ".join("the host device" if i < 0 else f"GPU{i}"
                           for i in info.allowed_gpus) or "no GPU"
        )
        return f"{backend} allows {wanted} but none of them is present (present: {present})"
    if info.peak_mib is not None and kind == "job":
        need = info.holds_mib(1)
        largest = max(gpus, key=lambda g: (g.usable_mib, -g.index))
        if need > largest.usable_mib:
            detail = (
                f" ({largest.usable_mib} usable after its {largest.reserve_mib} MiB reserve)"
                if largest.reserve_mib
                else ""
            )
            return (
                f"{backend} needs {info.peak_mib} MiB at peak (+{info.safety_mib} safety) but "
                f"the largest allowed GPU has {largest.total_mib} MiB{detail}"
            )
    depth = len(snapshot.queue)
    if depth >= config.max_queue_depth:
        return f"queue full: {depth} jobs waiting; try again later or raise max_queue_depth"
    return None
