"""Strangers: how much of the memory on a GPU that no process of ours holds admission counts.

Pure, like the rest of the scheduler: a :class:`StrangerWatch` is fed readings with their time
(``observe(now, gpu, …)``) and answers, per GPU, how much memory it *counts* for strangers
(the ``foreign_mib`` the ledger and the plan read). No clock reads, no I/O.

Hysteresis, so that a brief spike changes nothing:

- **arriving**: the counted figure rises to a level only once strangers have held at least
  that much for ``arrive_s`` without a break;
- **leaving**: it falls to a level only once strangers have held at most that much for
  ``leave_s`` (the engine does not take memory back the moment a stranger lets go);
- **over-committed**: when what our workers hold plus what strangers hold *now* exceeds the
  device (``held + now > total``) for ``urgent_s``, the counted figure jumps to what strangers
  hold at once — the device is already over, and waiting would leave it so. The plan then
  evicts idle workers (``plan.py``: "others") until it fits, and admits nothing there before.

The first reading of a GPU is counted whole (strangers present before the engine looked).
``Verdict.over_for_s`` says how long a GPU has stayed over: once every idle model is gone,
only running jobs hold it, and a policy (``EngineConfig.others_policy: cancel``) may cancel
them after ``others_cancel_after_s``; by default they finish.  That clock runs only while the
device is over by what strangers hold *now* as well as by what is counted: hysteresis keeps
memory held back ``leave_s`` after a stranger let go, but a device whose strangers left is not
over-committed, and no job is to be cancelled for a stranger that is gone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

ARRIVE_S = 3.0  # a stranger must stay this long before memory is held back for it
LEAVE_S = 3.0  # and be gone this long before that memory is taken again
URGENT_S = 0.3  # an over-committed device is answered after this long (a few samples)
EPS = 1e-6  # readings' times are floats: 1.4 - 1.1 is a hair under 0.3


@dataclass
class _Gpu:
    counted: int
    seen: deque[tuple[float, int]] = field(default_factory=deque)  # (t, strangers' MiB)
    over_since: float | None = None  # over by what strangers hold now
    counted_over_since: float | None = None  # over by what is counted for them


@dataclass(frozen=True, slots=True)
class Verdict:
    """One GPU after a reading: what strangers hold now, what is counted for them, and how
    far the device is over-committed by what is counted (0: it fits)."""

    now_mib: int
    counted_mib: int
    over_mib: int
    urgent: bool = False  # the counted figure jumped because the device was over-committed
    over_for_s: float = 0.0  # how long it has been over, by what is counted and by what
    # strangers hold now, without a break (0 once they let go, whatever is still counted)


class StrangerWatch:
    """The counted figure of every GPU (see the module doc)."""

    def __init__(self, arrive_s: float = ARRIVE_S, leave_s: float = LEAVE_S,
                 urgent_s: float = URGENT_S) -> None:
        for name, value in (("arrive_s", arrive_s), ("leave_s", leave_s),
                            ("urgent_s", urgent_s)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self.arrive_s, self.leave_s, self.urgent_s = arrive_s, leave_s, urgent_s
        self._gpus: dict[int, _Gpu] = {}

    def counted(self) -> dict[int, int]:
        """GPU -> MiB counted for strangers now."""
        return {g: s.counted for g, s in self._gpus.items()}

    def observe(self, now: float, gpu: int, strangers_mib: int, held_mib: int,
                total_mib: int) -> Verdict:
        """Take in one reading of ``gpu``: strangers hold ``strangers_mib``, our workers
        ``held_mib`` (the ledger), on a device of ``total_mib``."""
        strangers_mib = max(0, int(strangers_mib))
        state = self._gpus.get(gpu)
        if state is None:
            state = self._gpus[gpu] = _Gpu(strangers_mib)
        seen = state.seen
        seen.append((now, strangers_mib))
        horizon = now - max(self.arrive_s, self.leave_s) + EPS
        while len(seen) > 1 and seen[1][0] <= horizon:
            seen.popleft()  # keep one reading at or before the horizon: the window's start
        urgent = False
        if held_mib + strangers_mib > total_mib:
            if state.over_since is None:
                state.over_since = now
            if now - state.over_since >= self.urgent_s - EPS and strangers_mib > state.counted:
                state.counted, urgent = strangers_mib, True
        else:
            state.over_since = None
        if not urgent:
            low = self._extreme(seen, now - self.arrive_s + EPS, min)
            if low is not None and low > state.counted:
                state.counted = low
            high = self._extreme(seen, now - self.leave_s + EPS, max)
            if high is not None and high < state.counted:
                state.counted = high
        over = max(0, held_mib + state.counted - total_mib)
        if not over:
            state.counted_over_since = None
        elif state.counted_over_since is None:
            state.counted_over_since = now
        since = state.counted_over_since
        if since is not None:  # and over now: what hysteresis still counts is not a stranger
            since = None if state.over_since is None else max(since, state.over_since)
        return Verdict(strangers_mib, state.counted, over, urgent,
                       0.0 if since is None else now - since)

    def forget(self, gpu: int) -> None:
        """Start ``gpu`` afresh (it went away, or the reader restarted)."""
        self._gpus.pop(gpu, None)

    @staticmethod
    def _extreme(seen: deque[tuple[float, int]], since: float, pick: Callable[[int, int], int]
                 ) -> int | None:
        """The least (``min``) or most (``max``) strangers held from ``since`` to now: None
        while the readings do not reach back that far (the level has not lasted)."""
        if not seen or seen[0][0] > since:
            return None
        value: int | None = None
        for i, (_t, mib) in enumerate(seen):
            nxt = seen[i + 1][0] if i + 1 < len(seen) else None
            if nxt is not None and nxt <= since:
                continue  # superseded before the window began
            value = mib if value is None else pick(value, mib)
        return value
