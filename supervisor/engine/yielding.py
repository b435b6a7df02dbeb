"""Yielded GPUs: handed over to programs the engine does not manage (``vramtui yield``).

:class:`Yields` owns which GPUs are yielded, who asked, since and until when, and their file
(``Paths.yields_path``, JSON written atomically), so that a yielded GPU stays yielded across
an engine restart.  A yielded GPU is closed to admission like a draining one: its running jobs
finish (or, yielded ``now``, are cancelled), its idle and sleeping workers are evicted, and
queued jobs wait — or run on another GPU they may use; none is dropped.  It opens again when
resumed, or by itself once ``until`` has passed (:meth:`Yields.expire`, from the engine's
ticker).  A ``yield_when`` rule (:mod:`.rules`) yields and resumes through the same methods,
marked ``rule``. The same file keeps what a person waived of those rules (GPU -> the rules'
labels: :meth:`Yields.keep_waivers`), so that a resume overriding a rule outlives a restart too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..atomicfile import write_atomic
from ..errors import InvalidRequest, NothingToDo, UnknownGpu
from ..results import YieldInfo
from ..validate import YIELD_MAX_S as MAX_FOR_S

log = logging.getLogger(__name__)


def announce(y: YieldInfo, now: bool) -> str:
    """The event log's line for a GPU just yielded."""
    return f"{y.text}: nothing of ours starts there, " + (
        "its jobs are cancelled" if now else "running jobs finish") + \
        " and its models are unloaded"


class Yields:
    """The yielded GPUs (see the module doc)."""

    def __init__(self, path: Path | None, wall: Callable[[], float] = time.time,
                 device: Callable[[int], str] = lambda gpu: "") -> None:
        self.path = path
        self.wall = wall
        # What device an index is (its kind and name): a yield recorded for GPU0 does not
        # close another device 0 after a restart (the simulated GPU, then --gpus host).
        self.device = device
        self.held: dict[int, YieldInfo] = {}
        self.waived: dict[int, tuple[str, ...]] = {}  # GPU -> rules a person overrode there

    # -- what the engine reads -----------------------------------------------------------------
    def get(self, gpu: int) -> YieldInfo | None:
        return self.held.get(gpu)

    def closed(self) -> dict[int, str]:
        """GPU -> why nothing of ours may run there (the waiting jobs' reason)."""
        return {g: y.text for g, y in self.held.items()}

    # -- changes -------------------------------------------------------------------------------
    def give(self, gpus: Sequence[int], present: Iterable[int], *, for_s: float | None = None,
             now: bool = False, by: str = "", rule: bool = False) -> tuple[YieldInfo, ...]:
        """Yield ``gpus`` (none: every GPU); what each is now. UnknownGpu for a GPU that is
        not there, InvalidRequest for a duration that is not a positive, finite time."""
        targets = self._targets(gpus, present)
        if for_s is not None and not (0 < for_s <= MAX_FOR_S and math.isfinite(for_s)):
            raise InvalidRequest(f"a yield lasts more than 0 s and at most a year, not "
                                 f"{for_s!r} s (leave the duration out to yield until resumed)")
        since = self.wall()
        until = None if for_s is None else since + for_s
        out = []
        for g in targets:
            old = self.held.get(g)
            if old is not None and rule and not old.rule:
                out.append(old)  # a person's yield stands; the rule does not shorten it
                continue
            y = YieldInfo(g, by or "asked", old.since if old is not None else since, until,
                          now or (old is not None and old.now), rule)
            self.held[g] = y
            out.append(y)
        self._save()
        return tuple(out)

    def take_back(self, gpus: Sequence[int], present: Iterable[int]) -> tuple[int, ...]:
        """Resume ``gpus`` (none: every yielded GPU); the GPUs resumed. UnknownGpu for one
        that is not there, NothingToDo for one not yielded (or none, when none is)."""
        if not gpus:
            if not self.held:
                raise NothingToDo("no GPU is yielded: nothing to resume")
            gpus = sorted(self.held)
        targets = self._targets(gpus, present)
        idle = [g for g in targets if g not in self.held]
        if idle:
            yielded = ", ".join(f"GPU{g}" for g in sorted(self.held)) or "none"
            raise NothingToDo(f"GPU{idle[0]} is not yielded (yielded now: {yielded}); "
                              "nothing to resume")
        for g in targets:
            del self.held[g]
        self._save()
        return tuple(targets)

    def keep_waivers(self, waived: dict[int, tuple[str, ...]]) -> None:
        """Record the rules' waivers as they stand (``Rules.waivers``), when they changed."""
        if waived != self.waived:
            self.waived = dict(waived)
            self._save()

    def expire(self) -> list[YieldInfo]:
        """Drop the yields whose time is up; those dropped."""
        now = self.wall()
        gone = [y for y in self.held.values() if y.until is not None and y.until <= now]
        for y in gone:
            del self.held[y.gpu]
        if gone:
            self._save()
        return gone

    # -- the file ------------------------------------------------------------------------------
    def load(self) -> list[str]:
        """Read the file a previous engine left (its yields still in time); what to say."""
        if self.path is None:
            return []
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            entries = raw["yielded"] if isinstance(raw, dict) else None
            if not isinstance(entries, list):
                raise ValueError("no 'yielded' list")
            loaded = [YieldInfo(int(e["gpu"]), str(e["by"]), float(e["since"]),
                                None if e.get("until") is None else float(e["until"]),
                                bool(e.get("now")), bool(e.get("rule"))) for e in entries]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:
            return [f"cannot read the yielded GPUs from {self.path} ({exc}); every GPU is "
                    "open: yield again where needed"]
        self.waived = self._waivers_in(raw)
        now = self.wall()
        recorded = {int(e["gpu"]): e.get("device") for e in entries}
        other = [y for y in loaded if recorded[y.gpu] not in (None, self.device(y.gpu))]
        self.held = {y.gpu: y for y in loaded if (y.until is None or y.until > now)
                     and y not in other}
        if other:
            self._save()
        return [f"{y.text}: still yielded after the restart" for y in self.held.values()] + [
            f"GPU{y.gpu} was yielded on {recorded[y.gpu]}; it is {self.device(y.gpu)} now: "
            "open (yield it again if needed)" if self.device(y.gpu) else
            f"GPU{y.gpu} was yielded on {recorded[y.gpu]}; there is no GPU{y.gpu} now: its "
            "yield is dropped" for y in other]

    def _waivers_in(self, raw: dict[str, Any]) -> dict[int, tuple[str, ...]]:
        """The waivers a previous engine recorded, on the same devices (an unreadable entry
        is dropped: a waiver lost costs a yield that a person can resume again)."""
        out: dict[int, tuple[str, ...]] = {}
        entries = raw.get("waived")
        for e in entries if isinstance(entries, list) else ():
            with contextlib.suppress(KeyError, TypeError, ValueError, OverflowError):
                gpu, labels = int(e["gpu"]), e["rules"]
                if e.get("device") in (None, self.device(gpu)) and isinstance(labels, list):
                    out[gpu] = tuple(str(label) for label in labels)
        return out

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"yielded": [{"gpu": y.gpu, "by": y.by, "since": y.since, "until": y.until,
                             "now": y.now, "rule": y.rule, "device": self.device(y.gpu)}
                            for y in self.held.values()],
                "waived": [{"gpu": g, "rules": list(labels), "device": self.device(g)}
                           for g, labels in self.waived.items()]}
        try:
            write_atomic(self.path, json.dumps(data, indent=1) + "\n", mode=0o600)
        except OSError as exc:  # the yield holds in memory; only a restart would forget it
            log.warning("cannot record the yielded GPUs in %s: %s", self.path, exc)

    @staticmethod
    def _targets(gpus: Sequence[int], present: Iterable[int]) -> list[int]:
        have = sorted(present)
        targets = sorted(dict.fromkeys(gpus)) if gpus else have
        missing = [g for g in targets if g not in have]
        if missing:
            names = ", ".join(f"GPU{g}" for g in have) or "none"
            raise UnknownGpu(f"unknown GPU {missing[0]}: there is no GPU{missing[0]} "
                             f"(present: {names})")
        return targets
