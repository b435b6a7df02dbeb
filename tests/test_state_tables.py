"""The two transition tables are the spec: walk them, and check that nothing goes around them."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from enum import StrEnum

import pytest

from supervisor.clock import WallClock
from supervisor.errors import EngineBug, VramtuiError
from supervisor.jobs import IllegalTransition, Job, JobState
from supervisor.jobs import states as job_states
from supervisor.jobs.table import JobTable
from supervisor.workers import states as worker_states
from supervisor.workers.states import WorkerState
from supervisor.workers.supervised import SupervisedProcess


def _reachable(table: Mapping[StrEnum, frozenset[StrEnum]], start: StrEnum) -> set[StrEnum]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt in table[todo.popleft()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("module,enum", [(job_states, JobState),
                                         (worker_states, WorkerState)])
def test_every_state_is_in_the_table_and_reachable(module: object, enum: type[StrEnum]
                                                   ) -> None:
    table = module.TRANSITIONS  # type: ignore[attr-defined]
    assert set(table) == set(enum)
    assert all(set(moves) <= set(enum) for moves in table.values())
    assert _reachable(table, module.INITIAL) == set(enum)  # type: ignore[attr-defined]


def test_the_final_job_states_are_final_and_the_only_ones() -> None:
    finals = {s for s, moves in job_states.TRANSITIONS.items() if not moves}
    assert finals == set(job_states.FINISHED) == {s for s in JobState if s.finished}
    # every state not finished can still end
    for state in set(JobState) - finals:
        assert _reachable(job_states.TRANSITIONS, state) & finals, state
    # nothing comes back from an end, and no job succeeds without having run
    assert not any(JobState.QUEUED in job_states.TRANSITIONS[s] for s in finals)
    assert JobState.SUCCEEDED not in job_states.TRANSITIONS[JobState.QUEUED]
    assert JobState.SUCCEEDED not in job_states.TRANSITIONS[JobState.STARTING]


def test_the_final_worker_states_are_final_and_every_worker_can_stop() -> None:
    table = worker_states.TRANSITIONS
    finals = {s for s, moves in table.items() if not moves}
    assert finals == set(worker_states.FINAL) == {WorkerState.COLD, WorkerState.CRASHED}
    for state in set(WorkerState) - finals:
        assert WorkerState.CRASHED in table[state], state  # a process can always die
        assert _reachable(table, state) >= {WorkerState.CRASHED}
    assert table[WorkerState.STOPPING] == {WorkerState.COLD, WorkerState.CRASHED}


def test_a_job_moves_only_along_the_table() -> None:
    job = Job(backend="b", payload=b"")
    job.mark(1.0, JobState.STARTING)
    job.mark(2.0, JobState.RUNNING)
    job.mark(3.0, JobState.SUCCEEDED)
    assert [h[1] for h in job.history] == ["starting", "running", "succeeded"]
    assert job.started_at == 2.0 and job.finished_at == 3.0
    for state in JobState:
        with pytest.raises(IllegalTransition):
            job.mark(4.0, state)  # nothing leaves an end
    assert job.state is JobState.SUCCEEDED and len(job.history) == 3
    fresh = Job(backend="b", payload=b"")
    with pytest.raises(IllegalTransition, match="queued -> succeeded"):
        fresh.mark(1.0, JobState.SUCCEEDED)
    assert fresh.state is JobState.QUEUED and fresh.history == []


def test_an_illegal_transition_is_a_bug_not_a_users_error() -> None:
    assert issubclass(IllegalTransition, EngineBug)
    assert not issubclass(IllegalTransition, VramtuiError)  # never answered as a refusal


class _Observer:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def worker_state(self, handle: object) -> None:
        self.seen.append(handle.state.value)  # type: ignore[attr-defined]


def test_a_worker_handle_moves_only_along_the_table(tmp_path: object) -> None:
    from pathlib import Path

    observer = _Observer()
    handle = SupervisedProcess(backend="b", name="b#1", gpu=0, argv=["x"], env={}, cwd=None,
                               log_path=Path("/dev/null"), observer=observer)
    assert handle.state is WorkerState.STARTING
    handle._set_state(WorkerState.READY)
    handle._set_state(WorkerState.BUSY)
    with pytest.raises(IllegalTransition, match="busy -> cold"):
        handle._set_state(WorkerState.COLD)  # only a stopping worker ends cold
    handle._set_state(WorkerState.STOPPING)
    handle._set_state(WorkerState.COLD)
    with pytest.raises(IllegalTransition):
        handle._set_state(WorkerState.READY)
    assert observer.seen == ["ready", "busy", "stopping", "cold"]
    assert handle.ready_at is not None


def test_the_job_table_queues_only_queued_jobs_and_forgets_what_ended() -> None:
    table = JobTable(WallClock(), recent_jobs=2)
    jobs = [Job(backend="b", payload=b"x" * 10) for _ in range(4)]
    for job in jobs:
        table.add(job)
    assert [j.id for j in table.queue] == [j.id for j in jobs]
    first = jobs[0]
    table.dequeue(first)
    first.mark(1.0, JobState.RUNNING)
    with pytest.raises(AssertionError):
        table.enqueue(first)  # a running job is never queued
    fut = table.future(first.id)
    assert fut is not None and not fut.done()
    first.mark(2.0, JobState.SUCCEEDED)
    view = table.ended(first)
    assert fut.result(0).id == first.id == view.id and table.future(first.id) is None
    for job in jobs[1:]:
        table.dequeue(job)
        job.mark(3.0, JobState.CANCELLED)
        table.ended(job)
    assert not table.queue
    assert [j.id for j in table.recent()] == [jobs[3].id, jobs[2].id]  # the last two kept
    assert table.get(first.id) is None and len(table) == 2


def test_the_job_table_keeps_recent_results_within_their_bytes() -> None:
    table = JobTable(WallClock(), recent_jobs=100, max_recent_bytes=100)
    jobs = [Job(backend="b", payload=b"x") for _ in range(6)]
    for i, job in enumerate(jobs):
        table.add(job)
        table.dequeue(job)
        job.mark(1.0, JobState.RUNNING)
        job.mark(2.0, JobState.SUCCEEDED)
        job.data = b"r" * 40
        table.ended(job)
        if i == 2:
            table.ended(job)  # heard twice: counted once
    # 40 bytes each: two fit in 100, a third would not; the newest stay
    assert [j.id for j in table.recent()] == [jobs[5].id, jobs[4].id]
    small = Job(backend="b", payload=b"x")
    table.add(small)
    table.dequeue(small)
    small.mark(1.0, JobState.RUNNING)
    small.mark(2.0, JobState.SUCCEEDED)
    table.ended(small)  # no result: 0 bytes, so the two before it stay
    assert [j.id for j in table.recent()] == [small.id, jobs[5].id, jobs[4].id]
