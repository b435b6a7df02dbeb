"""Attacks from the same machine: planted links, a journal that cannot store, a damaged WAL,
a full disk, a flooding worker, and values no caller should be able to slip in.

The truths checked are outside the code under test: the modes and owners of files on disk,
what a fresh Journal reads back, which acknowledged ids a damaged WAL really lost.  Attacks
as another user live in ``test_hostile_users.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import ROOT
from serve_support import echo_backend, in_process, make_env, new_root
from waiting import wait_until

from supervisor import Supervisor
from supervisor.client import Client
from supervisor.engine import EngineConfig
from supervisor.errors import InvalidRequest
from supervisor.jobs import JobState
from supervisor.journal import (
    JobRecord,
    Journal,
    JournalError,
    JournalFull,
    JournalUnstorable,
    scan_wal,
)
from supervisor.paths import Paths, PathsError, read_runtime_pointer
from supervisor.workers import process

HOSTILE = ROOT / "tests" / "workers" / "hostile.py"
OTHER_UID = 54321
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def hostile_backend() -> dict[str, object]:
    return {"name": "hostile", "script": str(HOSTILE),
            "vram": {"weights": "0MiB", "activation": "16MiB"},
            "timeouts": {"stop_grace": "3s"}}


def rec(i: int, **kw: object) -> JobRecord:
    base: dict[str, object] = dict(id="j-%010x" % (0xABC000 + i), seq=i, backend="echo",
                                   payload=b"p" * 100, submitted_wall=1.0e9 + i,
                                   history=[(1.0e9 + i, "queued", "")])
    base.update(kw)
    return JobRecord(**base)  # type: ignore[arg-type]


def paths_in(tmp: Path, **kw: object) -> Paths:
    return Paths(tmp / "cfg", tmp / "state", tmp / "run", **kw)  # type: ignore[arg-type]


# -- planted links --------------------------------------------------------------------------------


def test_a_runtime_dir_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path
                                                                          ) -> None:
    target = tmp_path / "precious"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (tmp_path / "run").symlink_to(target)
    with pytest.raises(PathsError, match="symbolic link.*refusing to follow") as info:
        paths_in(tmp_path).ensure()
    assert "\n" not in str(info.value)
    assert mode(target) == 0o755 and list(target.iterdir()) == []


@root_only
def test_a_link_planted_by_another_user_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    target.mkdir(mode=0o700)
    for name in ("state", "run"):  # in the order ensure() meets them
        link = tmp_path / name
        link.symlink_to(target)
        os.lchown(link, OTHER_UID, OTHER_UID)
        with pytest.raises(PathsError, match=f"owned by uid {OTHER_UID}"):
            paths_in(tmp_path).ensure()
        link.unlink()
        (tmp_path / name).mkdir(mode=0o700)
    assert list(target.iterdir()) == []


def test_a_state_dir_moved_by_its_owner_through_a_link_is_fine(tmp_path: Path) -> None:
    elsewhere = tmp_path / "disk2"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(elsewhere)
    paths = paths_in(tmp_path).ensure()
    assert (elsewhere / "logs").is_dir() and paths.journal_path.parent == tmp_path / "state"


@root_only
def test_a_squatted_implicit_runtime_dir_moves_to_a_private_one(tmp_path: Path) -> None:
    squatted = tmp_path / "run"
    squatted.mkdir()
    os.chmod(squatted, 0o777)
    os.chown(squatted, OTHER_UID, OTHER_UID)
    moved: Path | None = None
    try:
        paths = paths_in(tmp_path, implicit_runtime=True).ensure()
        moved = paths.runtime_dir
        assert moved != squatted and moved.name.startswith(f"vramtui-{os.getuid()}.")
        st = os.lstat(moved)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and mode(moved) == 0o700
        assert read_runtime_pointer(paths.runtime_pointer) == moved  # clients find it here
        again = paths_in(tmp_path, implicit_runtime=True).ensure()
        assert again.runtime_dir == moved  # the next start reuses it
        assert os.lstat(squatted).st_uid == OTHER_UID and mode(squatted) == 0o777  # untouched
        # An explicitly chosen directory is refused instead, in one line.
        with pytest.raises(PathsError, match="belongs to uid 54321.*VRAMTUI_RUNTIME_DIR"):
            paths_in(tmp_path).ensure()
    finally:
        if moved is not None:
            shutil.rmtree(moved, ignore_errors=True)


@root_only
def test_a_planted_runtime_pointer_is_ignored(tmp_path: Path) -> None:
    pointer = tmp_path / "runtime-dir"
    pointer.write_text("/etc\n")
    assert read_runtime_pointer(pointer) is None  # not a vramtui directory
    elsewhere = Path(tempfile.mkdtemp(prefix=f"vramtui-{os.getuid()}.", dir="/tmp"))
    try:
        pointer.write_text(f"{elsewhere}\n")
        assert read_runtime_pointer(pointer) == elsewhere
        os.chown(pointer, OTHER_UID, OTHER_UID)
        assert read_runtime_pointer(pointer) is None  # a record someone else wrote
        os.chown(pointer, 0, 0)
        os.chown(elsewhere, OTHER_UID, OTHER_UID)
        assert read_runtime_pointer(pointer) is None  # a directory someone else owns
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_journal_and_worker_log_links_are_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    link = tmp_path / "journal.sqlite3"
    link.symlink_to(victim)
    with pytest.raises(JournalError, match="symbolic link"):
        Journal.open(link)
    log = tmp_path / "echo.log"
    log.symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        asyncio.run(process.spawn(["true"], env=os.environ, cwd=None, log_path=log))
    assert victim.read_bytes() == b"keep me"


# -- what the journal cannot store ----------------------------------------------------------------


def test_a_value_the_journal_cannot_hold_is_refused_cleanly(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.sqlite3") as j:
        with pytest.raises(JournalUnstorable, match="cannot be stored"):
            j.record_submit(rec(1, priority=2**63))
        j.record_submit(rec(2))
        with pytest.raises(JournalUnstorable):
            j.record_finish(rec(2).id, JobState.SUCCEEDED, 2e9, status_code=2**64 - 1)
        with pytest.raises(JournalUnstorable):
            j.record_finish(rec(2).id, JobState.SUCCEEDED, 2e9, headers={"odd": {1, 2}})
        state, why = j.finish_durably(rec(2).id, JobState.SUCCEEDED, 2e9, data=b"x",
                                      status_code=2**64 - 1)
        assert state is JobState.FAILED and "could not be recorded" in (why or "")
    with Journal.open(tmp_path / "j.sqlite3") as j:
        assert j.recover(2e9).jobs == []  # never runs again
        done = j.finished(rec(2).id)
        assert done is not None and done.state is JobState.FAILED and done.data is None
        assert j.finished(rec(1).id) is None


def fresh_engine(env: dict[str, str], config: EngineConfig | None = None) -> Supervisor:
    sup = Supervisor.from_config(gpus="sim:8GiB", backends=[env["VRAMTUI_TEST_BACKENDS"]],
                                 environ=env, paths=Paths.from_env(env),
                                 config=config or EngineConfig(reserve_mib=0, tick_s=0.1))
    return sup.start_in_thread()


@contextlib.contextmanager
def engine_root(backends: list[dict[str, object]]) -> Iterator[dict[str, str]]:
    root = new_root()
    try:
        yield make_env(root, backends)  # type: ignore[arg-type]
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.process
def test_a_reply_the_journal_cannot_store_fails_and_is_not_run_again() -> None:
    with engine_root([hostile_backend()]) as env:
        sup = fresh_engine(env)
        try:
            job = sup.submit("hostile", json.dumps({"status": 2**64 - 1}).encode())
            view = sup.wait(job, 60)
            assert view.state is JobState.FAILED, view  # never reported as succeeded
        finally:
            sup.stop(timeout=30)
        sup = fresh_engine(env)
        try:
            again = sup.job(job)
            assert again.state is JobState.FAILED and again.error == view.error
            assert not any("recovered" in line.text for line in sup.snapshot().log)
        finally:
            sup.stop(timeout=30)


# -- a damaged write-ahead log --------------------------------------------------------------------


def crashed_journal(tmp: Path, n: int) -> tuple[Path, list[str]]:
    """A journal with ``n`` acknowledged submits, as a kill -9 leaves it (WAL not folded in)."""
    live = tmp / "live" / "journal.sqlite3"
    live.parent.mkdir()
    copy = tmp / "journal.sqlite3"
    with Journal.open(live, reserve_bytes=0) as j:
        for i in range(1, n + 1):
            j.record_submit(rec(i))
        shutil.copy(live, copy)
        shutil.copy(f"{live}-wal", f"{copy}-wal")  # a crash-consistent image, taken while open
    return copy, [rec(i).id for i in range(1, n + 1)]


def flip_middle_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_damaged_wal_says_which_acknowledged_jobs_it_lost(tmp_path: Path) -> None:
    path, acked = crashed_journal(tmp_path, 50)
    wal = Path(f"{path}-wal")
    clean = scan_wal(wal)
    assert clean is not None and not clean.damaged and clean.replayed == clean.frames
    flip_middle_byte(wal)
    damaged = wal.read_bytes()
    with Journal.open(path) as j:
        kept = {r.id for r in j.recover(2e9).jobs}
        damage = j.damage
    truly_lost = sorted(set(acked) - kept)
    assert truly_lost  # the attack works: SQLite silently dropped acknowledged jobs
    assert damage is not None and sorted(damage.lost_jobs) == truly_lost  # and we say which
    line = damage.describe()
    assert f"{len(truly_lost)} accepted job(s) were lost" in line and truly_lost[0] in line
    assert "\n" not in line
    assert damage.kept_at is not None and Path(f"{damage.kept_at}-wal").exists()
    assert Path(f"{damage.kept_at}-wal").read_bytes() == damaged  # the evidence, as it was
    assert damage.report is not None
    listed = [ln.split()[1] for ln in damage.report.read_text().splitlines()
              if ln.startswith("lost ")]
    assert listed == truly_lost


def test_a_clean_crash_is_not_reported_as_damage(tmp_path: Path) -> None:
    path, acked = crashed_journal(tmp_path, 20)
    with Journal.open(path) as j:
        assert j.damage is None
        assert sorted(r.id for r in j.recover(2e9).jobs) == sorted(acked)


@pytest.mark.process
def test_the_engine_logs_the_lost_jobs_at_start() -> None:
    with engine_root([echo_backend()]) as env:
        state = Path(env["VRAMTUI_STATE_DIR"])
        state.mkdir(mode=0o700)
        scratch = Path(tempfile.mkdtemp(dir="/tmp"))
        try:
            made, _acked = crashed_journal(scratch, 30)
            for suffix in ("", "-wal"):
                shutil.copy(f"{made}{suffix}", state / f"journal.sqlite3{suffix}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        flip_middle_byte(state / "journal.sqlite3-wal")
        sup = fresh_engine(env)
        try:
            log = [line for line in sup.snapshot().log if "write-ahead log" in line.text]
            assert log and log[0].level == "error"
            assert "accepted job(s) were lost: j-" in log[0].text
        finally:
            sup.stop(timeout=30)


# -- a full disk ----------------------------------------------------------------------------------


@pytest.fixture
def small_disk() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="vt-disk-", dir="/tmp"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs",
                           str(where)], capture_output=True)
    if done.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def fill(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb") as f:
        block = bytes(64 * 1024)
        with contextlib.suppress(OSError):
            while True:
                f.write(block)
                f.flush()
    return filler


@pytest.mark.process
def test_a_full_disk_keeps_room_for_accepted_jobs_and_refuses_new_ones(small_disk: Path
                                                                      ) -> None:
    with Journal.open(small_disk / "journal.sqlite3", reserve_bytes=2 << 20) as j:
        for i in range(1, 6):
            j.record_submit(rec(i))
        filler = fill(small_disk)
        with pytest.raises(OSError) as full:  # the disk really is full
            (small_disk / "more").write_bytes(bytes(64 * 1024))
        assert full.value.errno == errno.ENOSPC
        for i in range(1, 6):  # every accepted job still gets its finish recorded
            state, _why = j.finish_durably(rec(i).id, JobState.SUCCEEDED, 2e9,
                                           data=b"r" * 100_000)
            assert state is JobState.SUCCEEDED
        assert j.reserve_spent
        with pytest.raises(JournalFull, match="new jobs are refused"):
            j.record_submit(rec(9))
        filler.unlink()
        (small_disk / "more").unlink(missing_ok=True)
        j.record_submit(rec(9))  # room again: the reserve is back and submits are taken
        assert not j.reserve_spent
    with Journal.open(small_disk / "journal.sqlite3", reserve_bytes=2 << 20) as j:
        assert all(j.finished(rec(i).id) is not None for i in range(1, 6))
        assert [r.id for r in j.recover(2e9).jobs] == [rec(9).id]


# -- bad values -----------------------------------------------------------------------------------

BAD = [
    ({"priority": 2**63}, "out of range"),
    ({"priority": -(2**63) - 1}, "out of range"),
    ({"priority": True}, "whole number"),
    ({"priority": 1.5}, "whole number"),
    ({"timeout": math.nan}, "finite"),
    ({"timeout": math.inf}, "finite"),
    ({"timeout": -1}, "more than 0"),
    ({"timeout": 0}, "more than 0"),
    ({"timeout": 10**12}, "too long"),
    ({"timeout": "10"}, "number of seconds"),
    ({"metadata": {"x": "y" * 100_000}}, "at most 64"),
    ({"metadata": [1, 2]}, "mapping"),
]


@pytest.mark.parametrize(("kw", "says"), BAD, ids=[str(k) for k, _ in BAD])
def test_bad_values_get_one_clear_error_each(kw: dict[str, object], says: str) -> None:
    from supervisor.validate import check_submit

    with pytest.raises(InvalidRequest, match=says) as info:
        check_submit("echo", b"", priority=kw.get("priority"), timeout=kw.get("timeout"),
                     metadata=kw.get("metadata"), stream=False, max_payload=1 << 20)
    assert "\n" not in str(info.value)


@pytest.mark.process
def test_bad_values_are_refused_at_every_door_without_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    with in_process([echo_backend()]) as (sup, _server, _root), \
            caplog.at_level(logging.DEBUG):
        c = Client(sup.paths.control_socket)
        for api in (sup, c):
            for kw, says in BAD[:10]:
                with pytest.raises(InvalidRequest, match=says):
                    api.submit("echo", b"x", **kw)  # type: ignore[arg-type]
            with pytest.raises(InvalidRequest, match="repeats"):
                api.calibrate("echo", repeats=10**9)
            with pytest.raises(InvalidRequest, match="settle"):
                api.calibrate("echo", settle_s=math.nan)
            with pytest.raises(InvalidRequest, match="finite"):
                api.wait("j-0000000000", timeout=math.nan)
            with pytest.raises(InvalidRequest, match="mapping"):
                api.submit("echo", b"x", metadata=[1, 2])  # type: ignore[arg-type]
        assert c.snapshot().queued == () and c.snapshot().recent == ()  # nothing was queued
        assert not [r for r in caplog.records if r.exc_info or "internal error" in
                    r.getMessage()]
        assert c.submit_wait("echo", b"fine", priority=5, timeout=30).state \
            is JobState.SUCCEEDED
        c.close()


# -- a worker that floods its output --------------------------------------------------------------


@pytest.mark.process
def test_a_flooding_worker_fills_no_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "LOG_MAX_BYTES", 256 * 1024)
    monkeypatch.setattr(process, "LOG_RATE", 64 << 20)
    with in_process([hostile_backend()]) as (sup, _server, _root):
        view = sup.wait(sup.submit("hostile", json.dumps({"flood": 8 << 20}).encode()), 60)
        assert view.state is JobState.SUCCEEDED
        logs = sup.paths.logs_dir
        wait_until(lambda: (logs / "hostile.log.3").exists(), 10, "the log rotated")
        files = sorted(logs.glob("hostile.log*"))
        total = sum(f.stat().st_size for f in files)
        assert len(files) <= process.LOG_KEEP + 1
        assert total <= (process.LOG_KEEP + 1) * (256 * 1024 + 256 * 1024), files
        assert all(mode(f) == 0o600 for f in files)
        assert sup.wait(sup.submit("hostile", b"{}"), 30).state is JobState.SUCCEEDED
