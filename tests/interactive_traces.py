"""Random traces of an interactive stream beside a batch (issue 28), and what to check of them.

Not a test module: ``tests/test_expect.py`` runs a few fixed seeds, ``scripts/interactive-soak``
many. Each trace, on one 24 GiB GPU: a chat model (priority 10) asked by a periodic, Poisson
or bursty stream from t=0 until it stops; a batch (priority 0), mixing a model that fits beside
the chat model and one that fits beside nothing. A policy that keeps the chat model through its
stream makes no chat request wait for the batch (a gap-free alternative exists), and the batch
cannot end before the big model's loads and work after the stream's last request, nor
(as the two models cannot share the GPU) after the small model's work (``batch_bound``).

Two shapes. ``long`` (``case``): a stream of 60-120 s, the batch submitted after its tenth
request. ``short`` (``short_case``): issue 28's own trace, drawn around its figures — a stream
of 25-45 s, the batch submitted 2-6 s in, after none to a few requests, eight small jobs and
three to six big ones. A short stream leaves the batch little room: its bound's quarter is
some ten seconds, about as long as a random stream's silence must be to say that it ended.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace

from supervisor import arrivals
from supervisor.tracesim import Result, Trace, TraceBackend, TraceJob, exclusive

GIB = 1024


@dataclass(frozen=True)
class Case:
    trace: Trace
    kind: str  # periodic, poisson or bursts
    chat_job_s: float
    batch_at: float  # when the batch is submitted

    def batch_bound(self) -> float:
        """From the batch's submission, for a policy that keeps the chat model through its
        stream (``bound_after``)."""
        return self.bound_after(max(j.at + j.duration_s for j in self.trace.jobs
                                    if j.priority == 10))

    def bound_after(self, stream_end: float) -> float:
        """From the batch's submission, had the stream's last job ended at ``stream_end``:
        the big model loads and works once the stream has ended; and once the small model's
        work is done, if the two cannot share the GPU (then the small model's work all comes
        first: what of it came after the big model's would only add to the end)."""
        t = self.trace
        by = {b.name: b for b in t.backends}
        small, big = by["small"], by["big"]
        work = {n: sum(j.duration_s for j in t.jobs if j.backend == n) for n in ("small", "big")}
        stream = max(stream_end, self.batch_at) - self.batch_at
        first = small.load_s + work["small"]
        after = big.load_s + work["big"]
        if exclusive(small, big, t.gpus[0]):
            return max(first, stream) + after
        return max(first, stream + after)

    def batch_makespan(self, r: Result) -> float:
        return max(r.started_at[j.id] + j.duration_s for j in self.trace.jobs
                   if j.priority == 0) - self.batch_at

    def known(self) -> Case:
        """This case replayed by an engine that ran its models before (restarted, it kept
        their times: ``engine.timings``): each model's load and mean job time known from the
        start, as measured, rather than guessed until it has run."""
        t = self.trace
        backends = tuple(replace(b, reload_cost_s=b.load_s, known_job_s=statistics.fmean(
            j.duration_s for j in t.jobs if j.backend == b.name)) for b in t.backends)
        return replace(self, trace=replace(t, backends=backends))

    def chat_waits(self, r: Result) -> list[float]:
        """The waits of the chat requests that came once the batch was there."""
        return sorted(r.started_at[j.id] - j.at for j in self.trace.jobs
                      if j.priority == 10 and j.at >= self.batch_at)

    def alone(self) -> Trace:
        """The stream without the batch."""
        t = self.trace
        return Trace(t.name + ", alone", t.gpus, t.backends,
                     tuple(j for j in t.jobs if j.priority == 10))

    def forced(self, alone: Result) -> Forced | None:
        """Whether every policy that reads only the requests so far fails this case or its
        twin (the case with its stream ended at one of its requests), and why; None if one
        could pass both.

        For each silence of the stream that the batch sees (one that began just before it
        came included: its twin's stream ended before the batch), after the request at ``t``:
        had the stream ended at ``t``, the twin's bound (``batch_bound`` of it) lets the big
        model load only until ``batch_at + 1.25 * bound - load - work - stop`` (its jobs run
        one after another once it is loaded). A policy that meets it must evict the chat
        model by then in the twin, so here too if the silence lasts that long (up to then,
        both are the same history). The big model then loads and runs at least its shortest
        job, stops, and the chat model loads again: each request that comes meanwhile waits
        at least until then (less its wait alone); or, if the next request comes while the
        big model still loads, it gives that load up (as the scheduler does), and the
        requests wait only until the chat model has loaded again from then. If more of them
        wait past twice the job time than the p95 lets by, no such policy passes both."""
        t = self.trace
        by = {b.name: b for b in t.backends}
        chat = sorted((j for j in t.jobs if j.priority == 10), key=lambda j: j.at)
        big = [j.duration_s for j in t.jobs if j.backend == "big"]
        load, work, stop = by["big"].load_s, sum(big), by["chat"].stop_s
        counted = [j for j in chat if j.at >= self.batch_at]
        n = len(counted)
        allowed = n - -(-95 * n // 100)
        for prev, nxt in zip(chat, chat[1:], strict=False):
            if nxt.at <= self.batch_at:
                continue  # (over before the batch came: nothing to decide)
            # its model idle from here, and evictable for the batch once the batch is there
            end = max(self.batch_at, alone.started_at[prev.id] + prev.duration_s)
            bound = self.bound_after(end)
            evict = self.batch_at + 1.25 * bound - load - work - stop
            if evict < end or evict >= nxt.at:
                continue  # no policy meets the twin's bound, or it may wait past this silence
            if nxt.at < evict + stop + load:  # (the request gives the big model's load up)
                back = nxt.at + by["big"].stop_s + by["chat"].load_s
            else:
                back = evict + stop + load + min(big) + by["big"].stop_s + by["chat"].load_s
            delayed = sum(1 for j in counted if j.at >= nxt.at
                          and back - j.at - (alone.started_at[j.id] - j.at) > 2 * self.chat_job_s)
            if delayed > allowed:
                return Forced(prev.at, nxt.at - prev.at, evict - prev.at, delayed, allowed)
        return None

    def added_waits(self, r: Result, alone: Result) -> list[float]:
        """What the batch added to the wait of each chat request that came once it was
        there (its own queue, requests close together, waits alone too)."""
        return sorted((r.started_at[j.id] - j.at) - (alone.started_at[j.id] - j.at)
                      for j in self.trace.jobs if j.priority == 10 and j.at >= self.batch_at)


@dataclass(frozen=True)
class Forced:
    """Why no policy that reads only what has come passes both a case and its twin: the
    same case with the stream ended at the request at ``at`` (see ``Case.forced``)."""

    at: float  # the request after which the stream was silent
    silence: float  # until its next request
    latest: float  # the latest silence at which the twin's batch can still meet its bound
    delayed: int  # the requests that then wait past twice the chat's job time
    allowed: int  # how many of those the p95 lets by

    def __str__(self) -> str:
        return (f"silent {self.silence:.1f} s after {self.at:.1f} s; had it stopped there the "
                f"big model must load within {self.latest:.1f} s, and {self.delayed} "
                f"request{'s' if self.delayed != 1 else ''} would wait (p95 lets "
                f"{self.allowed} by)")


def p95(values: list[float]) -> float:
    """Nearest rank."""
    s = sorted(values)
    return s[max(0, -(-95 * len(s) // 100) - 1)] if s else 0.0


def case(seed: int, kind: str) -> Case:
    rng = random.Random(seed)
    chat_job = rng.uniform(0.2, 0.8)
    chat = TraceBackend("chat", rng.uniform(1.0, 3.0), rng.randint(9, 12) * GIB, GIB // 2,
                        safety_mib=128, priority=10)
    small = TraceBackend("small", rng.uniform(0.5, 2.0), rng.randint(4, 7) * GIB, 2 * GIB,
                         safety_mib=128)
    big = TraceBackend("big", rng.uniform(2.0, 6.0), rng.randint(14, 18) * GIB,
                       rng.randint(2, 4) * GIB, safety_mib=128)
    gap = rng.uniform(max(1.0, 3 * chat_job), 2.0)
    until = rng.uniform(60.0, 120.0)
    if kind == "periodic":
        times = arrivals.periodic(gap, until, jitter=0.05 * gap, rng=rng)
    elif kind == "bursts":  # a few requests within a second, every few seconds
        size = rng.randint(2, 5)
        times = arrivals.bursts(size * gap, size, until, rng, spread=rng.uniform(0.3, 1.0))
    else:
        times = arrivals.poisson(1 / gap, until, rng)
    jobs = arrivals.jobs(times, "chat", chat_job, 10)
    batch_at = round(max(chat.load_s, times[min(9, len(times) - 1)]) + 0.01, 3)
    jobs += tuple(TraceJob(f"s{i}", batch_at, "small", rng.uniform(1.0, 4.0))
                  for i in range(rng.randint(4, 12)))
    jobs += tuple(TraceJob(f"b{i}", batch_at, "big", rng.uniform(2.0, 6.0))
                  for i in range(rng.randint(6, 12)))
    trace = Trace(f"{kind} stream beside a batch, seed {seed}", (24 * GIB,),
                  (chat, small, big), jobs)
    return Case(trace, kind, chat_job, batch_at)


def short_case(seed: int, kind: str) -> Case:
    """Issue 28's trace (a 12 GiB chat model; 7 + 3 and 16 + 4 GiB batch models), its
    figures drawn around the issue's, the batch submitted 2-6 s into a stream of 25-45 s."""
    rng = random.Random(10_000 + seed)
    chat_job = rng.uniform(0.2, 0.5)
    chat = TraceBackend("chat", rng.uniform(1.5, 3.0), 11 * GIB, GIB, safety_mib=128,
                        priority=10)
    small = TraceBackend("small", rng.uniform(0.5, 2.0), 7 * GIB, 3 * GIB, safety_mib=128)
    big = TraceBackend("big", rng.uniform(3.0, 5.0), 16 * GIB, 4 * GIB, safety_mib=128)
    gap = rng.uniform(1.5, 2.5)
    until = rng.uniform(25.0, 45.0)
    if kind == "periodic":
        times = arrivals.periodic(gap, until, jitter=0.05 * gap, rng=rng)
    elif kind == "bursts":
        size = rng.randint(2, 4)
        times = arrivals.bursts(size * gap, size, until, rng, spread=rng.uniform(0.3, 1.0))
    else:
        times = arrivals.poisson(1 / gap, until, rng)
    jobs = arrivals.jobs(times, "chat", chat_job, 10)
    batch_at = round(max(chat.load_s, rng.uniform(2.0, 6.0)), 3)
    jobs += tuple(TraceJob(f"s{i}", batch_at, "small", rng.uniform(1.5, 2.5)) for i in range(8))
    jobs += tuple(TraceJob(f"b{i}", batch_at, "big", rng.uniform(2.0, 4.0))
                  for i in range(rng.randint(3, 6)))
    trace = Trace(f"short {kind} stream beside a batch, seed {seed}", (24 * GIB,),
                  (chat, small, big), jobs)
    return Case(trace, kind, chat_job, batch_at)


SHAPES = {"long": case, "short": short_case}
