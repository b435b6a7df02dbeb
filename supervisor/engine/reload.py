"""Reloading the backend descriptors into a running engine, and what changed.

:class:`Descriptors` is what the engine was configured from (its descriptor layers, the
environment they expand, the errors and warnings they gave); :func:`apply` applies freshly
loaded descriptors to the worker pool: new backends join, changed ones take their new
figures at once (a changed launch command stops an idle worker, so the next job starts the
new one, and forgets its measured load, wake and job times: another command may be another
model, measured anew, as after a restart: ``.timings``), removed idle ones go; a backend
whose file now has errors keeps its previous descriptor, so one bad file never stops the rest.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..results import BackendChange, ReloadResult
from ..workers.states import WorkerState
from .runtime import BackendRuntime

if TYPE_CHECKING:
    from ..backends.loader import LoadResult
    from ..backends.schema import BackendSpec
    from ..jobs.queue import JobQueue
    from .pool import WorkerPool

LAUNCH_FIELDS = ("command", "cwd", "env")  # a running worker runs the old ones
Note = Callable[..., None]


@dataclass
class Descriptors:
    """Where the backends came from: None layers means none (nothing to reload)."""

    layers: tuple[Path, ...] | None = None
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    errors: tuple[str, ...] = ()
    # (backend, line): keys that load but are not honoured, e.g. vramd's footprint_key
    warnings: tuple[tuple[str | None, str], ...] = ()
    demo: bool = False  # the demo backends run (nothing valid is configured)
    where: str = ""  # where backends are read from, as the user named it (for ``note``)

    def note(self, configured: int) -> str | None:
        """What to say of the backends there are (``configured`` of them) now: the demo's,
        none at all, or nothing; said again after each reload, never left from the start."""
        if self.demo:
            return "no backends configured: loaded the simulated demo backends"
        if not configured and not self.errors:
            return (f"no backends: none defined in {self.where}; add one (see the README's "
                    "'Describing a backend'), then run `vramtui reload`")
        return None

    @classmethod
    def of(cls, layers: Sequence[Path] | None, environ: Mapping[str, str] | None,
           errors: tuple[str, ...], warnings: tuple[tuple[str | None, str], ...]
           ) -> Descriptors:
        return cls(tuple(layers) if layers is not None else None,
                   environ if environ is not None else os.environ, errors, warnings)


def apply(pool: WorkerPool, queue: JobQueue, descriptors: Descriptors, loaded: LoadResult,
          note: Note, evict: Callable[[BackendRuntime], None],
          forget: Callable[[BackendRuntime], None],
          retire: Callable[[BackendRuntime], None]) -> ReloadResult:
    """Apply freshly loaded descriptors (see the module doc); what changed."""
    from ..backends.errors import display_path

    added, removed, kept = [], [], []
    changed: list[BackendChange] = []
    errors = loaded.errors
    for name, spec in loaded.backends.items():
        rt = pool.get(name)
        if rt is None:
            pool.add(spec)
            added.append(name)
            continue
        diff = spec_changes(rt.spec, spec)
        if not diff:
            if rt.spec.source != spec.source:
                rt.spec = spec
            continue
        notes = _apply_change(rt, spec, diff, evict, forget)
        changed.append(BackendChange(name, tuple(diff), tuple(notes)))
    for name in [n for n in pool if n not in loaded.backends]:
        rt = pool.runtime(name)
        files = set(rt.spec.source.split(" + ")) if rt.spec.source else set()
        broken = [e for e in errors if e.backend == name
                  or (e.file is not None and str(e.file) in files)]
        waiting = sum(1 for j in queue if j.backend == name)
        if broken:
            kept.append(f"{name}: kept its previous descriptor ({broken[0]})")
        elif rt.worker is not None or rt.admitted or waiting:
            what = "a running worker" if rt.worker is not None else f"{waiting} job(s)"
            kept.append(f"{name}: no longer configured but it still has {what}; evict "
                        "it or let its jobs end, then reload again")
        else:
            retire(rt)  # (its measured times are kept apart, the planner's too)
            pool.remove(name)
            removed.append(name)
    if loaded.demo and errors:
        kept.insert(0, "the demo backends stay: no configured backend loads (fix the errors "
                    "below, then reload)")
    descriptors.errors = tuple(str(e) for e in errors)
    descriptors.demo = loaded.demo
    result = ReloadResult(tuple(added), tuple(removed), tuple(changed), tuple(kept),
                          tuple(str(e) for e in errors),
                          tuple(display_path(f) for f in loaded.layers))
    note("warning" if errors or kept else "info", "descriptors reloaded: " + result.summary())
    for line in (*kept, *result.errors):
        note("error" if line in result.errors else "warning", line)
    return result


def _apply_change(rt: BackendRuntime, spec: BackendSpec, diff: list[str],
                  evict: Callable[[BackendRuntime], None],
                  forget: Callable[[BackendRuntime], None]) -> list[str]:
    notes: list[str] = []
    old = rt.spec
    rt.spec = spec
    if rt.health.failed:
        rt.health.failed = False
        rt.health.init_failures = 0
        notes.append("its start failures are forgotten: the next job starts it again")
    if rt.measures.distrusted and old.vram != spec.vram:
        rt.measures.distrusted = False  # a new claim; what was measured still sizes it too
        notes.append("its new vram figures are used again (it had been caught above its "
                     "old ones); what was measured of it stays a floor")
    if rt.health.no_sleep is not None and old.sleep != spec.sleep:
        rt.health.no_sleep = None
        notes.append("its sleep settings changed: it may be put to sleep again")
    launch = [f for f in LAUNCH_FIELDS if getattr(old, f) != getattr(spec, f)]
    if launch:
        forget(rt)
        notes.append(f"its load and job times are measured anew ({', '.join(launch)} changed)")
    worker = rt.worker
    if launch and worker is not None:
        if not rt.admitted and worker.state in (WorkerState.READY, WorkerState.ASLEEP):
            evict(rt)
            notes.append(f"its idle worker was stopped ({', '.join(launch)} changed): the "
                         "next job starts the new one")
        else:
            notes.append(f"its busy worker runs the old {', '.join(launch)} until it is "
                         f"respawned (vramtui respawn {spec.name})")
    return notes


def _show(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "forever"
    if isinstance(value, tuple):
        return " ".join(map(str, value)) if value else "–"
    if value is None:
        return "–"
    return str(value)


def _sub_changes(prefix: str, old: Any, new: Any, unit: str = "") -> Iterable[str]:
    for f in dataclasses.fields(old):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            key = f.name.removesuffix("_mib").removesuffix("_s")
            yield f"{prefix}.{key}: {_show(a)} → {_show(b)}{unit if b is not None else ''}"


def spec_changes(old: BackendSpec, new: BackendSpec) -> list[str]:
    """One line per field that differs (env: the names only, never the values)."""
    out: list[str] = []
    for f in dataclasses.fields(old):
        name = f.name
        if name in ("name", "source"):
            continue
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        if name == "vram":
            out.extend(_sub_changes("vram", a, b, " MiB"))
        elif name == "timeouts":
            out.extend(_sub_changes("timeouts", a, b, " s"))
        elif name == "env":
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"env: {', '.join(keys)} changed")
        elif name == "calibration_request":
            out.append("calibration.request changed")
        else:
            out.append(f"{name.removesuffix('_mib').removesuffix('_s')}: {_show(a)} → "
                       f"{_show(b)}")
    return out
