"""The durable job journal: one SQLite file (WAL mode, standard library) that owns job durability.

It owns: recording each job before its submitter hears "accepted", recording its state changes
and its result, replaying it once at engine start (:meth:`Journal.recover`), keeping finished
results retrievable across restarts within a count and an age, and refusing a journal that is
corrupt or was written by a newer vramtui.  It owns no clock (callers pass wall-clock epoch
seconds), no thread and no event loop: the engine calls it from its single loop thread.

Durability.  Every ``record_*`` call is one committed transaction before it returns.  With the
default ``synchronous="NORMAL"`` a commit reaches the operating system (the WAL file) but is not
fsynced: it survives the process being killed in any way (``kill -9``, an abort, an
out-of-memory kill), but the last transactions (those since the latest WAL checkpoint) may be
rolled back by a power loss or an operating-system crash; the file stays consistent either way.
``synchronous="FULL"`` fsyncs the WAL on every commit and survives those too, at the price of
one fsync per call (see ``bench/journal.py``).

Recovery rules (:meth:`Journal.recover`), which keep ids and never re-run a job silently:

- queued jobs come back queued, same id, same ``seq``, in ``seq`` order;
- "starting" jobs (admitted, never dispatched) go back to queued without counting an attempt;
- a running job is marked ``interrupted`` in its history and requeued once, same id; a job
  that is interrupted while running its second attempt (``attempts >= 2``) is finished as
  failed instead ("interrupted twice; not run a third time").

Layout (schema 2, in ``PRAGMA user_version``; a schema-1 journal, without ``jobs.gpu`` and
``jobs.peak_mib``, is migrated in place when opened, by :data:`_MIGRATIONS`; ``PRAGMA
application_id`` marks the file as vramtui's): ``jobs`` holds one small row per job (its
mutable fields, so updates stay cheap), ``blobs`` the request payload (dropped when the job
finishes), the result data and the stream chunks.  ``metadata`` and ``headers`` are msgpack (so
bytes values survive); tuples come back as lists.  History times are exact (``repr`` of the
float).

One connection, with SQLite's exclusive locking mode: while one engine has the journal open, a
second process that opens it gets :class:`JournalError` ("in use").  The connection keeps
``sqlite3``'s same-thread check: open the journal on the thread that will use it (the engine
loop).  A failed write (disk full, I/O error) raises :class:`JournalError` and leaves the
journal as it was before the call, so the caller can refuse the submit.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import sqlite3
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgpack

from supervisor.errors import EngineRunning, VramtuiError
from supervisor.jobs import JobState
from supervisor.paths import open_private

SCHEMA_VERSION = 2
APPLICATION_ID = 0x76726A6C  # "vrjl"
SQLITE_MAGIC = b"SQLite format 3\x00"
FILE_MODE = 0o600
PRUNE_EVERY = 256  # record_finish prunes after this many finishes
RESERVE_BYTES = 8 * 1024 * 1024  # disk kept for the finishes of accepted jobs (see open)

OnCorrupt = Literal["refuse", "move_aside_and_start_fresh"]
Synchronous = Literal["NORMAL", "FULL"]

INTERRUPTED_NOTE = "the engine stopped while it ran; requeued (attempt {attempt})"
INTERRUPTED_TWICE = (
    "interrupted twice: the engine stopped while it ran (attempt {attempt}); not run a third time"
)
STARTING_NOTE = "the engine stopped before it started; requeued"


class JournalError(VramtuiError):
    """The journal cannot be used; the message names the file and says what to do."""


class JournalUnstorable(JournalError):
    """A value the journal cannot hold (an integer over 64 bits, a result over SQLite's limit,
    something msgpack cannot pack); nothing was written."""


class JournalFull(JournalError):
    """The disk under the journal is full (even after its reserve was spent); nothing was
    written."""


class JournalInUse(JournalError, EngineRunning):
    """Another process (another engine) has the journal open: its state directory is taken."""


class JournalTooNew(JournalError):
    """The journal was written by a newer vramtui; the file is left untouched."""


class JournalCorrupt(JournalError):
    """The journal is damaged; it was moved aside (``moved_to``) and never overwritten."""

    def __init__(self, message: str, moved_to: Path | None) -> None:
        super().__init__(message)
        self.moved_to = moved_to


@dataclass(slots=True)
class JobRecord:
    """A job as the journal keeps it: the fields of :class:`supervisor.jobs.Job` that matter.

    Times are wall-clock epoch seconds.  ``history`` holds ``(t_wall, state, note)``;
    ``attempts`` counts the times the job was started (``record_start``).
    """

    id: str
    seq: int
    backend: str
    payload: bytes = b""
    priority: int = 0
    timeout: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    submitted_wall: float = 0.0
    state: JobState = JobState.QUEUED
    history: list[tuple[float, str, str]] = field(default_factory=list)
    attempts: int = 0
    started_wall: float | None = None
    finished_wall: float | None = None
    data: bytes | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    status_code: int | None = None
    error: str | None = None
    chunks: list[bytes] = field(default_factory=list)
    gpu: int | None = None  # where it ran (None: it never ran, or a schema-1 journal)
    peak_mib: int | None = None  # its peak, as the engine measured it


@dataclass(frozen=True, slots=True)
class Recovery:
    """What :meth:`Journal.recover` found.

    ``jobs``: the jobs to requeue, all in state queued, in their original order (by ``seq``).
    ``interrupted``: ids among them that were running and were requeued after an interruption.
    ``failed``: jobs that were running a second time and were finished as failed instead.
    ``max_seq``: the largest ``seq`` in the journal (0 if none); number new jobs after it.
    """

    jobs: list[JobRecord]
    interrupted: list[str]
    failed: list[JobRecord]
    max_seq: int


# -- SQL -------------------------------------------------------------------------------------

_SCHEMA = (
    """CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        backend TEXT NOT NULL,
        priority INTEGER NOT NULL,
        timeout REAL,
        metadata BLOB NOT NULL,
        stream INTEGER NOT NULL,
        submitted_wall REAL NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        history TEXT NOT NULL,
        started_wall REAL,
        finished_wall REAL,
        status_code INTEGER,
        error TEXT,
        headers BLOB,
        gpu INTEGER,
        peak_mib INTEGER
    )""",
    "CREATE INDEX jobs_finished ON jobs(finished_wall) WHERE finished_wall IS NOT NULL",
    """CREATE TABLE blobs (
        seq INTEGER PRIMARY KEY,
        payload BLOB,
        data BLOB,
        chunks BLOB
    )""",
)

#: schema version -> the statements that bring a journal of that version to the next one
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE jobs ADD COLUMN gpu INTEGER",
        "ALTER TABLE jobs ADD COLUMN peak_mib INTEGER"),
}

_COLUMNS = (
    "j.seq, j.id, j.backend, j.priority, j.timeout, j.metadata, j.stream, j.submitted_wall, "
    "j.state, j.attempts, j.history, j.started_wall, j.finished_wall, j.status_code, j.error, "
    "j.headers, j.gpu, j.peak_mib, b.payload, b.data, b.chunks"
)
_SELECT = f"SELECT {_COLUMNS} FROM jobs j LEFT JOIN blobs b ON b.seq = j.seq"

_INSERT_JOB = (
    "INSERT INTO jobs (seq, id, backend, priority, timeout, metadata, stream, submitted_wall, "
    "state, attempts, history, started_wall) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_BLOB = "INSERT INTO blobs (seq, payload) VALUES (?, ?)"
_START = (
    "UPDATE jobs SET state = 'running', attempts = attempts + 1, history = history || ?, "
    "started_wall = coalesce(started_wall, ?) WHERE id = ? AND finished_wall IS NULL"
)
_PRIORITY = ("UPDATE jobs SET priority = ?, history = history || ? "
             "WHERE id = ? AND finished_wall IS NULL")
_STATE = "UPDATE jobs SET state = ?, history = history || ? WHERE id = ? AND finished_wall IS NULL"
_FINISH_JOB = (
    "UPDATE jobs SET state = ?, history = history || ?, finished_wall = ?, status_code = ?, "
    "error = ?, headers = ?, gpu = ?, peak_mib = ? WHERE id = ? AND finished_wall IS NULL"
)
_FINISH_BLOB = (
    "UPDATE blobs SET payload = NULL, data = ?, chunks = ? "
    "WHERE seq = (SELECT seq FROM jobs WHERE id = ?)"
)
_FINISH_BLOB_EMPTY = (
    "UPDATE blobs SET payload = NULL WHERE seq = (SELECT seq FROM jobs WHERE id = ?)"
)
_PENDING = f"{_SELECT} WHERE j.finished_wall IS NULL ORDER BY j.seq"
_FINISHED_ONE = f"{_SELECT} WHERE j.id = ? AND j.finished_wall IS NOT NULL"
_RECENT = (
    f"{_SELECT} WHERE j.finished_wall IS NOT NULL ORDER BY j.finished_wall DESC, j.seq DESC LIMIT ?"
)
_PRUNE_SELECT = (
    "SELECT seq FROM jobs WHERE finished_wall IS NOT NULL AND finished_wall < ? "
    "UNION SELECT seq FROM (SELECT seq FROM jobs WHERE finished_wall IS NOT NULL "
    "ORDER BY finished_wall DESC, seq DESC LIMIT -1 OFFSET ?)"
)


_encode = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode


def _entry(t: float, state: str, note: str) -> str:
    """One history entry as a JSON-array element with a leading comma (appended with ``||``)."""
    return "," + _encode([t, state, note])


def _history(text: str) -> list[tuple[float, str, str]]:
    return [(t, s, n) for t, s, n in json.loads("[" + text[1:] + "]")]


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(blob: bytes | None, default: Any) -> Any:
    if blob is None:
        return default
    return msgpack.unpackb(blob, raw=False, strict_map_key=False)


def _record(row: tuple[Any, ...]) -> JobRecord:
    (
        seq,
        job_id,
        backend,
        priority,
        timeout,
        metadata,
        stream,
        submitted_wall,
        state,
        attempts,
        history,
        started_wall,
        finished_wall,
        status_code,
        error,
        headers,
        gpu,
        peak_mib,
        payload,
        data,
        chunks,
    ) = row
    return JobRecord(
        id=job_id,
        seq=seq,
        backend=backend,
        payload=payload or b"",
        priority=priority,
        timeout=timeout,
        metadata=_unpack(metadata, {}),
        stream=bool(stream),
        submitted_wall=submitted_wall,
        state=JobState(state),
        history=_history(history),
        attempts=attempts,
        started_wall=started_wall,
        finished_wall=finished_wall,
        data=data,
        headers=_unpack(headers, {}),
        status_code=status_code,
        error=error,
        chunks=_unpack(chunks, []),
        gpu=gpu,
        peak_mib=peak_mib,
    )


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


class _QuickCheckFailed(sqlite3.DatabaseError):
    pass


def _is_corruption(exc: sqlite3.Error) -> bool:
    if isinstance(exc, _QuickCheckFailed):
        return True
    return getattr(exc, "sqlite_errorname", "") in {"SQLITE_NOTADB", "SQLITE_CORRUPT"}


def _move_no_clobber(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst``; raise ``FileExistsError`` rather than replace ``dst``."""
    try:
        os.link(src, dst)  # fails if dst exists: never overwrites
    except FileExistsError:
        raise
    except OSError:
        if os.path.lexists(dst):
            raise FileExistsError(dst) from None
        os.rename(src, dst)
        return
    os.unlink(src)


def _move_aside(path: Path, *, main: bool = True) -> Path:
    """Rename ``path`` and its ``-wal``/``-shm`` to ``<path>.corrupt-<timestamp>[.N]``.

    Picks a name none of whose three files exists; nothing is ever overwritten.  With
    ``main=False`` only the ``-wal``/``-shm`` files are moved (the main file is absent).
    """
    base = f"{path}.corrupt-{_stamp()}"
    suffixes = ("", "-wal", "-shm") if main else ("-wal", "-shm")
    for n in range(1000):
        target = Path(base if n == 0 else f"{base}.{n}")
        if any(os.path.lexists(f"{target}{s}") for s in ("", "-wal", "-shm")):
            continue
        moved: list[str] = []
        for s in suffixes:
            src, dst = Path(f"{path}{s}"), Path(f"{target}{s}")
            if s and not os.path.lexists(src):
                continue
            try:
                _move_no_clobber(src, dst)
            except FileExistsError:
                if not moved:
                    break  # another file took the name first; try the next one
                raise JournalError(
                    f"moving the corrupt journal {path} aside: {dst} appeared meanwhile; "
                    f"{', '.join(moved)} moved, the rest left in place"
                ) from None
            moved.append(str(dst))
        else:
            return target
    raise JournalError(f"cannot find a free name to move the corrupt journal {path} aside")


def _refuse_links(path: Path) -> None:
    """The journal, its WAL and its reserve are ours: never reached through a link."""
    for suffix in ("", "-wal", "-shm", ".reserve"):
        name = f"{path}{suffix}"
        if os.path.islink(name):
            raise JournalError(f"{name} is a symbolic link (to {os.readlink(name)}); refusing "
                               "to open the journal through it: remove the link")


def _read_header(path: Path) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(100)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"cannot read journal {path}: {exc.strerror or exc}") from None


def _too_new(path: Path, version: int) -> JournalTooNew:
    return JournalTooNew(
        f"journal {path} was written by a newer vramtui (schema {version}, this one reads "
        f"{SCHEMA_VERSION}); upgrade vramtui or move the file away"
    )


def _not_ours(path: Path, why: str) -> JournalError:
    return JournalError(
        f"{path} is not a vramtui journal ({why}); it was left untouched: move it away or "
        f"point VRAMTUI_STATE_DIR elsewhere"
    )


# -- a damaged WAL ---------------------------------------------------------------------------
#
# SQLite replays the WAL frame by frame and stops, silently, at the first frame whose checksum
# or salt does not match: whatever was committed after it is dropped as if it never happened
# (that is how a torn write at the tail is meant to be handled).  A frame damaged in the middle
# therefore drops every later commit — acknowledged jobs among them — without a word.  So before
# SQLite opens the journal, we walk the WAL ourselves, with SQLite's own checksum (see "The WAL
# file format" in SQLite's documentation): frames of this WAL generation (same salts) found
# after the break are commits that will be lost, and the job ids in their pages say which jobs.

_WAL_MAGIC = 0x377F0682  # | 1: checksums in big-endian words
_WAL_HEADER = struct.Struct(">IIIIIIII")
_FRAME_HEADER = struct.Struct(">IIIIII")
_JOB_ID = re.compile(rb"j-[0-9a-f]{10}")


@dataclass(frozen=True, slots=True)
class WalScan:
    """What a walk of the WAL found (see :func:`scan_wal`)."""

    frames: int  # whole frames in the file
    replayed: int  # frames SQLite will replay (up to the last commit before any break)
    lost_frames: int  # frames of this WAL generation after the break
    lost_commits: int  # commits among them
    ids: frozenset[str]  # job ids seen in the lost frames' pages

    @property
    def damaged(self) -> bool:
        return self.lost_frames > 0


def _checksum(data: bytes, big_endian: bool, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    it = iter(words)
    for a, b in zip(it, it, strict=True):
        s0 = (s0 + a + s1) & 0xFFFFFFFF
        s1 = (s1 + b + s0) & 0xFFFFFFFF
    return s0, s1


def scan_wal(wal: Path) -> WalScan | None:
    """Walk ``wal`` as SQLite would; None when there is no WAL (or nothing in it)."""
    try:
        with open(wal, "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if len(raw) <= _WAL_HEADER.size:
        return None
    magic, _version, page_size, _ckpt, salt1, salt2, c1, c2 = _WAL_HEADER.unpack_from(raw)
    frame_size = _FRAME_HEADER.size + page_size
    valid_size = page_size >= 512 and page_size & (page_size - 1) == 0
    frames = (len(raw) - _WAL_HEADER.size) // frame_size if valid_size else 0
    big = bool(magic & 1)
    header_ok = (magic & ~1) == _WAL_MAGIC and valid_size and _checksum(
        raw[:24], big, 0, 0) == (c1, c2)
    if not header_ok:
        # SQLite ignores the whole file: every frame in it is lost.
        return WalScan(frames, 0, frames, frames, frozenset(
            m.decode() for m in _JOB_ID.findall(raw, _WAL_HEADER.size)))
    s0, s1 = c1, c2
    replayed = 0
    at = _WAL_HEADER.size
    index = 0
    while index < frames:
        pgno, commit, f1, f2, k1, k2 = _FRAME_HEADER.unpack_from(raw, at)
        if (f1, f2) != (salt1, salt2) or pgno == 0:
            break
        s0, s1 = _checksum(raw[at : at + 8], big, s0, s1)
        s0, s1 = _checksum(raw[at + 24 : at + frame_size], big, s0, s1)
        if (s0, s1) != (k1, k2):
            break
        index += 1
        at += frame_size
        if commit:
            replayed = index
    def salted(i: int) -> bool:
        return _FRAME_HEADER.unpack_from(raw, _WAL_HEADER.size + i * frame_size)[2:4] == (
            salt1, salt2)

    if not any(salted(i) for i in range(index, frames)):
        # No break, or only stale frames of an earlier generation after it; frames after the
        # last commit are a transaction the crash cut short, never acknowledged.
        return WalScan(frames, replayed, 0, 0, frozenset())
    lost_frames = lost_commits = 0
    ids: set[str] = set()
    for later in range(replayed, frames):  # the transaction the break cut in two is lost too
        if not salted(later):
            continue  # a frame of an earlier generation of the WAL: nothing lost there
        start = _WAL_HEADER.size + later * frame_size
        lost_frames += 1
        lost_commits += bool(_FRAME_HEADER.unpack_from(raw, start)[1])
        ids.update(m.decode() for m in _JOB_ID.findall(raw, start + 24, start + frame_size))
    return WalScan(frames, replayed, lost_frames, lost_commits, frozenset(ids))


@dataclass(frozen=True, slots=True)
class WalDamage:
    """Commits of the journal lost to a damaged WAL, and where the damaged files were kept."""

    scan: WalScan
    lost_jobs: tuple[str, ...]  # acknowledged jobs that are gone altogether
    changed_jobs: tuple[str, ...]  # unfinished jobs whose later changes (a finish) may be gone
    kept_at: Path | None
    report: Path | None

    def describe(self, show: int = 50) -> str:
        """One line for the log: what was lost, which jobs, where the evidence is."""
        scan = self.scan

        def ids(values: tuple[str, ...]) -> str:
            shown = ", ".join(values[:show])
            more = f" and {len(values) - show} more" if len(values) > show else ""
            return shown + more

        parts = [f"the journal's write-ahead log was damaged: {scan.lost_commits} committed "
                 f"transaction(s) after frame {scan.replayed} of {scan.frames} could not be "
                 "replayed"]
        if self.lost_jobs:
            parts.append(f"{len(self.lost_jobs)} accepted job(s) were lost: "
                         f"{ids(self.lost_jobs)}")
        if self.changed_jobs:
            parts.append(f"{len(self.changed_jobs)} job(s) still queued or running may have "
                         f"changed in the lost part (one that had finished runs again): "
                         f"{ids(self.changed_jobs)}")
        if self.kept_at is not None:
            parts.append(f"the damaged files were kept as {self.kept_at} (-wal)"
                         + (f", the full list in {self.report}" if self.report else ""))
        else:
            parts.append("the damaged files could not be kept aside")
        return "; ".join(parts)


def _copy_aside(path: Path) -> Path:
    """Copy ``path`` and its ``-wal`` to ``<path>.corrupt-<timestamp>[.N]`` (never overwriting)."""
    base = f"{path}.corrupt-{_stamp()}"
    for n in range(1000):
        target = Path(base if n == 0 else f"{base}.{n}")
        if any(os.path.lexists(f"{target}{s}") for s in ("", "-wal", "-shm")):
            continue
        for suffix in ("", "-wal"):
            src = Path(f"{path}{suffix}")
            if os.path.lexists(src):
                fd = open_private(Path(f"{target}{suffix}"),
                                  os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
                    shutil.copyfileobj(inp, out, 1 << 20)
        return target
    raise OSError(errno.EEXIST, f"no free name to keep the damaged journal {path}")


class Journal:
    """The job journal.  Open with :meth:`open`; one per engine; not thread-safe.

    ``moved_aside`` is the path a corrupt journal was moved to when it was opened with
    ``on_corrupt="move_aside_and_start_fresh"`` (``notice`` says so in words), else ``None``.
    """

    def __init__(
        self,
        path: Path,
        db: sqlite3.Connection,
        keep_finished: int,
        keep_age_s: float,
        moved_aside: Path | None,
        notice: str | None,
        reserve_bytes: int = 0,
    ) -> None:
        self.path = path
        self.keep_finished = keep_finished
        self.keep_age_s = keep_age_s
        self.moved_aside = moved_aside
        self.notice = notice
        self.reserve_bytes = reserve_bytes
        self.reserve_spent = False
        self.damage: WalDamage | None = None
        self._db: sqlite3.Connection | None = db
        self._cur = db.cursor()
        self._finishes = 0

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: Path,
        *,
        keep_finished: int = 1000,
        keep_age_s: float = 7 * 86400,
        on_corrupt: OnCorrupt = "refuse",
        synchronous: Synchronous = "NORMAL",
        now_wall: float | None = None,
        reserve_bytes: int = RESERVE_BYTES,
    ) -> Journal:
        """Open the journal at ``path``, creating it (mode 0600) if it does not exist.

        Raises :class:`JournalTooNew` (file untouched) for a journal of a newer schema,
        :class:`JournalError` for a file that is not a vramtui journal (untouched) or cannot be
        opened, and :class:`JournalCorrupt` for a damaged one, after moving it (and its
        ``-wal``/``-shm``) aside to ``<path>.corrupt-<timestamp>``.  With
        ``on_corrupt="move_aside_and_start_fresh"`` a damaged journal is moved aside the same
        way and a fresh one is started (see ``moved_aside`` and ``notice``).  Finished jobs
        beyond ``keep_finished`` or older than ``keep_age_s`` are pruned at open
        (``now_wall`` defaults to ``time.time()``).

        A write-ahead log damaged in its middle (commits SQLite would silently drop) is found
        before SQLite replays it: the journal and its WAL are copied aside for inspection,
        SQLite keeps what it can, and ``damage`` says what was lost (see :class:`WalDamage`).
        ``reserve_bytes`` of disk are set aside next to the journal (``<path>.reserve``) and
        given up when the disk is full, so that the finishes of accepted jobs can still be
        recorded; new submits are refused until the room is back.  The journal and its
        companions are never opened through a symbolic link.
        """
        if keep_finished < 0 or keep_age_s < 0:
            raise ValueError("keep_finished and keep_age_s must not be negative")
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        path = Path(path)
        _refuse_links(path)
        moved_aside: Path | None = None
        notice: str | None = None
        scan = scan_wal(Path(f"{path}-wal")) if os.path.lexists(path) else None
        kept: Path | None = None
        if scan is not None and scan.damaged:
            with contextlib.suppress(OSError):
                kept = _copy_aside(path)
        try:
            db = cls._connect(path, synchronous)
        except JournalCorrupt as exc:
            if on_corrupt != "move_aside_and_start_fresh":
                raise
            moved_aside, notice = exc.moved_to, str(exc)
            scan = None
            db = cls._connect(path, synchronous)
        journal = cls(path, db, keep_finished, keep_age_s, moved_aside, notice, reserve_bytes)
        try:
            if scan is not None and scan.damaged:
                journal.damage = journal._account(scan, kept)
            journal.prune(time.time() if now_wall is None else now_wall)
            if not journal._make_reserve():
                journal.reserve_spent = True  # no room for it now: submits will say so
        except BaseException:
            journal.close()
            raise
        return journal

    def _account(self, scan: WalScan, kept: Path | None) -> WalDamage:
        """Which of the ids seen in the lost frames the journal still knows."""
        ids = sorted(scan.ids)
        present: dict[str, bool] = {}  # id -> finished
        for at in range(0, len(ids), 500):
            batch = ids[at : at + 500]
            marks = ",".join("?" * len(batch))
            present.update((row[0], row[1] is not None) for row in self._c.execute(
                f"SELECT id, finished_wall FROM jobs WHERE id IN ({marks})", batch))
        lost = tuple(i for i in ids if i not in present)
        # A finished job cannot have lost a later change; an unfinished one may have finished.
        changed = tuple(i for i in ids if present.get(i) is False)
        report: Path | None = None
        if kept is not None:
            report = Path(f"{kept}.lost.txt")
            with contextlib.suppress(OSError):
                fd = open_private(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                with os.fdopen(fd, "w") as out:
                    out.write(f"# {scan.lost_commits} commit(s) in {scan.lost_frames} frame(s) "
                              f"after frame {scan.replayed} of {scan.frames} were lost\n")
                    out.writelines(f"lost {i}\n" for i in lost)
                    out.writelines(f"changed {i}\n" for i in changed)
        return WalDamage(scan, lost, changed, kept, report)

    @classmethod
    def _connect(cls, path: Path, synchronous: str) -> sqlite3.Connection:
        header = _read_header(path)
        if header is None:
            # No journal.  Stray -wal/-shm files would be replayed into the new file: set aside.
            if any(os.path.lexists(f"{path}{s}") for s in ("-wal", "-shm")):
                _move_aside(path, main=False)
            cls._create_file(path)
        elif header:
            # Check the header before SQLite touches anything, so a newer or foreign file is
            # left byte-for-byte as it was (not even a -wal/-shm is created next to it).
            if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
                raise cls._corrupt(path, "not an SQLite database")
            version = int.from_bytes(header[60:64], "big")
            app_id = int.from_bytes(header[68:72], "big")
            if version > SCHEMA_VERSION:
                raise _too_new(path, version)
            if app_id not in (0, APPLICATION_ID):
                raise _not_ours(path, f"application id {app_id:#x}")
        try:
            db = sqlite3.connect(path, isolation_level=None, cached_statements=64)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open journal {path}: {exc}") from None
        try:
            cls._prepare(db, path, synchronous)
        except JournalError:
            db.close()
            raise
        except sqlite3.Error as exc:
            db.close()
            if _is_corruption(exc):
                raise cls._corrupt(path, str(exc)) from None
            if getattr(exc, "sqlite_errorname", "") in {"SQLITE_BUSY", "SQLITE_LOCKED"}:
                raise JournalInUse(
                    f"another vramtui engine already runs on the state directory {path.parent} "
                    f"(its journal {path} is in use); stop it first, or give this one another "
                    "state directory (VRAMTUI_STATE_DIR)"
                ) from None
            raise JournalError(f"cannot open journal {path}: {exc}") from None
        with contextlib.suppress(OSError):
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, FILE_MODE)
        return db

    @staticmethod
    def _create_file(path: Path) -> None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        except FileExistsError:
            return
        except OSError as exc:
            raise JournalError(f"cannot create journal {path}: {exc.strerror or exc}") from None
        try:
            os.fchmod(fd, FILE_MODE)  # the umask filtered os.open's mode
        finally:
            os.close(fd)

    @staticmethod
    def _prepare(db: sqlite3.Connection, path: Path, synchronous: str) -> None:
        # Exclusive locking: the first write below takes the file for as long as it is open, so
        # a second engine on the same journal is refused instead of interleaving its writes
        # (and the WAL index lives in memory: no -shm file).
        db.execute("PRAGMA locking_mode = EXCLUSIVE")
        db.execute("PRAGMA busy_timeout = 0")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:  # a newer schema committed only in the WAL
            raise _too_new(path, version)
        check = db.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            problems = "; ".join(str(r[0]) for r in check[:3])
            raise _QuickCheckFailed(f"quick_check failed: {problems}")
        if version == 0 and db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise _not_ours(path, "it holds other tables")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise JournalError(f"journal {path}: cannot switch to WAL mode (got {mode})")
        db.execute(f"PRAGMA synchronous = {synchronous}")
        db.execute("PRAGMA journal_size_limit = 16777216")
        if version == 0:
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        else:
            db.execute("BEGIN IMMEDIATE")  # take the write lock now (held until close)
            try:
                while version < SCHEMA_VERSION:  # an older journal: brought up to date
                    for statement in _MIGRATIONS[version]:
                        db.execute(statement)
                    version += 1
                    db.execute(f"PRAGMA user_version = {version}")
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    @staticmethod
    def _corrupt(path: Path, why: str) -> JournalCorrupt:
        try:
            target = _move_aside(path)
        except OSError as exc:
            return JournalCorrupt(
                f"journal {path} is corrupt ({why}) and could not be moved aside "
                f"({exc.strerror or exc}); move it away by hand",
                None,
            )
        return JournalCorrupt(
            f"journal {path} is corrupt ({why}); it was moved aside to {target} (with its "
            f"-wal/-shm, if any) and kept for inspection; the next start begins a fresh journal",
            target,
        )

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the file (a checkpoint folds the WAL back in).  Idempotent."""
        if self._db is not None:
            self._cur.close()
            self._db.close()
            self._db = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _c(self) -> sqlite3.Cursor:
        if self._db is None:
            raise JournalError(f"journal {self.path} is closed")
        return self._cur

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Cursor]:
        cur = self._c
        try:
            cur.execute("BEGIN")
            yield cur
            cur.execute("COMMIT")
        except BaseException as exc:
            raise self._abort(exc, what) from None

    def _write(self, what: str, body: Callable[[sqlite3.Cursor], None]) -> None:
        """Run ``body`` in one transaction, committed when this returns.  When the disk is
        full, the reserve is given up and the transaction tried once more."""
        for attempt in (1, 2):
            cur = self._c
            try:
                cur.execute("BEGIN")
                body(cur)
                cur.execute("COMMIT")
                return
            except BaseException as exc:
                err = self._abort(exc, what)
                if attempt == 1 and isinstance(err, JournalFull) and self._spend_reserve():
                    continue
                raise err from None

    def _abort(self, exc: BaseException, what: str) -> BaseException:
        """Roll back the open transaction; return the exception to raise for ``exc``."""
        if self._db is not None and self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            return self._error(what, exc)
        if isinstance(exc, OverflowError | TypeError | ValueError | msgpack.PackException):
            # A value SQLite or msgpack cannot hold (an integer over 64 bits, an odd type).
            return JournalUnstorable(f"journal {self.path}: cannot {what}: a value cannot be "
                                     f"stored ({type(exc).__name__}: {exc})")
        return exc

    def _error(self, what: str, exc: sqlite3.Error) -> JournalError:
        name = getattr(exc, "sqlite_errorname", "")
        if isinstance(exc, sqlite3.IntegrityError):
            return JournalError(f"journal {self.path}: cannot {what}: already journaled ({exc})")
        if name == "SQLITE_TOOBIG" or isinstance(exc, sqlite3.DataError):
            return JournalUnstorable(f"journal {self.path}: cannot {what}: a value is too large "
                                     f"for SQLite ({exc})")
        if name.startswith(("SQLITE_FULL", "SQLITE_IOERR")):
            return JournalFull(f"journal {self.path}: cannot {what}: {exc} (is the disk under "
                               f"{self.path.parent} full?)")
        return JournalError(f"journal {self.path}: cannot {what}: {exc}")

    def _update(self, sql: str, params: tuple[Any, ...], what: str, job_id: str) -> None:
        def body(cur: sqlite3.Cursor) -> None:
            cur.execute(sql, params)
            if cur.rowcount != 1:
                raise JournalError(f"journal {self.path}: cannot {what}: job {job_id!r} is "
                                   "unknown or already finished")

        self._write(what, body)

    # -- room on the disk ---------------------------------------------------------------------
    @property
    def reserve_path(self) -> Path:
        return Path(f"{self.path}.reserve")

    def _make_reserve(self) -> bool:
        """Set ``reserve_bytes`` of disk aside (a file next to the journal); True when done."""
        if not self.reserve_bytes:
            return True
        path = self.reserve_path
        try:
            fd = open_private(path, os.O_WRONLY | os.O_CREAT)
        except OSError:
            return False
        try:
            if os.fstat(fd).st_size >= self.reserve_bytes:
                return True
            try:
                os.posix_fallocate(fd, 0, self.reserve_bytes)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.lseek(fd, 0, os.SEEK_SET)
                block = bytes(1 << 20)
                for at in range(0, self.reserve_bytes, len(block)):
                    os.write(fd, block[: self.reserve_bytes - at])
            return True
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            return False
        finally:
            os.close(fd)

    def _spend_reserve(self) -> bool:
        """The disk is full: free the reserve so that accepted jobs can still be recorded."""
        if self.reserve_spent or not self.reserve_bytes:
            return False
        try:
            os.unlink(self.reserve_path)
        except OSError:
            return False
        self.reserve_spent = True
        return True

    def _check_room(self, what: str) -> None:
        """Refuse new work while the reserve is spent and cannot be set aside again."""
        if self.reserve_spent:
            if not self._make_reserve():
                raise JournalFull(
                    f"journal {self.path}: cannot {what}: the disk under {self.path.parent} is "
                    "full; new jobs are refused so that the jobs already accepted can still be "
                    "recorded; free some space")
            self.reserve_spent = False

    # -- recording ----------------------------------------------------------------------------
    def record_submit(self, rec: JobRecord) -> None:
        """Record a new job; it is committed (durable) when this returns.  Raises
        :class:`JournalFull` while the disk is too full to keep room for finishes."""
        state = JobState(rec.state)
        if state.finished:
            raise ValueError(f"record_submit takes an unfinished job, not one {state.value}")
        what = f"record job {rec.id}"
        self._check_room(what)
        history = "".join(_entry(t, s, n) for t, s, n in rec.history)

        def body(cur: sqlite3.Cursor) -> None:
            cur.execute(
                _INSERT_JOB,
                (
                    rec.seq,
                    rec.id,
                    rec.backend,
                    rec.priority,
                    rec.timeout,
                    _pack(rec.metadata),
                    int(rec.stream),
                    rec.submitted_wall,
                    state.value,
                    rec.attempts,
                    history,
                    rec.started_wall,
                ),
            )
            cur.execute(_INSERT_BLOB, (rec.seq, rec.payload))

        self._write(what, body)

    def record_start(self, job_id: str, t: float, note: str = "") -> None:
        """The job was dispatched to its worker: state running, one more attempt."""
        self._update(_START, (_entry(t, "running", note), t, job_id), "record start", job_id)

    def record_state(self, job_id: str, state: JobState, t: float, note: str = "") -> None:
        """A change between unfinished states (queued ↔ starting, running → queued)."""
        state = JobState(state)
        if state.finished or state is JobState.RUNNING:
            raise ValueError(f"use record_finish/record_start for state {state.value}")
        self._update(
            _STATE,
            (state.value, _entry(t, state.value, note), job_id),
            f"record state {state.value}",
            job_id,
        )

    def record_priority(self, job_id: str, priority: int, t: float, note: str = "") -> None:
        """A waiting job's new priority (it keeps its place among equals: its seq)."""
        self._update(_PRIORITY, (priority, _entry(t, "queued", note), job_id),
                     "record priority", job_id)

    def record_finish(
        self,
        job_id: str,
        state: JobState,
        t: float,
        *,
        note: str = "",
        data: bytes | None = None,
        headers: dict[str, Any] | None = None,
        status_code: int | None = None,
        error: str | None = None,
        chunks: Sequence[bytes] = (),
        gpu: int | None = None,
        peak_mib: int | None = None,
    ) -> None:
        """The job ended: keep its result (data, headers, status, error, stream chunks, with
        their boundaries) and drop its request payload.  Raises :class:`JournalUnstorable`
        for a value the journal cannot hold, :class:`JournalFull` for a full disk (after the
        reserve was spent), :class:`JournalError` otherwise; the journal is then unchanged."""
        state = JobState(state)
        if not state.finished:
            raise ValueError(f"record_finish takes a finished state, not {state.value}")

        def body(cur: sqlite3.Cursor) -> None:
            cur.execute(
                _FINISH_JOB,
                (
                    state.value,
                    _entry(t, state.value, note or (error or "")),
                    t,
                    status_code,
                    error,
                    _pack(headers) if headers else None,
                    gpu,
                    peak_mib,
                    job_id,
                ),
            )
            if cur.rowcount != 1:
                raise JournalError(
                    f"journal {self.path}: cannot record finish of {job_id}: job {job_id!r} "
                    f"is unknown or already finished"
                )
            if data is None and not chunks:
                cur.execute(_FINISH_BLOB_EMPTY, (job_id,))
            else:
                cur.execute(_FINISH_BLOB, (data, _pack(list(chunks)) if chunks else None, job_id))

        self._write(f"record finish of {job_id}", body)
        self._finishes += 1
        if self._finishes >= PRUNE_EVERY:
            with contextlib.suppress(JournalError):  # pruning can wait for the next finish
                self.prune(t)

    def finish_durably(
        self,
        job_id: str,
        state: JobState,
        t: float,
        *,
        note: str = "",
        data: bytes | None = None,
        headers: dict[str, Any] | None = None,
        status_code: int | None = None,
        error: str | None = None,
        chunks: Sequence[bytes] = (),
        gpu: int | None = None,
        peak_mib: int | None = None,
    ) -> tuple[JobState, str | None]:
        """Record a finish so that it is durable before anyone hears of it.

        The finish as given when it can be stored; else (a value the journal cannot hold, a
        disk full even after the reserve was spent) the job as *failed*, with the reason —
        stored too, so that it is never reported as succeeded nor run again after a restart.
        Returns the ``(state, error)`` stored.  Raises :class:`JournalError` only when not
        even the failure could be stored (the journal then still holds the job unfinished).
        """
        try:
            self.record_finish(job_id, state, t, note=note, data=data, headers=headers,
                               status_code=status_code, error=error, chunks=chunks, gpu=gpu,
                               peak_mib=peak_mib)
            return state, error
        except (JournalUnstorable, JournalFull) as exc:
            reason = str(exc).split(": ", 2)[-1]
        failure = f"its result could not be recorded in the journal: {reason}"
        self.record_finish(job_id, JobState.FAILED, t, note=failure, error=failure, gpu=gpu,
                           peak_mib=peak_mib)
        return JobState.FAILED, failure

    # -- reading ------------------------------------------------------------------------------
    def recover(self, now_wall: float) -> Recovery:
        """Replay the journal once at engine start; see the module docstring for the rules.

        The changes it makes (interrupted marks, requeues, failures) are committed before it
        returns, so a crash right after does not mark a job interrupted twice.
        """
        requeue: list[JobRecord] = []
        interrupted: list[str] = []
        failed: list[JobRecord] = []
        with self._transaction("recover") as cur:
            records = [_record(row) for row in cur.execute(_PENDING).fetchall()]
            for rec in records:
                if rec.state is JobState.STARTING:
                    self._requeue(cur, rec, now_wall, "queued", STARTING_NOTE)
                elif rec.state is JobState.RUNNING and rec.attempts >= 2:
                    error = INTERRUPTED_TWICE.format(attempt=rec.attempts)
                    rec.state, rec.error, rec.finished_wall, rec.payload = (
                        JobState.FAILED,
                        error,
                        now_wall,
                        b"",
                    )
                    rec.history.append((now_wall, "failed", error))
                    cur.execute(
                        _FINISH_JOB,
                        (
                            "failed",
                            _entry(now_wall, "failed", error),
                            now_wall,
                            None,
                            error,
                            None,
                            rec.gpu,
                            rec.peak_mib,
                            rec.id,
                        ),
                    )
                    cur.execute(_FINISH_BLOB_EMPTY, (rec.id,))
                    failed.append(rec)
                    continue
                elif rec.state is JobState.RUNNING:
                    note = INTERRUPTED_NOTE.format(attempt=rec.attempts + 1)
                    self._requeue(cur, rec, now_wall, "interrupted", note)
                    interrupted.append(rec.id)
                requeue.append(rec)
            max_seq = cur.execute("SELECT coalesce(max(seq), 0) FROM jobs").fetchone()[0]
        return Recovery(jobs=requeue, interrupted=interrupted, failed=failed, max_seq=max_seq)

    @staticmethod
    def _requeue(cur: sqlite3.Cursor, rec: JobRecord, t: float, mark: str, note: str) -> None:
        rec.state = JobState.QUEUED
        rec.history.append((t, mark, note))
        cur.execute(
            "UPDATE jobs SET state = 'queued', history = history || ? WHERE seq = ?",
            (_entry(t, mark, note), rec.seq),
        )

    def finished(self, job_id: str) -> JobRecord | None:
        """The finished job ``job_id`` with its result, or ``None`` (unknown, pruned, or not
        finished yet)."""
        try:
            row = self._c.execute(_FINISHED_ONE, (job_id,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error(f"read job {job_id}", exc) from None
        return None if row is None else _record(row)

    def holds_backend(self, backend: str) -> bool:
        """Whether any job of ``backend`` is kept (finished or not)."""
        try:
            row = self._c.execute("SELECT 1 FROM jobs WHERE backend = ? LIMIT 1",
                                  (backend,)).fetchone()
        except sqlite3.Error as exc:
            raise self._error(f"look for jobs of {backend}", exc) from None
        return row is not None

    def recent(self, limit: int, max_bytes: int | None = None) -> list[JobRecord]:
        """The ``limit`` most recently finished jobs, newest first, with their results; with
        ``max_bytes``, only the newest whose results hold at most that many bytes together
        (one at least), read one at a time (never all of them in memory first)."""
        out: list[JobRecord] = []
        held = 0
        try:
            for row in self._c.execute(_RECENT, (limit,)):
                rec = _record(row)
                held += len(rec.data or b"") + sum(map(len, rec.chunks))
                if max_bytes is not None and out and held > max_bytes:
                    break
                out.append(rec)
        except sqlite3.Error as exc:
            raise self._error("read recent jobs", exc) from None
        return out

    def prune(self, now_wall: float) -> int:
        """Forget finished jobs beyond ``keep_finished`` (oldest first) or finished more than
        ``keep_age_s`` ago.  Returns how many were removed.  ``record_finish`` calls it every
        few hundred finishes and ``open`` once; unfinished jobs are never pruned."""
        self._finishes = 0
        with self._transaction("prune") as cur:
            seqs = cur.execute(
                _PRUNE_SELECT, (now_wall - self.keep_age_s, self.keep_finished)
            ).fetchall()
            if seqs:
                cur.executemany("DELETE FROM jobs WHERE seq = ?", seqs)
                cur.executemany("DELETE FROM blobs WHERE seq = ?", seqs)
        return len(seqs)
