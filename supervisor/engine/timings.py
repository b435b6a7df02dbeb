"""How long each backend's loads, wakes and jobs took, kept across an engine restart.

The engine schedules by what it measured: a backend's reload cost is the mean of its measured
loads (``admission.reload_cost_s``), its wake cost likewise, and its jobs' expected time what
the planner's ``Learner`` saw them take. Kept in memory only, a restart forgot them all: until
each backend had loaded and run once again, the engine used priors (a reload of 1 s, a job
never run taken at twice its victims' slowest reload), and issue 28's holds — how long batch
work waits behind a chat — read those guesses. A big model that has not run since the restart
is exactly the one a batch waits on.

:class:`Timings` owns the file (``Paths.timings_path``, JSON written atomically, mode 0600):
per backend, its last load and wake times, its mean job time and last run times, and a hash
of its launch (``reload.LAUNCH_FIELDS``: command, cwd, env; never their values). At start
(:meth:`Timings.restore`) a backend whose launch is unchanged gets its figures back; one whose
launch changed starts from its priors, as a new model should (a reload that changes it does
the same in a running engine: ``Engine._forget_times``; while a worker of its old launch
runs on, it has no entry). Entries of backends not configured now are carried over as they
were (at most ``OTHERS_KEPT``), as are those of backends a reload removes
(:meth:`Timings.retire`), and given back when a reload adds such a backend again
(:meth:`Timings.adopt`): a start with one descriptor broken does not lose its model's times.

It is soft state: a file that cannot be read, or an entry that is not figures (not a list of
seconds within ``units.MAX_DURATION_S``), is said in one line and ignored, and the engine
measures again; a write that fails is logged, never raised. Writes coalesce
(:meth:`Timings.save`: at most one per ``SAVE_EVERY_S``, only when a figure changed — a
revision count each, so an unchanged engine costs nothing — and at once when the engine
stops), so a ``kill -9`` loses at most that much. Bounded: the file is read up to
``MAX_BYTES``. Memory figures are not kept here: a model's peak is measured again after a
restart, or declared (a calibration writes it to the descriptor's overlay), never taken from
a file that may be older than the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..atomicfile import write_atomic
from ..errors import InvalidRequest
from ..paths import open_private
from ..scheduler.expect import RUNS_KEPT, Learner
from ..units import MAX_DURATION_S
from ..validate import check_seconds
from .reload import LAUNCH_FIELDS
from .runtime import TIMES_KEPT, BackendRuntime

log = logging.getLogger(__name__)

VERSION = 1
SAVE_EVERY_S = 30.0
MAX_BYTES = 1 << 20
OTHERS_KEPT = 256  # entries of backends not configured now, carried over
KEPT = {"loads": TIMES_KEPT, "wakes": TIMES_KEPT, "runs": RUNS_KEPT}


def launch_fingerprint(rt: BackendRuntime) -> str:
    """A hash of what starts ``rt``'s workers: another command, directory or environment is
    another model, maybe, and its figures are not this one's."""
    spec = rt.spec
    parts = [repr(getattr(spec, name)) if name != "env" else
             repr(sorted(getattr(spec, name).items())) for name in LAUNCH_FIELDS]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _seconds(value: Any) -> float | None:
    """``value`` as seconds (a number, finite, 0 to ``MAX_DURATION_S``); None if it is not
    (a huge or infinite figure would make every sum of them infinite)."""
    try:
        return check_seconds(value, "a time", maximum=MAX_DURATION_S, allow_zero=True)
    except InvalidRequest:
        return None


def _entry(value: Any) -> dict[str, Any] | None:
    """One backend's entry, its figures checked (the newest of each kind that it keeps);
    None if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("launch"), str):
        return None
    out: dict[str, Any] = {"launch": value["launch"]}
    for kind, kept in KEPT.items():
        figures = value.get(kind, [])
        if not isinstance(figures, list):
            return None
        checked = [_seconds(v) for v in figures[-kept:]]
        if any(s is None for s in checked):
            return None
        out[kind] = checked
    if ("job_s" in value) != bool(out["runs"]):
        return None  # (a mean with its runs, or neither)
    if out["runs"]:
        out["job_s"] = _seconds(value["job_s"])
        if out["job_s"] is None:
            return None
    return out


def _read(path: Path) -> bytes:
    """At most ``MAX_BYTES`` + 1 bytes of the file: a regular file of ours, never through a
    link (``open_private``; a FIFO put there neither blocks the start nor is read)."""
    fd = open_private(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        return handle.read(MAX_BYTES + 1)


def _why(exc: BaseException) -> str:
    """An error's reason in a few words (not the path again, nor Python's advice)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).split(";")[0]


class Timings:
    """The file of measured times (see the module doc); ``path`` None keeps none."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._others: dict[str, dict[str, Any]] = {}  # backend not configured -> its entry
        self._stale = False  # the file holds entries no longer good: rewrite it
        self._written: str | None = None  # the text this engine last wrote
        self._seen: tuple[Any, ...] | None = None  # the revisions that text was made of
        self._next_save = -math.inf  # monotonic: the first change is written at once
        self._failing = False  # the last write failed (and was said)

    def restore(self, runtimes: Iterable[BackendRuntime], learner: Learner) -> list[str]:
        """Give each backend the figures a previous engine measured of it (its launch
        unchanged): its load and wake times, and ``learner`` its job times. What to say."""
        if self.path is None:
            return []
        try:
            raw = _read(self.path)
            if len(raw) > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            data = json.loads(raw)
            if not isinstance(data, dict) or type(data.get("version")) is not int \
                    or data["version"] != VERSION or not isinstance(data.get("backends"), dict):
                raise ValueError(f"not a version {VERSION} timings file")
        except FileNotFoundError:
            return []
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
            self._stale = True
            return [f"cannot read the measured load and job times from {self.path} "
                    f"({_why(exc)}); the engine measures them again"]
        said: list[str] = []
        odd: list[str] = []
        configured = {rt.spec.name: rt for rt in runtimes}
        for name, value in data["backends"].items():
            entry = _entry(value)
            if entry is None:
                odd.append(name)
                continue
            rt = configured.get(name)
            if rt is None:
                if len(self._others) < OTHERS_KEPT:
                    self._others[name] = entry
            elif not self._give(rt, entry, learner):
                said.append(f"{name}: its command, directory or environment changed since "
                            "its load and job times were measured; measured again")
        if odd:
            shown = ", ".join(sorted(str(n)[:40] for n in odd)[:5])
            more = f" and {len(odd) - 5} more" if len(odd) > 5 else ""
            said.append(f"{self.path}: the measured times of {shown}{more} are not seconds; "
                        "those are measured again")
        self._stale = bool(said)
        if not said:  # (the file as this engine would write it: no rewrite at its first tick)
            text, _ = self._text(list(configured.values()), learner)
            if text.encode() == raw:
                self._written = text
        return said

    def retire(self, rt: BackendRuntime, learner: Learner) -> None:
        """A backend a reload removes: its figures are carried over (``adopt`` gives them back
        if a reload adds it again, as a restart's ``restore`` would)."""
        entry = self._entry_of(rt, learner.runs())
        if entry is None:
            self._others.pop(rt.spec.name, None)
        elif rt.spec.name in self._others or len(self._others) < OTHERS_KEPT:
            self._others[rt.spec.name] = entry
            self._stale = True  # (to be written, though no backend configured has figures)

    def adopt(self, rt: BackendRuntime, learner: Learner) -> None:
        """A backend added by a reload: the figures the file had of it (carried over, not
        configured at start), if its launch is the same."""
        entry = self._others.pop(rt.spec.name, None)
        if entry is not None and not self._give(rt, entry, learner):
            self._stale = True

    @staticmethod
    def _give(rt: BackendRuntime, entry: dict[str, Any], learner: Learner) -> bool:
        """``rt`` gets ``entry``'s figures if its launch is the one they were measured with."""
        if entry["launch"] != launch_fingerprint(rt):
            return False
        rt.measures.restore_times(entry["loads"], entry["wakes"])
        if entry["runs"]:
            learner.restore(rt.spec.name, entry["job_s"], entry["runs"])
        return True

    def save(self, runtimes: Iterable[BackendRuntime], learner: Learner, now: float, *,
             force: bool = False) -> None:
        """Write the figures if they changed since the last write, at most once per
        ``SAVE_EVERY_S`` (``now``: a monotonic clock) unless ``force`` (the engine stops)."""
        if self.path is None or (not force and now < self._next_save):
            return
        rts = list(runtimes)
        seen = (learner.revision,
                tuple((rt.spec.name, rt.measures.times_revision) for rt in rts))
        if seen == self._seen and not self._stale:
            return
        text, measured = self._text(rts, learner)
        if text == self._written or not (measured or self._stale or self._written):
            self._seen = seen
            return
        self._next_save = now + SAVE_EVERY_S
        try:
            write_atomic(self.path, text, mode=0o600)
        except OSError as exc:  # the figures hold in memory; only a restart forgets them
            if not self._failing:  # (said once; tried again every SAVE_EVERY_S)
                log.warning("cannot record the measured load and job times in %s: %s",
                            self.path, _why(exc))
            self._failing = True
        else:
            self._written, self._seen, self._stale, self._failing = text, seen, False, False

    @staticmethod
    def _entry_of(rt: BackendRuntime, runs: dict[str, tuple[float, tuple[float, ...]]]
                  ) -> dict[str, Any] | None:
        """``rt``'s entry in the file; None while it has no figures of its launch (none
        measured, or a worker of its old launch still runs: what it measures is not)."""
        m, name = rt.measures, rt.spec.name
        mean, kept = runs.get(name, (None, ()))
        if m.old_launch_worker is not None or not (m.load_times or m.wake_times or kept):
            return None
        entry: dict[str, Any] = {"launch": launch_fingerprint(rt), "loads": list(m.load_times),
                                 "wakes": list(m.wake_times), "runs": list(kept)}
        if mean is not None:
            entry["job_s"] = mean
        return entry

    def _text(self, runtimes: list[BackendRuntime], learner: Learner) -> tuple[str, bool]:
        """The file's text, and whether a backend configured now has figures in it."""
        runs = learner.runs()
        backends: dict[str, Any] = {}
        for rt in runtimes:
            entry = self._entry_of(rt, runs)
            if entry is not None:
                backends[rt.spec.name] = entry
        measured = bool(backends)
        for name, entry in self._others.items():
            backends.setdefault(name, entry)
        return json.dumps({"version": VERSION, "backends": backends}, indent=1,
                          sort_keys=True) + "\n", measured
