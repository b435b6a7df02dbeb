"""Families of random traces that reviews of the scheduler replay (``scripts/policy-compare``).

Each family is a function of a seed that returns a ``supervisor.tracesim.Trace``; the same
seed gives the same trace. They were drawn to attack the scheduler's handling of interactive
streams (priority 10) beside batches, where a wrong choice shows as a chat request waiting
for a load, or a batch waiting for nothing:

- ``soon``: two or three GPUs; a stream on one, an idle model on another whose work comes
  back soon after a big batch arrives mid-stream (the review of 1d88a5a);
- ``warm``: two to four GPUs, each warm with a model; new models that need a GPU each;
  the warm ones needed again later;
- ``general``: one or two streams (some pause and resume) beside two to nine models of mixed
  sizes, priorities 0-5, concurrency, keep-alives and allowed GPUs;
- ``alt``: a stream on one GPU; models that each need a whole GPU take turns on the others;
- ``beside`` and ``beside1`` (one GPU): most models sized to fit beside a stream's idle
  model but not beside its next job (the review of the beside-hold in stop 59), streams of
  priority 10, 5 or 3, some able to sleep.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from supervisor import arrivals
from supervisor.tracesim import Trace, TraceBackend, TraceJob

GIB = 1024
KINDS = ("periodic", "poisson", "bursts")


def stream_times(rng: random.Random, kind: str, gap: float, start: float, until: float
                 ) -> list[float]:
    """When a stream of ``kind`` with a mean gap of ``gap`` s asks, from ``start`` to
    ``until``."""
    if kind == "periodic":
        return list(arrivals.periodic(gap, until, start=start, jitter=0.05 * gap, rng=rng))
    if kind == "bursts":
        size = rng.randint(2, 4)
        return list(arrivals.bursts(size * gap, size, until, rng, start=start,
                                    spread=rng.uniform(0.3, 1.0)))
    return list(arrivals.poisson(1 / gap, until, rng, start=start))


def _some_gpus(rng: random.Random, n: int, weight: int) -> tuple[int, ...] | None:
    """None (any GPU) ``weight`` times in ``weight + 1``, else a random subset of ``n``."""
    subset = tuple(sorted(rng.sample(range(n), rng.randint(1, n))))
    return rng.choice((None,) * weight + (subset,))


def _chat(rng: random.Random, fastest_load_s: float, resident_gib: tuple[int, int]
          ) -> TraceBackend:
    """The stream's model, ``chat``, at priority 10."""
    return TraceBackend("chat", rng.uniform(fastest_load_s, 3.0),
                        rng.randint(*resident_gib) * GIB, GIB, safety_mib=128, priority=10)


def soon(seed: int) -> Trace:
    rng = random.Random(seed)
    ng = rng.choice((2, 2, 3))
    kind = rng.choice(KINDS)
    chat = _chat(rng, 1.0, (8, 12))
    y = TraceBackend("y", rng.uniform(1.0, 8.0), rng.randint(8, 13) * GIB, GIB,
                     safety_mib=128, priority=rng.choice((0, 0, 2, 5)))
    big = TraceBackend("big", rng.uniform(2.0, 6.0), rng.randint(13, 17) * GIB,
                       rng.randint(2, 5) * GIB, safety_mib=128, priority=rng.choice((0, 0, 1)))
    backends = [chat, y, big]
    jobs = [TraceJob("y-init", 0.0, "y", rng.uniform(0.5, 2.0), y.priority)]
    if ng == 3:
        backends.append(TraceBackend("z", rng.uniform(1.0, 6.0), rng.randint(10, 14) * GIB,
                                     GIB, safety_mib=128))
        jobs.append(TraceJob("z-init", 0.05, "z", rng.uniform(0.5, 2.0)))
    chat_from = rng.uniform(3.0, 9.0)
    gap = rng.uniform(1.0, 4.0)
    times = stream_times(rng, kind, gap, chat_from, chat_from + rng.uniform(10.0, 60.0))
    jobs += [TraceJob(f"chat-{i}", t, "chat", rng.uniform(0.2, 0.6), 10)
             for i, t in enumerate(times)]
    big_at = chat_from + rng.uniform(2.0, 15.0)
    jobs += [TraceJob(f"big-{i}", big_at + 0.001 * i, "big", rng.uniform(1.0, 5.0),
                      big.priority) for i in range(rng.randint(1, 6))]
    y_at = big_at + rng.uniform(0.1, 12.0)
    ny = rng.randint(1, 6)
    if rng.random() < 0.5:
        jobs += [TraceJob(f"y-{i}", y_at + 0.001 * i, "y", rng.uniform(0.5, 3.0), y.priority)
                 for i in range(ny)]
    else:  # a slow periodic stream of its own
        every = rng.uniform(2.0, 10.0)
        jobs += [TraceJob(f"y-{i}", y_at + i * every, "y", rng.uniform(0.3, 2.0), y.priority)
                 for i in range(ny)]
    return Trace(f"soon {seed}", (24 * GIB,) * ng, tuple(backends), tuple(jobs))


def general(seed: int) -> Trace:
    rng = random.Random(seed)
    ng = rng.choice((2, 3, 4))
    size = rng.choice((24, 24, 40, 48))
    backends: list[TraceBackend] = []
    jobs: list[TraceJob] = []
    for s in range(rng.choice((1, 1, 2))):
        name = f"chat{s}"
        backends.append(TraceBackend(name, rng.uniform(1.0, 4.0),
                                     rng.randint(6, size // 2) * GIB, GIB, safety_mib=128,
                                     priority=10, gpus=_some_gpus(rng, ng, 2)))
        kind = rng.choice(KINDS)
        start = rng.uniform(0.0, 20.0)
        until = start + rng.uniform(10.0, 120.0)
        gap = rng.uniform(1.0, 5.0)
        times = stream_times(rng, kind, gap, start, until)
        if rng.random() < 0.3:  # it pauses, then resumes
            again = until + rng.uniform(15.0, 60.0)
            times += stream_times(rng, kind, gap, again, again + rng.uniform(10, 40))
        run_s = rng.uniform(0.2, 1.0)
        jobs += [TraceJob(f"{name}-{i}", t, name, run_s, 10) for i, t in enumerate(times)]
    for m in range(rng.randint(2, 2 * ng + 1)):
        name = f"m{m}"
        resident = rng.randint(3, int(size * 0.75)) * GIB
        b = TraceBackend(name, rng.uniform(0.5, 8.0), resident, rng.randint(1, 4) * GIB,
                         safety_mib=128,
                         priority=rng.choice((0, 0, 0, 2, 4, 5)),
                         concurrency=rng.choice((1, 1, 2)),
                         keep_alive_s=rng.choice((300.0, 300.0, 30.0, 5.0)),
                         gpus=_some_gpus(rng, ng, 3))
        backends.append(b)
        jobs += _batches(rng, b, f"{name}-", 4, 8, 100.0, 15.0, own=0.7)
    return Trace(f"general {seed}", (size * GIB,) * ng, tuple(backends), tuple(jobs))


def _batches(rng: random.Random, b: TraceBackend, prefix: str, most: int, jobs_most: int,
             within_s: float, gap_most_s: float, *, own: float) -> list[TraceJob]:
    """Up to ``most`` batches of ``b``'s jobs, each submitted at once or spread out, of its
    own priority ``own`` of the time."""
    jobs = []
    for k in range(rng.randint(1, most)):
        at = rng.uniform(0.0, within_s)
        n = rng.randint(1, jobs_most)
        priority = b.priority if rng.random() < own else rng.choice((0, 2, 5))
        if rng.random() < 0.5:
            jobs += [TraceJob(f"{prefix}{k}-{i}", round(at + 0.001 * i, 6), b.name,
                              rng.uniform(0.5, 6.0), priority) for i in range(n)]
        else:
            gap = rng.uniform(1.0, gap_most_s)
            jobs += [TraceJob(f"{prefix}{k}-{i}", round(at + gap * i, 6), b.name,
                              rng.uniform(0.5, 4.0), priority) for i in range(n)]
    return jobs


def _opening(seed: int, gpu_counts: tuple[int, ...], fastest_load_s: float,
             resident_gib: tuple[int, int]) -> tuple[random.Random, int, list[TraceBackend], str]:
    """A family's first draws: its generator, how many GPUs, the chat's model, its kind."""
    rng = random.Random(seed)
    ng = rng.choice(gpu_counts)
    backends = [_chat(rng, fastest_load_s, resident_gib)]
    return rng, ng, backends, rng.choice(KINDS)


def warm(seed: int) -> Trace:
    rng, ng, backends, kind = _opening(seed, (2, 3, 4), 1.0, (8, 12))
    start = rng.uniform(0.5, 5.0)
    until = start + rng.uniform(15.0, 90.0)
    times = stream_times(rng, kind, rng.uniform(1.0, 4.0), start, until)
    jobs = [TraceJob(f"chat-{i}", t, "chat", rng.uniform(0.2, 0.6), 10)
            for i, t in enumerate(times)]
    for g in range(ng - 1):
        name = f"w{g}"
        b = TraceBackend(name, rng.uniform(1.0, 8.0), rng.randint(9, 14) * GIB, GIB,
                         safety_mib=128, priority=rng.choice((0, 3, 5)))
        backends.append(b)
        jobs.append(TraceJob(f"{name}-init", 0.01 * g, name, rng.uniform(0.3, 2.0), b.priority))
        for k in range(rng.randint(0, 3)):  # needed again later
            at = rng.uniform(5.0, 80.0)
            jobs += [TraceJob(f"{name}-{k}-{i}", round(at + 0.001 * i, 6), name,
                              rng.uniform(0.5, 3.0), b.priority if rng.random() < 0.8 else 0)
                     for i in range(rng.randint(1, 5))]
    for m in range(rng.randint(1, 4)):
        name = f"n{m}"
        b = TraceBackend(name, rng.uniform(2.0, 8.0), rng.randint(13, 18) * GIB,
                         rng.randint(2, 4) * GIB, safety_mib=128,
                         priority=rng.choice((0, 1, 2, 4)))
        backends.append(b)
        at = rng.uniform(3.0, 60.0)
        jobs += [TraceJob(f"{name}-{i}", round(at + 0.001 * i, 6), name, rng.uniform(0.5, 5.0),
                          b.priority) for i in range(rng.randint(1, 8))]
    return Trace(f"warm {seed}", (24 * GIB,) * ng, tuple(backends), tuple(jobs))


def alt(seed: int) -> Trace:
    rng, ng, backends, kind = _opening(seed, (2, 2, 3), 0.5, (9, 12))
    s0 = rng.uniform(0, 5)
    times = stream_times(rng, kind, rng.uniform(1.0, 5.0), s0, s0 + rng.uniform(20, 100))
    if rng.random() < 0.4:
        s1 = times[-1] + rng.uniform(10, 40)
        times += stream_times(rng, kind, rng.uniform(1.0, 5.0), s1, s1 + rng.uniform(10, 60))
    jobs = [TraceJob(f"chat-{i}", t, "chat", rng.uniform(0.2, 0.7), 10)
            for i, t in enumerate(times)]
    nm = rng.randint(ng, ng + 2)
    for m in range(nm):
        backends.append(TraceBackend(f"a{m}", rng.uniform(1.0, 8.0), rng.randint(13, 18) * GIB,
                                     rng.randint(1, 4) * GIB, safety_mib=128,
                                     priority=rng.choice((0, 0, 1, 3)),
                                     keep_alive_s=rng.choice((300.0, 60.0, 10.0))))
    priority = {b.name: b.priority for b in backends}
    period = rng.uniform(4.0, 25.0)
    t = rng.uniform(0, 3)
    i = 0
    while t < 150:
        name = f"a{rng.randrange(nm) if rng.random() < 0.5 else i % nm}"
        jobs += [TraceJob(f"{name}-{i}-{k}", round(t + 0.001 * k, 6), name,
                          rng.uniform(0.5, 4.0), priority[name])
                 for k in range(rng.randint(1, 3))]
        t += period * rng.uniform(0.5, 1.5)
        i += 1
    return Trace(f"alt {seed}", (24 * GIB,) * ng, tuple(backends), tuple(jobs))


def beside(seed: int, gpus: tuple[int, ...] = (1, 2, 2, 3)) -> Trace:
    rng = random.Random(seed)
    ng = rng.choice(gpus)
    size = rng.choice((24, 24, 40))
    backends: list[TraceBackend] = []
    jobs: list[TraceJob] = []
    streams = []
    count = rng.choice((1, 1, 2))
    for s, priority in enumerate([10, rng.choice((10, 5, 3))][:count]):
        name = f"s{s}"
        resident, activation = rng.randint(6, size // 2) * GIB, rng.randint(1, 3) * GIB
        sleepy = rng.random() < 0.25
        b = TraceBackend(name, rng.uniform(0.5, 4.0), resident, activation, safety_mib=128,
                         priority=priority,
                         concurrency=rng.choice((1, 1, 2)),
                         keep_alive_s=rng.choice((300.0, 300.0, 20.0, 5.0)),
                         gpus=rng.choice((None, None, (rng.randrange(ng),))),
                         wake_s=rng.uniform(0.3, 1.5) if sleepy else None,
                         residual_mib=rng.choice((300, 1024, 2048)))
        backends.append(b)
        streams.append(b)
        kind = rng.choice(KINDS)
        start = rng.uniform(0.0, 15.0)
        until = start + rng.uniform(20.0, 200.0)
        gap = rng.uniform(1.0, 15.0)
        times = stream_times(rng, kind, gap, start, until)
        if rng.random() < 0.3:
            again = until + rng.uniform(10.0, 60.0)
            times += stream_times(rng, kind, gap, again, again + rng.uniform(10, 60))
        longest = rng.choice((0.6, 1.5, 3.0))
        jobs += [TraceJob(f"{name}-{i}", round(t, 6), name, rng.uniform(0.2, longest), priority)
                 for i, t in enumerate(times)]
    for m in range(rng.randint(1, 2 * ng + 1)):
        host = rng.choice(streams)
        room = size * GIB - host.resident_mib
        mode = rng.random()
        activation = rng.randint(1, 3) * GIB
        if mode < 0.6:  # fits beside the idle stream model, not beside its next job
            need = rng.randint(room - host.activation_mib + 1, room)
        elif mode < 0.8:  # fits beside both
            need = rng.randint(3 * GIB, max(3 * GIB + 1, room - host.activation_mib - 128))
        else:  # fits beside nothing of it
            need = rng.randint(room + 1, size * GIB - 128)
        priority = rng.choice((0, 0, 0, 1, 2, 4, 5))
        b = TraceBackend(f"m{m}", rng.uniform(0.5, 8.0), max(GIB, need - activation - 128),
                         activation, safety_mib=128, priority=priority,
                         concurrency=rng.choice((1, 1, 2)),
                         keep_alive_s=rng.choice((300.0, 300.0, 30.0, 5.0)),
                         gpus=_some_gpus(rng, ng, 3),
                         wake_s=rng.uniform(0.5, 2.0) if rng.random() < 0.2 else None)
        backends.append(b)
        jobs += _batches(rng, b, f"m{m}-", 4, 6, 150.0, 20.0, own=0.8)
    return Trace(f"beside {seed}", (size * GIB,) * ng, tuple(backends), tuple(jobs))


def beside1(seed: int) -> Trace:
    return beside(seed, gpus=(1,))


FAMILIES: dict[str, Callable[[int], Trace]] = {
    "soon": soon, "warm": warm, "general": general, "alt": alt, "beside": beside,
    "beside1": beside1}
