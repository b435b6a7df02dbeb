"""Expected arrivals through the real engine (issue 28), scaled down: real workers on the
simulated GPU, a chat asked every 0.5 s at priority 10 beside a batch at priority 0 of a
model that fits beside it and one that fits beside nothing. The full-size trace is
``bench/trace.py --engine-chat``."""

from __future__ import annotations

import pytest
from engine_support import play_trace

from supervisor import arrivals
from supervisor.tracesim import Trace, TraceBackend, TraceJob

GIB = 1024


@pytest.mark.process
def test_the_chat_keeps_its_model_and_the_big_batch_waits_for_its_end() -> None:
    llm = TraceBackend("chat-llm", 0.5, 11 * GIB, GIB, safety_mib=128, priority=10)
    small = TraceBackend("embed", 0.3, 7 * GIB, 3 * GIB, safety_mib=128)
    big = TraceBackend("big", 0.5, 16 * GIB, 4 * GIB, safety_mib=128)
    chat = arrivals.jobs(arrivals.periodic(0.5, 5.0), llm.name, 0.1, 10, prefix="chat")
    batch = tuple(TraceJob(f"embed-{i}", 1.6, small.name, 0.4) for i in range(4)) + \
        tuple(TraceJob(f"big-{i}", 1.6, big.name, 0.3) for i in range(2))
    trace = Trace("chat beside a batch, scaled", (24 * GIB,), (llm, small, big), chat + batch)
    played = play_trace(trace, "sim:24GiB", watch=("big-0",))
    assert set(played.states.values()) == {"succeeded"}, played.states
    gap = played.largest_gap([j.id for j in chat])
    if gap <= 1.0:  # (a box that held the player up for a second made a silence the
        # engine rightly took as the stream's end: what it then does is another test's)
        # The chat model loads once, the embedder beside it, the big model after the stream.
        assert played.loads == 3, "\n".join(played.log)
        waits = sorted(played.waits[10])
        # the bound, 1 s (the first request waits for the cold load): a loaded box
        # adds a few hundred ms to a trip, the evict-and-reload this prevents adds seconds
        assert waits[-2] <= 1.0, waits
    # (Its reason is the plan's, checked in ``tests/test_expect.py``: polled here, a hold
    # that lasts only while the chat's model is idle between its 0.3 s jobs is not always
    # seen; one run in four saw only "needs 13440 MiB, 13184 free", read during a job.)


@pytest.mark.process
def test_a_chat_request_evicts_an_idle_chat_model_rather_than_wait_out_a_batch_job() -> None:
    # A batch job (priority 0) runs 8 s with two chat models loaded beside it; a request for
    # a third (priority 10) fits only once one of them leaves, or once the batch job ends.
    # The engine tells the scheduler the priority of what its workers run: the request does
    # not wait for lower-priority work longer than its target wait (1 s), so it evicts an
    # idle chat model, loads its own (1.5 s) and runs while the batch job still runs.
    batch = TraceBackend("batch", 0.3, 13 * GIB, 2 * GIB, safety_mib=512)
    chats = tuple(TraceBackend(f"chat{i}", 1.5, size * GIB, GIB // 2, safety_mib=512,
                               priority=10) for i, size in enumerate((3, 2, 3)))
    jobs = (TraceJob("b0", 0.0, "batch", 8.0), TraceJob("c0", 0.2, "chat0", 0.2, 10),
            TraceJob("c1", 0.2, "chat1", 0.2, 10), TraceJob("c2", 2.5, "chat2", 0.2, 10))
    trace = Trace("a chat beside a batch job", (24 * GIB,), (batch, *chats), jobs)
    played = play_trace(trace, "sim:24GiB")
    assert set(played.states.values()) == {"succeeded"}, played.states
    assert played.ended["c2"] < played.ended["b0"], (played.ended, played.log)


@pytest.mark.process
def test_a_request_after_the_stream_seemed_to_end_has_the_big_load_given_up() -> None:
    # The stream stops at 5 s; once it has been silent long enough, the big model starts
    # loading (4 s) in the chat model's room. One more request comes in the middle of that
    # load: the load is given up (its job back in the queue), so the request waits for the
    # chat model's reload (0.5 s), not for the big load, its job and that reload (about 3 s).
    llm = TraceBackend("chat-llm", 0.5, 11 * GIB, GIB, safety_mib=128, priority=10)
    small = TraceBackend("embed", 0.3, 7 * GIB, 3 * GIB, safety_mib=128)
    big = TraceBackend("big", 4.0, 16 * GIB, 4 * GIB, safety_mib=128)
    chat = arrivals.jobs(arrivals.periodic(0.5, 5.0) + [8.5], llm.name, 0.1, 10,
                         prefix="chat")
    batch = tuple(TraceJob(f"embed-{i}", 1.6, small.name, 0.4) for i in range(4)) + \
        tuple(TraceJob(f"big-{i}", 1.6, big.name, 0.3) for i in range(2))
    trace = Trace("a late request, scaled", (24 * GIB,), (llm, small, big), chat + batch)
    played = play_trace(trace, "sim:24GiB")
    assert played.job_waits[chat[-1].id] < 2.0, played.job_waits
    assert set(played.states.values()) == {"succeeded"}, played.states
    assert any("its load is given up" in line for line in played.log), played.log


@pytest.mark.process
def test_a_load_is_not_given_up_for_a_chat_that_may_wait_for_it() -> None:
    # The big model runs three jobs first (its load and jobs are measured). Then the chat
    # (every 1 s, its model may wait 10 s: ``target_wait``) lets the big model evict its idle
    # model, and its next request comes during the big load, which no gap fits. That load
    # was given up at every request while the stream lasted (the simulator: 10 loads given
    # up, the big jobs done at 17.9 s, after the stream). The request may wait for the
    # load, a job and its model's reload: the load goes on, and the big jobs are done while
    # the chat goes on (the simulator: none given up, done at 9.3 s, the chat waiting 1.9 s).
    llm = TraceBackend("chat-llm", 0.5, 11 * GIB, GIB, safety_mib=128, priority=10,
                       target_wait_s=10.0)
    big = TraceBackend("big", 1.2, 16 * GIB, 4 * GIB, safety_mib=128)
    chat = arrivals.jobs(arrivals.periodic(1.0, 15.0, start=3.0), llm.name, 0.1, 10,
                         prefix="chat")
    batch = tuple(TraceJob(f"big-first-{i}", 0.0, big.name, 0.5) for i in range(3)) + tuple(
        TraceJob(f"big-{i}", 5.0, big.name, 0.5) for i in range(2))
    played = play_trace(Trace("a chat that may wait", (24 * GIB,), (llm, big), chat + batch),
                        "sim:24GiB")
    assert set(played.states.values()) == {"succeeded"}, played.states
    given_up = [line for line in played.log if "its load is given up" in line]
    assert len(given_up) <= 1, given_up
    assert max(played.ended[j.id] for j in batch) < max(played.submitted[j.id] for j in chat)
    assert max(played.job_waits[j.id] for j in chat) < 10.0, played.job_waits


@pytest.mark.process
def test_a_batch_after_the_chats_first_request_loads_beside_its_model_first() -> None:
    # The chat model's first request at 0 s, a batch at 1 s (submitted one job after
    # another, the big jobs first), the chat's second request at 2 s. No gap is learned
    # yet, but more requests may come: the big job waits while the embedder loads beside the
    # chat model and runs, and the second request finds its model loaded. Before, the big
    # job evicted the chat model at its submission (the engine plans at each one, and the
    # embedder's jobs were not queued yet), and the second request waited for the rest of a
    # big job and a reload (about 1.1 s).
    llm = TraceBackend("chat-llm", 0.5, 11 * GIB, GIB, safety_mib=128, priority=10)
    small = TraceBackend("embed", 0.3, 7 * GIB, 3 * GIB, safety_mib=128)
    big = TraceBackend("big", 0.5, 16 * GIB, 4 * GIB, safety_mib=128)
    chat = arrivals.jobs([0.0, 2.0], llm.name, 0.1, 10, prefix="chat")
    batch = tuple(TraceJob(f"embed-{i}", 1.0, small.name, 0.5) for i in range(4)) + \
        tuple(TraceJob(f"big-{i}", 1.0, big.name, 1.0) for i in range(2))
    trace = Trace("a batch after a first request", (24 * GIB,), (llm, small, big), chat + batch)
    played = play_trace(trace, "sim:24GiB", watch=("big-0",))
    assert set(played.states.values()) == {"succeeded"}, played.states
    assert played.job_waits[chat[1].id] < 0.8, (played.job_waits, played.log)
    assert any(r.startswith("waits: chat-llm had a request") for r in played.reasons), \
        played.reasons


@pytest.mark.process
def test_a_job_a_stream_holds_on_one_gpu_takes_the_other_whose_model_is_idle() -> None:
    # Two GPUs: an idle model (its reload dearer) on one, the chat's model on the other, asked
    # every second at priority 10. The big job fits on either once the model there leaves.
    # The chat's GPU is the cheaper eviction, but the stream holds the job there; before, it
    # waited for the stream's end (about 2 s more) and then evicted the chat's model all the
    # same. Now the idle model leaves at once.
    llm = TraceBackend("chat-llm", 0.5, 11 * GIB, GIB, safety_mib=128, priority=10)
    idle = TraceBackend("idle", 2.5, 11 * GIB, GIB, safety_mib=128)
    big = TraceBackend("big", 2.0, 16 * GIB, 4 * GIB, safety_mib=128)
    chat = arrivals.jobs([2.7, 3.7, 4.7], llm.name, 0.3, 10, prefix="chat")
    jobs = (TraceJob("idle-0", 0.0, idle.name, 0.5), *chat, TraceJob("big-0", 5.5, big.name, 1.0))
    trace = Trace("two GPUs, an idle model beside the chat's", (24 * GIB, 24 * GIB),
                  (llm, idle, big), jobs)
    played = play_trace(trace, "sim:24GiB,sim:24GiB")
    assert set(played.states.values()) == {"succeeded"}, played.states
    assert any(line.startswith("evicting idle ") for line in played.log), played.log
    assert not any(line.startswith("evicting chat-llm ") for line in played.log), played.log
    assert played.job_waits["big-0"] < big.load_s + 1.5, (played.job_waits, played.log)


@pytest.mark.process
def test_a_load_that_would_take_the_room_of_the_chats_next_job_waits_for_the_stream() -> None:
    # The chat's model (10 + 1 GiB) is asked every second at priority 10; a model of
    # priority 2 (12 + 1 GiB) fits beside it, but then the chat's next job would not. Loaded
    # there at once, it made the chat's next requests wait for its load and its job (about
    # 1.5 s each); it now waits for the stream's end, and says why.
    llm = TraceBackend("chat-llm", 0.5, 10 * GIB, GIB, safety_mib=128, priority=10)
    y = TraceBackend("y", 1.5, 12 * GIB, GIB, safety_mib=128, priority=2)
    chat = arrivals.jobs([2.0, 3.0, 4.0, 5.0, 6.0], llm.name, 0.3, 10, prefix="chat")
    jobs = (*chat, TraceJob("y-0", 3.4, y.name, 1.0, 2))
    trace = Trace("a load beside the chat's model", (24 * GIB,), (llm, y), jobs)
    played = play_trace(trace, "sim:24GiB", watch=("y-0",))
    assert set(played.states.values()) == {"succeeded"}, played.states
    if played.largest_gap([j.id for j in chat]) <= 1.5:  # (see the first test)
        later = [played.job_waits[j.id] for j in chat[1:]]
        assert max(later) <= 0.5, (later, played.log)
        assert played.job_waits["y-0"] > 6.0 - 3.4, played.job_waits
    # (Its reason is the plan's, checked in ``tests/test_expect.py``: polled here, a hold
    # that lasts only while the chat's model is idle between its 0.3 s jobs is not always
    # seen; one run in four saw only "needs 13440 MiB, 13184 free", read during a job.)
