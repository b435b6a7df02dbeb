"""Expected arrivals: how each backend's requests come, learned, and what the next one costs.

Pure: the caller passes every time (the engine's clock, or the simulator's). ``Learner``
records, per backend and priority, when requests arrive (the gaps between them, the newest
``GAPS_KEPT``, each counting less as it ages: half after ``HALF_LIFE_S``) and, per backend, how
long its jobs run; ``Learner.view(now)`` gives the frozen ``Expectations`` the scheduler reads
(``Snapshot.expected``).

A ``Stream`` is a backend's requests of one priority that came with gaps between them
(requests closer than ``MIN_GAP_S`` are one burst: a batch submitted at once is no stream).
It is *alive* until it has been silent for longer than its gaps make likely; then it has
stopped and nothing is expected of it. A regular stream (its gaps' spread, the standard
deviation over the mean, near 0) stops after its longest gap times ``QUIET_FACTOR`` (at lesser
odds, ``doubt_at``, less of that margin: ``regular_margin``); a random
one (spread near 1, as independent requests: any silence is possible, a long one only
improbable) after ``RANDOM_QUIET + ln(1 + gaps seen)`` mean gaps (a live Poisson stream is
that silent once in ``e**RANDOM_QUIET`` = 3000 times as many gaps as it had: the longer it
has gone on, the longer the silence it takes), more while its rate is read from few gaps
(``random_quiet``); in between, in proportion. Plus ``FEW_GAPS / n`` mean gaps while it
has only ``n`` gaps, as much as they are random (a few random gaps say little of the longest
to come, regular ones tell it; and few gaps say little of how random they are: their spread
is blended with a random stream's as ``PRIOR_GAPS`` gaps of it; at lesser odds, less of it,
as of the regular margin: ``odds_share``), and ``QUIET_PAD_S``. A bursty stream (its gaps
longer than the mean ``BURST_RATIO`` times those shorter) is read by its gaps between bursts
alone: bursts every 6 s stop after a silence of a little more than 6 s, not of as many of
all its gaps' mean as a random stream would take, and of less of its few bursts' padding
when they come as regularly as that.

A young stream is another matter: one whose gaps cover less time than a mistake would cost
has shown nothing of the silences that matter (after its first burst, a bursty stream looks
stopped), so a job that would evict its worker takes it as ended only after a silence of
``MISTAKE_REQUESTS`` times that cost less what its gaps cover (``Stream.young_quiet``,
``Stream.ends_for``).

While alive, the chance that its next request comes within ``w`` seconds is read from its
own gaps: among the gaps longer than the silence so far, the (weighted) share that ends
within ``w`` more, blended with what a memoryless stream of the same mean gap would say as
those gaps get few (``PRIOR_GAPS``: after a silence longer than most gaps, a random stream's
next request is still as near as ever; a periodic one's gaps tell exactly when).

What the scheduler does with it (``supervisor.scheduler.plan``): evicting a worker whose
stream is alive costs its next request, if it comes while the evicting job loads and runs
and the worker reloads (``window``), that much wait: ``p_within(window) * window`` (before
the job's backend has run a job, its load and run are a guess: ``UNSURE_MARGIN`` times it). Against
a job of lower priority than the stream, that cost must stay within the stream's target
wait (``target_wait`` of its backend, else ``DEFAULT_TARGET_WAIT_S``), or the job waits for
a gap long enough, or for the stream to stop (at most ``max_patience_s``: ``hold``) — but
it holds the job at most ``HOLD_SHARE`` of its batch's time (what it waited until the
stream's last request, its load and its backend's queued work; ``GUESSED_SHARE`` while that
work is a guess) past that request, or past the end of the last job of the other models it
would evict whose work goes first (of at least its priority) if later (before then, had the
stream stopped, the job could not have started either, and holding it cost nothing), or,
past that, until the stream more likely stopped than not (``doubt_at``:
odds of ``e**DOUBT_QUIET``, even), and
never less, while the stream is young, than what the mistake would cost: a random stream's
long silence cannot be told from its end, and the batch held for an ended one ends within
about ``1 + HOLD_SHARE`` of what it could have taken. With nothing else on the GPU, a stream
of few gaps holds the job for at most ``IDLE_GAPS`` of its mean gaps, or one mistake's cost
while younger than that, of idle time (from the later of its last request and that end).
A backend's requests of a priority with no gap yet (its first
request, or a batch at once: ``Expectations.lone``) are no stream, but more may come: a job
below them that would evict its worker waits while other queued work starts on its GPU
instead, for a silence of at most what the mistake would cost (``MISTAKE_REQUESTS`` times
it). At equal priority an alive stream makes its worker dearer to evict, as queued work
does, and keeps it while a patient barrier waits if its next request is due within a
reload; a stream of lower priority than the job counts for nothing.

A stream's request that comes while a load of lower work takes its room gives that load up
(``plan``'s ``_undo_loads``); the ``Learner`` remembers it (``given_up``, with the last
``GIVEN_UP_BY`` streams that did), and the next load of that backend waits while one of those
streams' next request would likely give it up too (and
would need that room: ``plan`` asks), if the moment after that request is better
(``Expectations.gives_up``): a periodic stream's next request is due at a time its gaps
tell, a random one's is as near after it came as now (waiting for it saves nothing, and the
load starts). Without that, a load was started into the next request at every step and
given up again, for each request of the stream.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple

#: Gaps kept per stream, and streams kept (the least recently heard of go first).
GAPS_KEPT = 32
STREAMS_KEPT = 512
#: An observed gap counts half after this long.
HALF_LIFE_S = 600.0
#: Requests closer than this are one burst (no gap is learned between them).
MIN_GAP_S = 0.05
#: A regular stream has stopped once silent for longer than its longest gap times this, plus
#: the pad (at the odds of ``RANDOM_QUIET``; at lesser odds less: ``regular_margin``).
QUIET_FACTOR = 1.25
RANDOM_QUIET = 8.0
#: The odds (log) that a stream stopped past which a batch's share ends its hold: e**0, even
#: (the stream more likely stopped than not). It trades the two failures of issue 28's soak
#: (streams beside batches): held longer, a batch misses its 1.25x bound behind a stream that
#: has ended; ended sooner, a live stream's next requests wait a reload. A stream of 60-120 s
#: with the batch after its tenth request (the soak's long shape) gains by waiting: at 2.0
#: (7 to 1) none of its first 400 Poisson cases failed, at 0.0 nine. Issue 28's own trace
#: (the short shape: a stream of 25-45 s, the batch 2-6 s in) cannot: its bound's quarter is
#: about the silence the floor took, and at 2.0 half its Poisson batches missed it (203 of
#: 400, and 8 chats past the limit), at 1.0 a third (133, 10), at 0.0 a fifth (78, 13).
#: Even odds are about even: of the soak's Poisson streams silent past ``doubt_at`` (at each
#: request from the batch on, 300 seeds), 50 % went on in the short shape and 52 % in the
#: long one, since few gaps' padding takes its share of the odds too (``odds_share``; taken
#: whole, 36 % and 46 %: even odds came late, and held batches for streams that had ended).
DOUBT_QUIET = 0.0
QUIET_PAD_S = 0.5
#: Few random gaps say little of the longest: FEW_GAPS / n mean gaps more, as much as the
#: gaps are random (``PRIOR_GAPS``). Regular gaps tell their longest: bursts every 8 s, four
#: of them so far, took 5 s of it, and issue 28's soak (short bursts, seeds 0-699) missed
#: 311 of 700 batch bounds; weighed so, 179, with no chat past its limit either way. At
#: lesser odds than ``RANDOM_QUIET``'s, less of it (``odds_share``): at even odds, over
#: 1,000 seeds of the soak's short shape, bursts' batches past their bound 159 -> 99 and
#: Poisson's 168 -> 145, for 3 more Poisson chats past their limit (42 -> 45).
FEW_GAPS = 8.0
#: How many gaps a memoryless guess (of the mean gap) weighs against the gaps seen (and a
#: random stream's spread, in ``FEW_GAPS``'s padding: two gaps 3.1 and 2.9 s apart are no
#: evidence that a stream is regular).
PRIOR_GAPS = 2.0
#: Gaps longer than the mean that are this many times those shorter on average are between
#: bursts (a Poisson stream's: about 5 times): ``quiet_at`` reads them alone.
BURST_RATIO = 10.0
#: Before a backend's first job has run, its job's load and run are each taken as this many
#: times the slowest reload of it and its victims (``plan``'s hold).
UNMEASURED_FACTOR = 2.0
#: Before a backend's first job has run, a gap must be this many times as long as its job's
#: guessed load and run (``UNMEASURED_FACTOR``) for the job to take it (``plan``'s hold): a
#: first load of 4.7 s guessed at 2.4 s took a 9 s gap between bursts and overran it (soak
#: bursts seeds 140, 204).
UNSURE_MARGIN = 2.0
#: How many requests taking a live young stream as ended makes wait (``Stream.young_quiet``).
MISTAKE_REQUESTS = 2.0
#: A stream's silence holds a job at most this share of its batch's time (``hold``): a
#: batch held for a stream that has ended ends within about 1.25x of what it could have
#: taken, the most issue 28 lets it. While its work is a guess (its backend has not run a
#: job), the smaller ``GUESSED_SHARE``: guessed long, a share of 0.25 held issue 28's short
#: trace past its bound 182 times in 200 (its soak; 41 at 0.2). Measured, 0.25 rather than
#: 0.2 spares the stream's requests a reload where a long gap came (soak, ``--known``,
#: seeds 0-699, Poisson, both shapes: chats past their limit 126 -> 89 of 1,400, 53 -> 21
#: of them not forced; batches past their bound 36 either way).
HOLD_SHARE = 0.25
GUESSED_SHARE = 0.2
#: With nothing else on its GPU, a job is held by a stream of fewer than ``FEW_GAPS`` gaps
#: for a silence of at most this many of its mean gaps, or one mistake's cost (``hold``).
IDLE_GAPS = 3.0
#: How long the next request of a stream may be made to wait, unless its backend says.
DEFAULT_TARGET_WAIT_S = 1.0
#: The weight of the newest run time in a backend's mean job time.
JOB_TIME_WEIGHT = 0.3
#: Run times kept per backend for the longest of them (``Expectations.job_longest_s``), and
#: how many must have run before that longest says anything: one job tells nothing of the
#: next (a 2 s job, then one of 60 s).
RUNS_KEPT = 8
RUNS_FOR_LONGEST = 3
#: A load that a stream's next request would give up with at least this chance waits for a
#: better moment, if one comes (``Expectations.gives_up``).
DOOMED_CHANCE = 0.5
#: Streams remembered per backend for having given its loads up: two taking turns (a hold
#: that waited out one's request landed in the other's) and then some.
GIVEN_UP_BY = 4


@dataclass(frozen=True, slots=True)
class Stream:
    """One backend's requests of one priority: when the last came and the gaps before it
    (oldest first, each with its weight now)."""

    backend: str
    priority: int
    last_at: float
    gaps: tuple[float, ...]
    weights: tuple[float, ...]
    seen: int = 0  # gaps learned in all (more than those kept)

    @property
    def quiet_at(self) -> float:
        """When it counts as stopped if nothing more comes (see the module doc)."""
        return self.stopped_at(RANDOM_QUIET)

    @property
    def doubt_at(self) -> float:
        """When it may have stopped, if nothing more comes: as ``quiet_at``, with the odds
        that it stopped at ``e**DOUBT_QUIET`` (a live random stream is that silent once in
        ``e**DOUBT_QUIET`` times as many gaps as it had: rare, not unheard of)."""
        return self.stopped_at(DOUBT_QUIET)

    @property
    def telling(self) -> tuple[float, ...]:
        """The gaps that say when it has stopped: all of them, or for a bursty stream those
        between its bursts (gaps longer than the mean ``BURST_RATIO`` times those shorter on
        average), not those within."""
        gaps = self.gaps
        if not gaps:
            return gaps
        mean = sum(gaps) / len(gaps)
        long = tuple(g for g in gaps if g > mean)
        short = len(gaps) - len(long)
        if long and short and sum(long) / len(long) > BURST_RATIO * (
                sum(gaps) - sum(long)) / short:
            return long
        return gaps

    def stopped_at(self, odds: float) -> float:
        """When the log odds that it has stopped reach ``odds`` if nothing more comes."""
        if not self.gaps:
            return self.last_at
        n_all = len(self.gaps)
        gaps = self.telling
        mean = sum(gaps) / len(gaps)
        n = len(gaps)
        spread = math.sqrt(sum((g - mean) ** 2 for g in gaps) / n)
        random = min(1.0, spread / mean) if mean > 0 else 0.0
        seen = max(n, self.seen)
        silence = ((1.0 - random) * max(gaps) * (1.0 + regular_margin(seen, odds))
                   + random * random_quiet(sum(gaps), n, seen, random, odds)
                   + (n * random + PRIOR_GAPS) / (n + PRIOR_GAPS) * mean * FEW_GAPS / n_all
                   * odds_share(seen, odds)
                   + QUIET_PAD_S)
        return self.last_at + silence

    def alive(self, now: float) -> bool:
        return bool(self.gaps) and now < self.quiet_at

    @property
    def overdue_at(self) -> float:
        """When it has been silent for longer than any gap it had."""
        return self.last_at + max(self.gaps, default=0.0)

    @property
    def mean_gap(self) -> float:
        return sum(self.gaps) / len(self.gaps) if self.gaps else 0.0

    def ends_for(self, window: float, most_s: float = math.inf,
                 cap_s: float = math.inf) -> float:
        """When a job whose eviction of this stream's worker would make its next request
        wait ``window`` takes the stream as ended if nothing more comes: at ``quiet_at``,
        or after a silence of ``most_s`` if sooner (never before ``doubt_at``: a regular
        stream's is past its longest gap), but not before a silence of what that mistake
        would cost, shrinking as the stream runs for longer than that (``young_quiet``); and
        after a silence of ``cap_s`` whatever those say."""
        if not self.gaps:
            return self.last_at
        most_s = max(most_s, self.doubt_at - self.last_at)
        until = max(self.last_at + self.young_quiet(window),
                    min(self.quiet_at, self.last_at + most_s))
        return min(until, self.last_at + cap_s)

    def young_quiet(self, window: float) -> float:
        """The silence that does not end a stream younger than ``window``: taking a live
        stream as ended makes its next request wait ``window`` (and those right behind it as
        long: ``MISTAKE_REQUESTS``), and a stream whose gaps cover less time than that
        (``span``) has shown nothing of the silences that matter — after its first burst a
        bursty stream looks like one that has stopped. So a silence of
        ``MISTAKE_REQUESTS * (window - span)`` does not end it: as long as the mistake would
        cost, less what the stream has shown (ski rental's rule: wait as long as being wrong
        costs). Nothing once its gaps cover the window."""
        return MISTAKE_REQUESTS * max(0.0, window - sum(self.gaps))

    def _tail(self, now: float) -> list[tuple[float, float]]:
        """(time left, weight) of each gap longer than the silence so far."""
        silent = now - self.last_at
        return [(g - silent, w) for g, w in zip(self.gaps, self.weights, strict=True)
                if g > silent and w > 0]

    def p_within(self, now: float, window: float) -> float:
        """The chance that its next request comes within ``window`` seconds of ``now``
        (``chance_within``), 0 once it has stopped."""
        return self.chance_within(now, window) if self.alive(now) else 0.0

    def chance_within(self, now: float, window: float) -> float:
        """That chance if it has not stopped: what its gaps longer than the silence so far
        say, blended with a memoryless stream of its mean gap as those gaps get few
        (``PRIOR_GAPS``)."""
        if not self.gaps:
            return 0.0
        total_w = sum(self.weights)
        mean = sum(g * w for g, w in zip(self.gaps, self.weights, strict=True)) / total_w \
            if total_w > 0 else 0.0
        memoryless = 1.0 - math.exp(-window / mean) if mean > 0 else 1.0
        tail = self._tail(now)
        total = sum(w for _, w in tail)
        if total <= 0:
            return memoryless  # overdue
        seen = sum(w for left, w in tail if left <= window) / total
        n = len(tail)
        return (n * seen + PRIOR_GAPS * memoryless) / (n + PRIOR_GAPS)

    def due_in(self, now: float) -> float:
        """In how many seconds its next request is expected if it has not stopped: when the
        chance that it has come (``chance_within``) reaches a half."""
        if not self.gaps:
            return math.inf
        lo, hi = 0.0, max(self.gaps)
        while self.chance_within(now, hi) < 0.5 and hi < 1e6:
            hi *= 2
        for _ in range(30):
            mid = (lo + hi) / 2
            if self.chance_within(now, mid) >= 0.5:
                hi = mid
            else:
                lo = mid
        return hi


def odds_share(seen: int, odds: float) -> float:
    """How much of a margin for what a stream's gaps cannot tell (``regular_margin``, few
    gaps' padding: ``FEW_GAPS``) a silence at log odds ``odds`` that it stopped takes, for a
    stream that had ``seen`` gaps: all of it at ``RANDOM_QUIET``'s, and in proportion to the
    evidence that the silence must add to the prior odds (``1 / (1 + seen)``, as
    ``random_quiet``) below them."""
    prior = math.log(1 + seen)
    return min(1.0, max(0.0, (odds + prior) / (RANDOM_QUIET + prior)))


def regular_margin(seen: int, odds: float = RANDOM_QUIET) -> float:
    """How much longer than its longest gap a regular stream that had ``seen`` gaps must be
    silent for the log odds that it stopped to reach ``odds``, as a share of that gap:
    ``QUIET_FACTOR``'s quarter at ``RANDOM_QUIET``, less at lesser odds (``odds_share``). At
    even odds (``doubt_at``) a stream of 15 gaps takes a quarter of that margin: its longest
    gap 8.6 s, 9.2 s of silence rather than 10.8 (issue 28's soak, short bursts, seeds
    0-699: batches past their bound 179 -> 114, with no chat past its limit before or
    after; Poisson, 116 -> 111, and no more chats past it)."""
    return (QUIET_FACTOR - 1.0) * odds_share(seen, odds)


def random_quiet(total: float, n: int, seen: int, random: float = 1.0,
                 odds: float = RANDOM_QUIET) -> float:
    """The silence after which a random stream whose ``n`` gaps (of ``seen`` in all) came to
    ``total`` seconds has stopped: where the odds that it stopped reach ``e**RANDOM_QUIET``,
    from prior odds of ``1 / (1 + seen)`` (a stream that had ``seen`` gaps ends after the
    next one as often as that). A live stream of rate ``r`` is silent ``s`` with chance
    ``exp(-r s)``; its rate known only from its gaps (a Gamma of ``n`` and ``total``), that
    chance is ``(total / (total + s)) ** n``: few gaps, or gaps shorter than its rate by
    chance (an early run of quick requests), make a long silence likelier than its mean gap
    says. That uncertainty counts as much as the gaps are random (``random``, their spread
    over their mean: near 0, regular gaps tell the rate well)."""
    if n <= 0 or total <= 0:
        return 0.0
    quiet = odds + math.log(1 + seen)
    known = total / n * quiet
    unsure = total * math.expm1(min(quiet / n, 50.0))
    return known + random * (unsure - known)


class GivenUp(NamedTuple):
    """A backend's loads given up: for whose requests (the backends, the newest last, at
    most ``GIVEN_UP_BY``), and the longest any had run (its load takes longer)."""

    by: tuple[str, ...]
    loaded_s: float


@dataclass(frozen=True, slots=True)
class Expectations:
    """What the scheduler reads: each backend's streams (highest priority first), its mean
    job time (and the longest of its last ``RUNS_KEPT`` jobs, once ``RUNS_FOR_LONGEST`` have
    run), and the target wait its descriptor sets."""

    streams: Mapping[str, tuple[Stream, ...]] = field(default_factory=dict)
    job_s: Mapping[str, float] = field(default_factory=dict)
    target_wait_s: Mapping[str, float] = field(default_factory=dict)
    #: backend -> its loads given up (``plan``'s ``_undo_loads``)
    given_up: Mapping[str, GivenUp] = field(default_factory=dict)
    #: backend -> the longest of its last ``RUNS_KEPT`` jobs (once it ran ``RUNS_FOR_LONGEST``)
    job_longest_s: Mapping[str, float] = field(default_factory=dict)
    #: backend -> its requests of a priority that came with no gap yet (one request, or a
    #: batch at once: nothing says whether more come), as gapless streams, highest first
    lone: Mapping[str, tuple[Stream, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("streams", "job_s", "target_wait_s", "given_up", "job_longest_s", "lone"):
            value = getattr(self, name)
            if not isinstance(value, WeighedOnRead):  # (read-only already, and not weighed)
                object.__setattr__(self, name, MappingProxyType(dict(value)))

    def stream_above(self, backend: str, priority: int, now: float) -> Stream | None:
        """The backend's highest-priority alive stream of priority above ``priority``."""
        for s in self.streams.get(backend, ()):
            if s.priority > priority and s.alive(now):
                return s
        return None

    def lone_above(self, backend: str, priority: int) -> Stream | None:
        """The backend's highest-priority requests with no gap yet (``lone``) of priority
        above ``priority``."""
        for s in self.lone.get(backend, ()):
            if s.priority > priority:
                return s
        return None

    def asked_above(self, backend: str, priority: int, now: float) -> Stream | None:
        """A request of the backend above ``priority`` that counts: its alive stream
        (``stream_above``), else its first requests (``lone_above``)."""
        return self.stream_above(backend, priority, now) or self.lone_above(backend, priority)

    def alive(self, backend: str, now: float, priority: int | None = None) -> bool:
        """Whether the backend has an alive stream (of ``priority`` or above, if given)."""
        return any(s.alive(now) and (priority is None or s.priority >= priority)
                   for s in self.streams.get(backend, ()))

    def target(self, backend: str) -> float:
        return self.target_wait_s.get(backend, DEFAULT_TARGET_WAIT_S)

    def job_time(self, backend: str, default: float) -> float:
        return self.job_s.get(backend, default)

    def gives_up(self, backend: str, by: str, priority: int, now: float, load_s: float, *,
                 waiting: bool, served_s: Callable[[Stream], float]) -> Stream | None:
        """The stream of ``by`` whose next request would likely give up a load of
        ``backend`` for jobs of (aged) ``priority`` started now, taking ``load_s`` (or as long
        as a load of it ran before it was given up, if longer: a load given up early was
        never timed), when waiting saves that: ``by`` took such a load's room before (it is
        in ``given_up``), and its stream, alive and above ``priority``, has its next request
        within the load with a chance of at least ``DOOMED_CHANCE`` (certain when one of its
        requests already ``waiting`` could not start; none once it is overdue, silent for
        longer than any gap it had: when it comes, if at all, is anybody's guess, and the
        load is started), and at most half that once the request has come and been served
        (``served_s(stream)`` after it came; a periodic stream's next gap; a random stream's
        chance is the same after its next request, and waiting for it saves nothing; a load
        that no gap fits is started, and given up if it must: waiting would hold it, and its
        batch, until the stream ends). None when the load may start."""
        given = self.given_up.get(backend)
        stream = None if given is None or by not in given.by else \
            self.stream_above(by, priority, now)
        if stream is None or not (waiting or now < stream.overdue_at):
            return None
        assert given is not None
        load_s = max(load_s, given.loaded_s)
        chance = 1.0 if waiting else stream.chance_within(now, load_s)
        if chance < DOOMED_CHANCE:
            return None
        after = replace(stream, last_at=now).chance_within(now + served_s(stream), load_s)
        return stream if after <= chance / 2 else None


@dataclass
class _History:
    last_at: float
    seen: int = 0
    gaps: deque[tuple[float, float]] = field(
        default_factory=lambda: deque(maxlen=GAPS_KEPT))  # (gap, observed at)


class Learner:
    """Records arrivals, run times and loads given up; bounded (``GAPS_KEPT`` gaps per
    stream, at most ``STREAMS_KEPT`` streams and as many backends' job times and loads
    given up)."""

    def __init__(self) -> None:
        self._streams: dict[tuple[str, int], _History] = {}
        # backend -> (its mean job time, its last RUNS_KEPT run times)
        self._runs: dict[str, tuple[float, deque[float]]] = {}
        self._given_up: dict[str, GivenUp] = {}
        self.revision = 0  # counts each change of the job times (``runs``)

    def arrived(self, backend: str, priority: int, at: float) -> None:
        """A request of ``backend`` at ``priority`` arrived at ``at``."""
        key = (backend, priority)
        h = self._streams.pop(key, None)  # (re-inserted: the newest heard of last)
        if h is None:
            h = _History(at)
            if len(self._streams) >= STREAMS_KEPT:
                del self._streams[next(iter(self._streams))]
        else:
            gap = at - h.last_at
            if gap >= MIN_GAP_S:
                h.gaps.append((gap, at))
                h.seen += 1
            h.last_at = max(h.last_at, at)
        self._streams[key] = h

    def ran(self, backend: str, seconds: float) -> None:
        """A job of ``backend`` ran for ``seconds``."""
        if not (seconds >= 0 and math.isfinite(seconds)):
            return
        old = self._runs.pop(backend, None)
        if old is None and len(self._runs) >= STREAMS_KEPT:
            del self._runs[next(iter(self._runs))]
        mean, runs = (seconds, deque(maxlen=RUNS_KEPT)) if old is None else old
        runs.append(seconds)
        self._runs[backend] = (mean + JOB_TIME_WEIGHT * (seconds - mean), runs)
        self.revision += 1

    def runs(self) -> dict[str, tuple[float, tuple[float, ...]]]:
        """Backend -> its mean job time and its last ``RUNS_KEPT`` run times, oldest first:
        what ``restore`` teaches another ``Learner`` (an engine restart keeps them:
        ``supervisor.engine.timings``)."""
        return {backend: (mean, tuple(runs)) for backend, (mean, runs) in self._runs.items()}

    def restore(self, backend: str, mean: float, runs: Iterable[float]) -> None:
        """``backend``'s job times as ``runs`` gave them (not replayed: the mean weighs runs
        that are no longer kept)."""
        kept = deque((r for r in runs if r >= 0 and math.isfinite(r)), maxlen=RUNS_KEPT)
        if not (mean >= 0 and math.isfinite(mean)) or not kept:
            return
        self._runs.pop(backend, None)
        if len(self._runs) >= STREAMS_KEPT:
            del self._runs[next(iter(self._runs))]
        self._runs[backend] = (mean, kept)
        self.revision += 1

    def job_times(self) -> dict[str, float]:
        """Backend -> what a job of it takes, expected (``Expectations.job_s``)."""
        return {backend: mean for backend, (mean, _) in self._runs.items()}

    def forget_runs(self, backend: str) -> None:
        """What ``backend``'s jobs took is no more its jobs' (it starts another model)."""
        if self._runs.pop(backend, None) is not None:
            self.revision += 1

    def given_up(self, backend: str, for_backend: str, loaded_s: float) -> None:
        """A load of ``backend`` was given up for a request of ``for_backend`` after it had
        run ``loaded_s`` seconds."""
        old = self._given_up.pop(backend, None)
        if old is None and len(self._given_up) >= STREAMS_KEPT:
            del self._given_up[next(iter(self._given_up))]
        if not (loaded_s >= 0 and math.isfinite(loaded_s)):
            loaded_s = 0.0
        if old is None:
            self._given_up[backend] = GivenUp((for_backend,), loaded_s)
            return
        by = tuple(b for b in old.by if b != for_backend)[1 - GIVEN_UP_BY:] + (for_backend,)
        self._given_up[backend] = GivenUp(by, max(old.loaded_s, loaded_s))

    def view(self, now: float, target_wait_s: Mapping[str, float] | None = None
             ) -> Expectations:
        """What is expected at ``now``: the streams with at least one gap learned, and the
        requests with none yet apart (``Expectations.lone``)."""
        taken = []
        lone: dict[str, list[Stream]] = {}
        for (backend, priority), h in self._streams.items():
            if h.gaps:
                taken.append((backend, priority, h.last_at, tuple(h.gaps), h.seen))
            else:
                lone.setdefault(backend, []).append(Stream(backend, priority, h.last_at, (), ()))
        job_s = self.job_times()
        longest = {b: max(r) for b, (_, r) in self._runs.items() if len(r) >= RUNS_FOR_LONGEST}
        return Expectations(WeighedOnRead(now, taken), job_s, dict(target_wait_s or {}),
                            dict(self._given_up), longest,
                            {b: tuple(sorted(ss, key=lambda s: -s.priority))
                             for b, ss in lone.items()})


class WeighedOnRead(Mapping[str, tuple[Stream, ...]]):
    """Each backend's streams (highest priority first) as they were at ``now``, their gaps
    weighed on the first read: a plan that evicts nothing never reads them, and weighing
    every gap is most of what a view costs (a step follows each submit)."""

    __slots__ = ("_now", "_taken", "_streams")

    def __init__(self, now: float,
                 taken: list[tuple[str, int, float, tuple[tuple[float, float], ...], int]]
                 ) -> None:
        self._now = now
        self._taken = taken  # (backend, priority, last at, (gap, observed at)..., seen)
        self._streams: dict[str, tuple[Stream, ...]] | None = None

    def _weighed(self) -> dict[str, tuple[Stream, ...]]:
        if self._streams is None:
            now = self._now
            streams: dict[str, list[Stream]] = {}
            for backend, priority, last_at, gaps, seen in self._taken:
                weights = tuple(0.5 ** (max(0.0, now - at) / HALF_LIFE_S) for _, at in gaps)
                streams.setdefault(backend, []).append(
                    Stream(backend, priority, last_at, tuple(g for g, _ in gaps), weights, seen))
            self._streams = {b: tuple(sorted(ss, key=lambda s: -s.priority))
                             for b, ss in streams.items()}
            self._taken = []
        return self._streams

    def __getitem__(self, backend: str) -> tuple[Stream, ...]:
        return self._weighed()[backend]

    def __iter__(self) -> Iterator[str]:
        return iter(self._weighed())

    def __len__(self) -> int:
        return len(self._weighed())


@dataclass(frozen=True, slots=True)
class Hold:
    """What ``hold`` found: the stream that holds the job (None when none does), how long
    its next request would wait, expected, and until when it holds; and when the holds that
    ended let the job go (``released_at``, ``-inf`` when none ended)."""

    stream: Stream | None
    cost: float = 0.0
    until: float = -math.inf
    released_at: float = -math.inf


def hold(expected: Expectations, now: float, priority: int, run_s: float,
         victims: list[tuple[str, float]], *, since: float = -math.inf,
         batch_s: float = math.inf, idle: bool = False, beside: bool = False,
         guessed: bool = False, free_at: float = -math.inf) -> Hold:
    """Whether evicting ``victims`` ((backend, what undoing its eviction costs)) for a job of
    (effective) ``priority`` that needs ``run_s`` more seconds (its load and its run) would
    make the next request of a stream above that priority wait beyond its target: the
    first such stream and how long its request would wait, expected (``Hold.stream`` None
    when none).

    A job held since ``since`` whose backend's queued work takes ``batch_s`` (its load and
    every queued job's run) is held by a stream's silence at most ``HOLD_SHARE`` of what its
    batch takes if that stream had stopped at its last request (what it waited until then,
    plus ``batch_s``; ``GUESSED_SHARE`` while ``guessed``) past that request, or past
    ``free_at`` if later: when the last of its victims whose work goes before the job's, with
    no requests above it, ended that work (``plan`` passes it; the batch's model that ran
    beside the stream, say), before which the job could not have started had the stream
    stopped, and holding it cost nothing. However the stream is read, a batch held for one
    that has in fact stopped ends within about ``1 + HOLD_SHARE`` of the time it could have
    taken (its work as estimated: before its first job has run, as ``plan`` takes it; and
    once its silence is past ``Stream.doubt_at``).

    A victim whose backend had requests above that priority with no gap yet
    (``Expectations.lone``) holds the job while other queued work starts on its GPU instead
    (``beside``: the hold changes only the order), until a silence of ``MISTAKE_REQUESTS``
    times ``window`` (ski rental, as for a young stream): nothing says more come. Work that
    merely runs there does not count (holding a job for one request beside a long job left
    the room idle for minutes).

    With nothing else running or starting on its GPU, nor queued for another live worker
    there (``idle``), holding the job leaves the device idle: a stream of fewer than
    ``FEW_GAPS`` gaps (little evidence that it is one: a few random jobs of a backend look
    like a stream) then holds it for at most ``IDLE_GAPS`` of its mean gaps (between its
    bursts, for a bursty one), or what one mistake would cost while it is younger than that,
    past its last request or ``free_at`` (ski rental: an idle device waits as long as being
    wrong costs, once; it is idle from then).

    ``run_s`` and ``batch_s`` only ``guessed`` (its backend has not run a job yet), a gap is
    long enough only if ``UNSURE_MARGIN`` times ``run_s`` fits, and the share is
    ``GUESSED_SHARE`` (the rest of the hold reads the guess as it is).

    A stream whose hold has ended (its silence past ``Stream.ends_for``) while it still
    held the job then (its next request, read at that silence, would have waited beyond
    the target) let the job go at that time: ``Hold.released_at``, the latest such. The job
    was held until then, not blocked: ``plan`` counts the patience of its barrier from
    there (hot work of its batch that fits beside the stream runs first, as it did while
    the stream held it)."""
    released = -math.inf
    for backend, undo_s in victims:
        window = run_s + undo_s
        gap = (UNSURE_MARGIN if guessed else 1.0) * run_s + undo_s  # the gap it takes
        target = expected.target(backend)
        for stream in expected.streams.get(backend, ()):
            if stream.priority <= priority:
                break
            free_later = max(0.0, free_at - stream.last_at)  # (both count from there)
            most = free_later + (GUESSED_SHARE if guessed else HOLD_SHARE) * (
                max(0.0, stream.last_at - since) + batch_s)
            cap = math.inf
            if idle and len(stream.gaps) < FEW_GAPS:
                telling = stream.telling
                cap = free_later + max(IDLE_GAPS * sum(telling) / len(telling),
                                       stream.young_quiet(window) / MISTAKE_REQUESTS)
            until = stream.ends_for(window, most, cap)
            if now >= until:
                if until > released and stream.chance_within(until, gap) * gap > target:
                    released = until
                continue
            cost = stream.chance_within(now, gap) * gap
            if cost > target:
                return Hold(stream, cost, until, released)
            break
        lone = expected.lone_above(backend, priority) if beside else None
        if lone is not None and now < lone.last_at + MISTAKE_REQUESTS * window:
            return Hold(lone, window, lone.last_at + MISTAKE_REQUESTS * window, released)
    return Hold(None, released_at=released)
