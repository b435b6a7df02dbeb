"""The durable job journal: real SQLite files, real ``kill -9`` of a process that writes one."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor import journal as journal_mod
from supervisor.jobs import JobState
from supervisor.journal import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    JobRecord,
    Journal,
    JournalCorrupt,
    JournalError,
    JournalInUse,
    JournalTooNew,
)

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_750_000_000.123456  # a wall time with a fraction that must survive exactly

INTERRUPTED = "the engine stopped while it ran; requeued (attempt 2)"


def rec(i: int, **kw: Any) -> JobRecord:
    base: dict[str, Any] = dict(
        id=f"j-{i:04d}",
        seq=i,
        backend="sd",
        payload=f"payload {i}".encode(),
        submitted_wall=T0 + i,
        history=[(T0 + i, "queued", "")],
    )
    base.update(kw)
    return JobRecord(**base)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.sqlite3"


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


# -- round trip, order, ids --------------------------------------------------------------------


def test_round_trip_of_a_finished_job(path: Path) -> None:
    meta = {"user": "ana", "raw": b"\x00\xff", "nested": {"k": [1, 2.5, None]}, 7: "int key"}
    with Journal.open(path) as j:
        j.record_submit(rec(1, metadata=meta, priority=3, timeout=12.5, stream=True))
        j.record_state("j-0001", JobState.STARTING, T0 + 10, "starting sd on GPU0")
        j.record_start("j-0001", T0 + 11, "on sd (pid 42)")
        assert j.finished("j-0001") is None  # not finished yet
        j.record_finish(
            "j-0001",
            JobState.SUCCEEDED,
            T0 + 12.75,
            data=b"\x89PNG" + bytes(100_000),
            headers={"content-type": "image/png", "seed": 5},
            status_code=200,
            chunks=[b"a", b"", b"bc"],
        )
    with Journal.open(path, now_wall=T0 + 13) as j:
        got = j.finished("j-0001")
        assert j.recover(T0 + 13).jobs == []
    assert got == JobRecord(
        id="j-0001",
        seq=1,
        backend="sd",
        payload=b"",  # dropped at finish
        priority=3,
        timeout=12.5,
        metadata=meta,
        stream=True,
        submitted_wall=T0 + 1,
        state=JobState.SUCCEEDED,
        history=[
            (T0 + 1, "queued", ""),
            (T0 + 10, "starting", "starting sd on GPU0"),
            (T0 + 11, "running", "on sd (pid 42)"),
            (T0 + 12.75, "succeeded", ""),
        ],
        attempts=1,
        started_wall=T0 + 11,
        finished_wall=T0 + 12.75,
        data=b"\x89PNG" + bytes(100_000),
        headers={"content-type": "image/png", "seed": 5},
        status_code=200,
        error=None,
        chunks=[b"a", b"", b"bc"],
    )


def test_failed_job_keeps_its_error(path: Path) -> None:
    with Journal.open(path) as j:
        j.record_submit(rec(1))
        j.record_start("j-0001", T0 + 2)
        j.record_finish("j-0001", JobState.FAILED, T0 + 3, error="CUDA out of memory")
        got = j.finished("j-0001")
    assert got is not None
    assert got.state is JobState.FAILED and got.error == "CUDA out of memory"
    assert got.history[-1] == (T0 + 3, "failed", "CUDA out of memory")
    assert got.data is None and got.chunks == [] and got.headers == {}


def test_queued_jobs_come_back_with_their_ids_in_seq_order(path: Path) -> None:
    order = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]  # submitted out of seq order on purpose
    with Journal.open(path) as j:
        for i in order:
            j.record_submit(rec(i))
        j.record_start("j-0004", T0 + 20)
        j.record_finish("j-0004", JobState.SUCCEEDED, T0 + 21)
    with Journal.open(path) as j:
        r = j.recover(T0 + 30)
    assert [x.id for x in r.jobs] == [f"j-{i:04d}" for i in range(1, 11) if i != 4]
    assert [x.seq for x in r.jobs] == [i for i in range(1, 11) if i != 4]
    assert all(x.state is JobState.QUEUED and x.attempts == 0 for x in r.jobs)
    assert r.jobs[0].payload == b"payload 1"
    assert r.interrupted == [] and r.failed == []
    assert r.max_seq == 10


def test_max_seq_counts_finished_jobs_and_is_zero_when_empty(path: Path) -> None:
    with Journal.open(path) as j:
        assert j.recover(T0).max_seq == 0
        j.record_submit(rec(41))
        j.record_start("j-0041", T0)
        j.record_finish("j-0041", JobState.SUCCEEDED, T0)
        assert j.recover(T0).max_seq == 41


def test_the_file_is_private_in_wal_mode_with_a_schema_version(path: Path) -> None:
    old = os.umask(0o022)
    try:
        j = Journal.open(path)
    finally:
        os.umask(old)
    j.record_submit(rec(1))
    for name in (path, Path(f"{path}-wal")):
        assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
    j.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    db.close()


def test_a_second_opener_is_refused_while_the_journal_is_open(path: Path) -> None:
    with Journal.open(path) as j:
        j.record_submit(rec(1))
        with pytest.raises(JournalInUse, match="another vramtui engine already runs"):
            Journal.open(path)
        assert path.exists()  # refused, not taken for corrupt
        j.record_submit(rec(2))
    with Journal.open(path) as j:
        assert len(j.recover(T0).jobs) == 2


def test_misuse_is_refused_and_changes_nothing(path: Path) -> None:
    with Journal.open(path) as j:
        j.record_submit(rec(1))
        with pytest.raises(JournalError, match="already journaled"):
            j.record_submit(rec(1, backend="other"))
        with pytest.raises(JournalError, match="already journaled"):
            j.record_submit(rec(2, id="j-0001"))
        with pytest.raises(JournalError, match="unknown"):
            j.record_start("j-nope", T0)
        with pytest.raises(JournalError, match="unknown"):
            j.record_finish("j-nope", JobState.FAILED, T0)
        with pytest.raises(ValueError):
            j.record_state("j-0001", JobState.RUNNING, T0)
        with pytest.raises(ValueError):
            j.record_finish("j-0001", JobState.QUEUED, T0)
        with pytest.raises(ValueError):
            j.record_submit(rec(3, state=JobState.SUCCEEDED))
        j.record_start("j-0001", T0 + 5)
        j.record_finish("j-0001", JobState.CANCELLED, T0 + 6)
        with pytest.raises(JournalError, match="already finished"):
            j.record_finish("j-0001", JobState.SUCCEEDED, T0 + 7, data=b"late")
        with pytest.raises(JournalError, match="already finished"):
            j.record_start("j-0001", T0 + 7)
        got = j.finished("j-0001")
        assert j.recover(T0 + 8).jobs == []
    assert got is not None and got.backend == "sd" and got.state is JobState.CANCELLED
    assert got.data is None and got.attempts == 1
    with pytest.raises(JournalError, match="closed"):
        j.record_submit(rec(9))


# -- recovery rules ----------------------------------------------------------------------------


def test_running_job_is_interrupted_and_requeued_once_then_failed(path: Path) -> None:
    with Journal.open(path) as j:
        for i in (1, 2, 3):
            j.record_submit(rec(i))
        j.record_start("j-0002", T0 + 10, "on sd (pid 1)")
    # the engine "crashed" with j-0002 running
    with Journal.open(path) as j:
        r = j.recover(T0 + 20)
        assert [x.id for x in r.jobs] == ["j-0001", "j-0002", "j-0003"]
        assert r.interrupted == ["j-0002"] and r.failed == []
        again = r.jobs[1]
        assert again.state is JobState.QUEUED and again.attempts == 1
        assert again.payload == b"payload 2"
        assert again.history[-1] == (T0 + 20, "interrupted", INTERRUPTED)
        j.record_start("j-0002", T0 + 21, "on sd (pid 2)")
    # and crashed again while it ran its second attempt
    with Journal.open(path) as j:
        r = j.recover(T0 + 30)
        assert [x.id for x in r.jobs] == ["j-0001", "j-0003"]
        assert r.interrupted == []
        assert [x.id for x in r.failed] == ["j-0002"]
        failed = j.finished("j-0002")
        assert j.recover(T0 + 40) == type(r)(r.jobs, [], [], 3)  # idempotent: nothing new
    assert failed is not None and failed.state is JobState.FAILED
    assert failed.error is not None and "interrupted twice" in failed.error
    assert "not run a third time" in failed.error
    assert failed.finished_wall == T0 + 30 and failed.payload == b""
    assert [h[1] for h in failed.history] == [
        "queued",
        "running",
        "interrupted",
        "running",
        "failed",
    ]


def test_starting_job_goes_back_to_queued_without_an_attempt(path: Path) -> None:
    with Journal.open(path) as j:
        j.record_submit(rec(1))
        j.record_state("j-0001", JobState.STARTING, T0 + 5, "starting sd on GPU1")
    with Journal.open(path) as j:
        r = j.recover(T0 + 9)
    assert [x.id for x in r.jobs] == ["j-0001"] and r.interrupted == []
    job = r.jobs[0]
    assert job.state is JobState.QUEUED and job.attempts == 0
    assert job.history[-1][:2] == (T0 + 9, "queued")


def test_a_job_the_engine_requeued_itself_is_not_interrupted(path: Path) -> None:
    with Journal.open(path) as j:
        j.record_submit(rec(1))
        j.record_start("j-0001", T0 + 1)
        j.record_state("j-0001", JobState.QUEUED, T0 + 2, "requeued: worker crashed")
    with Journal.open(path) as j:
        r = j.recover(T0 + 3)
    assert r.interrupted == [] and r.jobs[0].attempts == 1
    assert r.jobs[0].history[-1] == (T0 + 2, "queued", "requeued: worker crashed")


def test_recovery_is_committed_so_a_second_crash_does_not_mark_twice(path: Path) -> None:
    with Journal.open(path) as j:
        j.record_submit(rec(1))
        j.record_start("j-0001", T0 + 1)
    with Journal.open(path) as j:
        assert j.recover(T0 + 2).interrupted == ["j-0001"]
    with Journal.open(path) as j:  # crashed before starting it again
        r = j.recover(T0 + 3)
    assert r.interrupted == [] and r.failed == []
    assert [h[1] for h in r.jobs[0].history] == ["queued", "running", "interrupted"]


# -- kill -9 for real --------------------------------------------------------------------------

CHILD = r"""
import sys
from pathlib import Path
from supervisor.jobs import JobState
from supervisor.journal import JobRecord, Journal

path, mode = Path(sys.argv[1]), sys.argv[2]
j = Journal.open(path)
if mode == "submit":
    i = 0
    while True:
        i += 1
        j.record_submit(JobRecord(id=f"j-{i:06d}", seq=i, backend="sd", payload=bytes(1000),
                                  submitted_wall=float(i), history=[(float(i), "queued", "")]))
        print("ok", i, flush=True)
elif mode == "run":
    for i in (1, 2, 3):
        j.record_submit(JobRecord(id=f"j-{i}", seq=i, backend="sd", payload=b"p%d" % i,
                                  submitted_wall=float(i), history=[(float(i), "queued", "")]))
    j.record_start("j-1", 10.0, "pid a")
    j.record_start("j-2", 11.0, "pid b")
    j.record_finish("j-2", JobState.SUCCEEDED, 12.0, data=b"result 2", status_code=200)
elif mode == "rerun":
    r = j.recover(100.0)
    j.record_start(r.jobs[0].id, 101.0, "pid c")
print("ready", flush=True)
sys.stdin.read()  # wait here until killed
"""


def run_child_until(path: Path, mode: str, lines: int) -> list[str]:
    """Run CHILD, read ``lines`` lines of its stdout, SIGKILL it; return the lines read."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), mode],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    got: list[str] = []
    try:
        while len(got) < lines:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"child ended early: {proc.stderr.read()}")
            got.append(line.strip())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL
    return got


@pytest.mark.process
def test_kill_9_loses_no_acknowledged_submit(path: Path) -> None:
    acked = run_child_until(path, "submit", 400)
    assert acked[-1] == "ok 400"
    assert Path(f"{path}-wal").stat().st_size > 0  # the commits live in the WAL, unmerged
    with Journal.open(path) as j:
        r = j.recover(1e9)
    ids = [x.id for x in r.jobs]
    # every acknowledged job is back, and what is back is a gap-free prefix, in order
    assert len(ids) >= 400
    assert ids == [f"j-{i:06d}" for i in range(1, len(ids) + 1)]
    assert r.max_seq == len(ids)
    assert all(x.payload == bytes(1000) for x in r.jobs)


@pytest.mark.process
def test_kill_9_while_running_interrupts_once_then_fails(path: Path) -> None:
    run_child_until(path, "run", 1)
    with Journal.open(path, now_wall=50.0) as j:  # the child's clock starts at 0
        r = j.recover(50.0)
        assert [x.id for x in r.jobs] == ["j-1", "j-3"]
        assert r.interrupted == ["j-1"]
        assert r.jobs[0].history[-1] == (50.0, "interrupted", INTERRUPTED)
        done = j.finished("j-2")
        assert done is not None and done.data == b"result 2" and done.status_code == 200
    run_child_until(path, "rerun", 1)  # recovers, starts j-1 again, is killed again
    with Journal.open(path, now_wall=200.0) as j:
        r = j.recover(200.0)
        failed = j.finished("j-1")
    assert [x.id for x in r.jobs] == ["j-3"]
    assert [x.id for x in r.failed] == ["j-1"]
    assert failed is not None and failed.state is JobState.FAILED and failed.attempts == 2
    assert failed.error is not None and "interrupted twice" in failed.error


# -- corrupt, newer, foreign -------------------------------------------------------------------


def make_real_journal(path: Path, jobs: int = 200) -> None:
    with Journal.open(path) as j:
        for i in range(1, jobs + 1):
            j.record_submit(rec(i, payload=os.urandom(2000)))


def assert_moved_aside(exc: JournalCorrupt, path: Path, original: bytes) -> None:
    assert exc.moved_to is not None
    assert not path.exists()
    assert exc.moved_to.read_bytes() == original
    assert exc.moved_to.name.startswith(f"{path.name}.corrupt-")
    assert "corrupt" in str(exc) and str(exc.moved_to) in str(exc)


def test_random_bytes_are_refused_and_moved_aside_with_the_wal(path: Path) -> None:
    junk = b"not a database" + os.urandom(8192)
    wal = os.urandom(5000)
    path.write_bytes(junk)
    Path(f"{path}-wal").write_bytes(wal)
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path)
    assert_moved_aside(info.value, path, junk)
    assert Path(f"{info.value.moved_to}-wal").read_bytes() == wal
    assert not Path(f"{path}-wal").exists()


def test_a_truncated_real_journal_is_refused_and_moved_aside(path: Path) -> None:
    make_real_journal(path)
    whole = path.read_bytes()
    cut = whole[: len(whole) // 2]
    path.write_bytes(cut)
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path)
    assert_moved_aside(info.value, path, cut)


def test_a_corrupt_page_fails_quick_check(path: Path) -> None:
    make_real_journal(path)
    data = bytearray(path.read_bytes())
    data[4096 * 3 : 4096 * 3 + 200] = os.urandom(200)  # a b-tree page, header intact
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path)
    assert_moved_aside(info.value, path, bytes(data))


def test_moving_aside_never_overwrites(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_mod, "_stamp", lambda: "STAMP")
    taken = path.parent / f"{path.name}.corrupt-STAMP"
    taken.write_bytes(b"an older corrupt journal")
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(JournalCorrupt) as info:
        Journal.open(path)
    assert info.value.moved_to == path.parent / f"{path.name}.corrupt-STAMP.1"
    assert taken.read_bytes() == b"an older corrupt journal"
    assert info.value.moved_to.read_bytes() == b"garbage" * 100


def test_start_fresh_after_moving_a_corrupt_journal_aside(path: Path) -> None:
    path.write_bytes(os.urandom(3000))
    j = Journal.open(path, on_corrupt="move_aside_and_start_fresh")
    with j:
        assert j.moved_aside is not None and j.moved_aside.exists()
        assert j.notice is not None and str(j.moved_aside) in j.notice
        j.record_submit(rec(1))
        assert [x.id for x in j.recover(T0).jobs] == ["j-0001"]


def test_after_refusing_a_corrupt_journal_the_next_open_starts_fresh(path: Path) -> None:
    path.write_bytes(os.urandom(3000))
    with pytest.raises(JournalCorrupt):
        Journal.open(path)
    with Journal.open(path) as j:
        assert j.recover(T0).jobs == [] and j.moved_aside is None


def test_a_journal_from_a_newer_vramtui_is_refused_untouched(path: Path) -> None:
    make_real_journal(path, jobs=3)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    before, listing = path.read_bytes(), siblings(path)
    with pytest.raises(JournalTooNew) as info:
        Journal.open(path)
    assert str(info.value) == (
        f"journal {path} was written by a newer vramtui (schema 3, this one reads "
        f"{SCHEMA_VERSION}); upgrade vramtui or move the file away"
    )
    assert path.read_bytes() == before
    assert siblings(path) == listing  # no -wal/-shm created, nothing moved


def test_a_foreign_database_is_refused_untouched(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE photos (name TEXT)")
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(JournalError, match="not a vramtui journal"):
        Journal.open(path)
    assert path.read_bytes() == before
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    db.close()


def test_an_empty_file_becomes_a_journal(path: Path) -> None:
    path.write_bytes(b"")
    with Journal.open(path) as j:
        j.record_submit(rec(1))
        assert len(j.recover(T0).jobs) == 1


def test_a_stray_wal_without_its_journal_is_set_aside(path: Path) -> None:
    stray = os.urandom(4000)
    Path(f"{path}-wal").write_bytes(stray)
    with Journal.open(path) as j:
        j.record_submit(rec(1))
    aside = [p for p in path.parent.iterdir() if p.name.endswith("-wal") and ".corrupt-" in p.name]
    assert len(aside) == 1 and aside[0].read_bytes() == stray


# -- keeping finished results ------------------------------------------------------------------


def finish_jobs(j: Journal, seqs: range, t: float) -> None:
    for i in seqs:
        j.record_submit(rec(i))
        j.record_start(f"j-{i:04d}", t + i)
        j.record_finish(f"j-{i:04d}", JobState.SUCCEEDED, t + i, data=b"r%d" % i)


def test_prune_by_count_keeps_the_newest_and_never_pending_jobs(path: Path) -> None:
    with Journal.open(path, keep_finished=5) as j:
        j.record_submit(rec(100))  # pending: never pruned
        finish_jobs(j, range(1, 11), T0)
        assert j.prune(T0 + 20) == 5
        assert [r.id for r in j.recent(100)] == [f"j-{i:04d}" for i in range(10, 5, -1)]
        assert j.finished("j-0005") is None and j.finished("j-0006") is not None
        assert j.prune(T0 + 20) == 0
        assert [r.id for r in j.recover(T0 + 20).jobs] == ["j-0100"]
        assert [r.id for r in j.recent(2)] == ["j-0010", "j-0009"]


def test_prune_by_age_and_at_open(path: Path) -> None:
    with Journal.open(path, keep_age_s=100) as j:
        finish_jobs(j, range(1, 11), T0)  # finished at T0+1 … T0+10
        assert j.prune(T0 + 105.5) == 5  # older than T0+5.5
        assert [r.id for r in j.recent(100)][-1] == "j-0006"
    with Journal.open(path, keep_age_s=100, now_wall=T0 + 108.5) as j:
        assert [r.id for r in j.recent(100)] == ["j-0010", "j-0009"]
    with Journal.open(path, now_wall=T0 + 108.5) as j:  # default keeps a week: nothing lost
        assert len(j.recent(100)) == 2


def test_record_finish_prunes_every_so_often(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journal_mod, "PRUNE_EVERY", 4)
    with Journal.open(path, keep_finished=2) as j:
        finish_jobs(j, range(1, 4), T0)
        assert len(j.recent(100)) == 3  # 3 finishes: not yet
        finish_jobs(j, range(4, 5), T0)
        assert [r.id for r in j.recent(100)] == ["j-0004", "j-0003"]


# -- property: any history of operations, reopened, matches a simple model ----------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, 3)),
        st.tuples(st.just("start"), st.integers(0, 30)),
        st.tuples(st.just("state"), st.integers(0, 30), st.sampled_from(["queued", "starting"])),
        st.tuples(
            st.just("finish"),
            st.integers(0, 30),
            st.sampled_from(["succeeded", "failed", "cancelled", "timed_out"]),
        ),
        st.tuples(st.just("reopen")),
    ),
    max_size=30,
)


class Model:
    """What the journal should hold: id -> [seq, state, attempts, history]."""

    def __init__(self) -> None:
        self.jobs: dict[str, list[Any]] = {}
        self.seq = 0

    def recover(self, t: float) -> None:
        for job in self.jobs.values():
            if job[1] == "starting":
                job[1] = "queued"
                job[3].append((t, "queued", journal_mod.STARTING_NOTE))
            elif job[1] == "running" and job[2] >= 2:
                error = journal_mod.INTERRUPTED_TWICE.format(attempt=job[2])
                job[1] = "failed"
                job[3].append((t, "failed", error))
            elif job[1] == "running":
                job[1] = "queued"
                note = journal_mod.INTERRUPTED_NOTE.format(attempt=job[2] + 1)
                job[3].append((t, "interrupted", note))

    def pending(self) -> list[tuple[str, int, str, int, list[Any]]]:
        rows = [(i, *v) for i, v in self.jobs.items() if not JobState(v[1]).finished]
        return sorted(rows, key=lambda r: r[1])


def apply(j: Journal, model: Model, op: tuple[Any, ...], t: float) -> None:
    ids = list(model.jobs)
    if op[0] == "submit":
        model.seq += 1 + op[1]  # gaps in seq are allowed
        job_id = f"j-{model.seq}"
        j.record_submit(rec(model.seq, id=job_id, history=[(t, "queued", "")]))
        model.jobs[job_id] = [model.seq, "queued", 0, [(t, "queued", "")]]
        return
    if not ids:
        return
    job_id = ids[op[1] % len(ids)]
    job = model.jobs[job_id]
    done = JobState(job[1]).finished
    if op[0] == "start":
        if done:
            with pytest.raises(JournalError):
                j.record_start(job_id, t)
            return
        j.record_start(job_id, t, "go")
        job[1], job[2] = "running", job[2] + 1
        job[3].append((t, "running", "go"))
    elif op[0] == "state":
        if done:
            with pytest.raises(JournalError):
                j.record_state(job_id, JobState(op[2]), t)
            return
        j.record_state(job_id, JobState(op[2]), t, "moved")
        job[1] = op[2]
        job[3].append((t, op[2], "moved"))
    elif op[0] == "finish":
        if done:
            with pytest.raises(JournalError):
                j.record_finish(job_id, JobState(op[2]), t)
            return
        j.record_finish(job_id, JobState(op[2]), t, data=b"d")
        job[1] = op[2]
        job[3].append((t, op[2], ""))


def observed(r: Any) -> list[tuple[str, int, str, int, list[Any]]]:
    return [(x.id, x.seq, x.state.value, x.attempts, x.history) for x in r.jobs]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_reopen_matches_the_model(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.sqlite3"
        model = Model()
        j = Journal.open(path, keep_finished=10_000, now_wall=T0)
        try:
            for n, op in enumerate(ops):
                t = T0 + n / 7  # awkward fractions: times must come back exactly
                if op[0] == "reopen":
                    j.close()
                    j = Journal.open(path, keep_finished=10_000, now_wall=T0)
                    r = j.recover(t)
                    model.recover(t)
                    assert observed(r) == model.pending()
                else:
                    apply(j, model, op, t)
            j.close()
            j = Journal.open(path, keep_finished=10_000, now_wall=T0)
            t_end = T0 + 1000
            r = j.recover(t_end)
            model.recover(t_end)
            assert observed(r) == model.pending()
            assert r.max_seq == model.seq
            for job_id, (_seq, state, attempts, history) in model.jobs.items():
                if JobState(state).finished:
                    got = j.finished(job_id)
                    assert got is not None
                    assert (got.state.value, got.attempts, got.history) == (
                        state,
                        attempts,
                        history,
                    )
        finally:
            j.close()


# The schema-1 layout exactly as vramtui wrote it before the journal kept where a job ran and
# its peak: a journal of an older vramtui must load, migrated in place.
_SCHEMA_1 = (
    """CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, backend TEXT NOT NULL,
        priority INTEGER NOT NULL, timeout REAL, metadata BLOB NOT NULL,
        stream INTEGER NOT NULL, submitted_wall REAL NOT NULL, state TEXT NOT NULL,
        attempts INTEGER NOT NULL, history TEXT NOT NULL, started_wall REAL,
        finished_wall REAL, status_code INTEGER, error TEXT, headers BLOB)""",
    "CREATE INDEX jobs_finished ON jobs(finished_wall) WHERE finished_wall IS NOT NULL",
    "CREATE TABLE blobs (seq INTEGER PRIMARY KEY, payload BLOB, data BLOB, chunks BLOB)",
)


def _schema_1_journal(path: Path, now: float) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("BEGIN")
    for statement in _SCHEMA_1:
        db.execute(statement)
    entry = journal_mod._entry  # the history's text, as schema 1 wrote it too
    for seq, finished in ((1, now + 1), (2, None)):
        history = entry(now, "queued", "") + (entry(now + 1, "succeeded", "") if finished
                                               else "")
        db.execute("INSERT INTO jobs VALUES (?, ?, 'sd', 0, NULL, ?, 0, ?, ?, ?, ?, ?, ?, "
                   "?, NULL, NULL)",
                   (seq, f"j-{seq:04d}", msgpack.packb({}), now,
                    "succeeded" if finished else "queued", 1 if finished else 0, history,
                    now + 0.5 if finished else None, finished, 200 if finished else None))
        db.execute("INSERT INTO blobs (seq, payload, data) VALUES (?, ?, ?)",
                   (seq, None if finished else b"req", b"old result" if finished else None))
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute("PRAGMA user_version = 1")
    db.execute("COMMIT")
    db.close()


def test_a_schema_1_journal_is_migrated_and_keeps_where_a_job_ran_from_then_on(
        path: Path) -> None:
    now = time.time()  # (older finished jobs are pruned at open)
    _schema_1_journal(path, now)
    with Journal.open(path) as j:
        old = j.finished("j-0001")
        assert old is not None and old.state is JobState.SUCCEEDED
        assert old.data == b"old result" and old.gpu is None and old.peak_mib is None
        r = j.recover(now + 5)
        assert [x.id for x in r.jobs] == ["j-0002"] and r.jobs[0].payload == b"req"
        j.record_start("j-0002", now + 6)
        j.record_finish("j-0002", JobState.SUCCEEDED, now + 7, data=b"new", gpu=0,
                        peak_mib=256)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    db.close()
    with Journal.open(path) as j:  # reopened: migrated once, nothing lost
        new = j.finished("j-0002")
        assert new is not None and (new.gpu, new.peak_mib, new.data) == (0, 256, b"new")
        assert [x.id for x in j.recent(10)] == ["j-0002", "j-0001"]
