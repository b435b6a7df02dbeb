"""Others: memory on the engine's GPUs that no process of ours holds, and what is said of it.

:class:`Others` owns the engine's :class:`~supervisor.scheduler.strangers.StrangerWatch` (how
much admission counts for strangers on each GPU, with hysteresis: the pure decision), who the
strangers are (pid, MiB, process name, from the monitor's last process sample and the one
attribution of processes to our workers), and the events said about them: a device found
over-committed, an idle model evicted for them ("evicted sdxl: 10.0 GiB taken by pid 4242
(blender)"), strangers gone.  It runs on the engine loop, after each process sample.

A stranger is any process on a GPU that is not one of ours (NVML's per-process list, or a
process declaring memory through ``worker_sdk.sim`` on the simulated device); memory the device
counts as used that no listed process accounts for is a stranger's too (other containers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..ledger import Book
from ..scheduler.model import Evict
from ..scheduler.strangers import StrangerWatch
from ..units import mib_text
from .config import EngineConfig
from .monitor import Monitor
from .process_facts import process_name

MAX_NAMED = 8  # strangers named per GPU (the largest); the rest are counted


@dataclass(frozen=True, slots=True)
class Stranger:
    """A process on a GPU that is not ours."""

    pid: int
    mib: int
    name: str

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.name})"


class Others:
    """Strangers on every GPU (see the module doc)."""

    def __init__(self, note: Callable[..., None], config: EngineConfig | None = None,
                 cancel: Callable[[set[int]], object] | None = None) -> None:
        config = config or EngineConfig()
        if config.others_policy not in ("wait", "cancel"):
            raise ValueError(f"others_policy: wait or cancel, not {config.others_policy!r}")
        self.watch = StrangerWatch(config.others_arrive_s, config.others_leave_s)
        self.note = note
        self.policy, self.cancel = config.others_policy, cancel
        self.cancel_after_s = config.others_cancel_after_s
        self._cancelled: set[int] = set()  # GPUs whose jobs were cancelled in this episode
        self.strangers: dict[int, tuple[Stranger, ...]] = {}  # GPU -> largest first
        self._theirs: dict[int, dict[int, int]] = {}  # GPU -> pid -> MiB: every stranger
        self._everyone: dict[int, tuple[Stranger, ...]] | None = None  # named, when asked
        self.over: dict[int, int] = {}  # GPU -> MiB over the device by what is counted
        # GPU -> the strangers last seen there and when they let go, while memory is still
        # held back for them (hysteresis): nobody holds it now
        self.left: dict[int, tuple[tuple[Stranger, ...], float]] = {}
        self._at = 0.0  # the time of the last sample taken in
        # host device -> MiB our workers placed on other devices hold there (not strangers,
        # but room taken all the same: named when an eviction makes room for it)
        self._elsewhere: dict[int, int] = {}

    @property
    def counted(self) -> dict[int, int]:
        """GPU -> MiB admission counts for strangers."""
        return self.watch.counted()

    def pressing(self) -> bool:
        """Some GPU is over-committed by strangers: a plan must run to evict."""
        return any(self.over.values())

    def observe(self, now: float, monitor: Monitor, book: Callable[[], Book]) -> None:
        """Take in the monitor's last process sample; ``book`` gives the ledger (what our
        workers hold per GPU), asked only where strangers are or were."""
        per_gpu = monitor.per_gpu()
        owners = monitor.owners
        counted = self.watch.counted()
        accounts: Book | None = None
        self._at = now
        self._everyone = None
        self._elsewhere = dict(monitor.elsewhere)
        for index, reading in sorted(monitor.readings.items()):
            now_mib = monitor.strangers_mib(index) if reading.used_mib is not None else 0
            if not now_mib and not counted.get(index):
                self.watch.observe(now, index, 0, 0, reading.total_mib)
                self._gone(index)
                continue
            if accounts is None:
                accounts = book()
            gpu = accounts.gpus.get(index)
            if now_mib:
                self.left.pop(index, None)
            elif index not in self.left:  # they just let go; memory stays held back a while
                self.left[index] = (self.strangers.get(index, ()), now)
            theirs = self._theirs[index] = {pid: mib for pid, mib in
                                            per_gpu.get(index, {}).items() if pid not in owners}
            self.strangers[index] = self._who(theirs, MAX_NAMED)
            verdict = self.watch.observe(now, index, now_mib,
                                         gpu.held_mib if gpu is not None else 0,
                                         reading.total_mib)
            was = self.over.get(index, 0)
            self.over[index] = verdict.over_mib
            if verdict.urgent or (verdict.over_mib and not was):
                self.note("warning", f"GPU{index} is over-committed: others hold "
                          f"{mib_text(verdict.now_mib)} ({self.who(index)}); evicting idle "
                          "models there and admitting nothing more until it fits")
            elif was and not verdict.over_mib and verdict.counted_mib:
                # (when nothing is held back any more, "others left" below says it all)
                self.note("info", f"GPU{index} fits again beside others "
                          f"({mib_text(verdict.counted_mib)} held back for them)")
            # idle models (or ones still letting go) are evicted first: jobs wait for them
            freeing = gpu is not None and any(
                h.kind == "ghost" or (h.kind == "worker" and not h.jobs) for h in gpu.holders)
            self._maybe_cancel(index, 0.0 if freeing else verdict.over_for_s)
            if counted.get(index) and not verdict.counted_mib:
                self.note("info", f"others left GPU{index}; its memory is ours to use again")

    def _maybe_cancel(self, index: int, over_for_s: float) -> None:
        """With the ``cancel`` policy: cancel the jobs running on a GPU that stayed over."""
        if not over_for_s:
            self._cancelled.discard(index)
        elif self.policy == "cancel" and self.cancel is not None and \
                over_for_s >= self.cancel_after_s and index not in self._cancelled:
            self._cancelled.add(index)
            self.note("warning", f"GPU{index} stayed over-committed by others "
                      f"({self.who(index)}) for {over_for_s:.1f} s: cancelling its running "
                      "jobs (others_policy: cancel)")
            self.cancel({index})

    def everyone(self) -> dict[int, tuple[Stranger, ...]]:
        """GPU -> every stranger there at the last sample, largest first: what a
        ``yield_when`` rule looks for its program in, which must find it however many others
        hold more (:attr:`strangers` names only the largest few, for the faces). Named once
        per sample, when asked."""
        if self._everyone is None:
            self._everyone = {g: self._who(theirs, None) for g, theirs in self._theirs.items()}
        return self._everyone

    def _gone(self, index: int) -> None:
        self.strangers.pop(index, None)
        self._theirs.pop(index, None)
        self.over.pop(index, None)
        self.left.pop(index, None)

    @staticmethod
    def _who(theirs: Mapping[int, int], most: int | None) -> tuple[Stranger, ...]:
        """The strangers of ``theirs`` (pid -> MiB), largest first, at most ``most``."""
        largest = sorted(((mib, pid) for pid, mib in theirs.items()), reverse=True)[:most]
        return tuple(Stranger(pid, mib, process_name(pid)) for mib, pid in largest)

    def who(self, gpu: int) -> str:
        """``pid 4242 (blender)``, ``pid 1 (a), pid 2 (b)``, ``processes the driver does not
        list`` (memory the device counts as used that no listed process accounts for), or,
        once they let go while their memory is still held back, ``pid 4242 (blender), gone
        1.5 s ago`` (``others gone 1.5 s ago`` where none was named)."""
        if (left := self.left.get(gpu)) is not None:
            named, since = left
            ago = f"gone {max(0.0, self._at - since):.1f} s ago"
            return f"{self._names(named)}, {ago}" if named else f"others {ago}"
        named = self._names(self.strangers.get(gpu, ()))
        if not named and self._elsewhere.get(gpu):
            return "our workers placed on other devices"
        return named or "processes the driver does not list"

    @staticmethod
    def _names(named: tuple[Stranger, ...]) -> str:
        return ", ".join(str(s) for s in named[:3])

    def evicted(self, ev: Evict) -> str:
        """The event line of an eviction made for strangers: the memory is ``taken by`` them,
        or ``held back for`` them once they let go (hysteresis)."""
        what = "put to sleep" if ev.sleep else "evicted"
        how = f"held back on GPU{ev.gpu} for {self.who(ev.gpu)}" if ev.gpu in self.left \
            else f"taken by {self.who(ev.gpu)} on GPU{ev.gpu}"
        return f"{what} {ev.backend}: {mib_text(self.counted.get(ev.gpu, 0))} {how} " \
            f"(frees {mib_text(ev.frees_mib)})"
