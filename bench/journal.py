"""Micro benchmark of the job journal: the cost of making jobs durable, and of recovering them.

Not a test.  Run: ``.venv/bin/python bench/journal.py [--jobs N] [--dir DIR]``.

For ``synchronous=NORMAL`` (the default: survives kill -9, not a power loss) and ``FULL``
(fsync per commit: survives a power loss too) it runs N jobs through submit, start and finish,
one after another as the engine would, timing each call with ``time.perf_counter``, and prints
the median and p99 in µs per call and the jobs/s of the whole triple (wall time over all jobs,
WAL checkpoints included).  Then it journals 10,000 pending jobs (1,000 of them running),
closes, and times ``Journal.open`` (which runs ``PRAGMA quick_check``) and ``recover``.

The bar: submit + start + finish ≤ ~0.3 ms, so the engine can take 1000+ jobs/s with the
journal on.  The files go to a fresh directory under ``--dir`` (default: the system temporary
directory); its file system is printed, since fsync costs depend on it entirely.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from supervisor.jobs import JobState
from supervisor.journal import JobRecord, Journal

T0 = 1_750_000_000.0
RECOVER_JOBS = 10_000


def _fs_type(directory: Path) -> str:
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                _dev, mount, fstype = line.split()[:3]
                if str(directory).startswith(mount) and len(mount) > len(best):
                    best, kind = mount, fstype
    except OSError:
        pass
    return kind


def _record(i: int, payload: bytes, state: JobState = JobState.QUEUED) -> JobRecord:
    return JobRecord(
        id=f"j-{i:08x}",
        seq=i,
        backend="sdxl",
        payload=payload,
        priority=0,
        metadata={"client": "bench", "tags": ["a", "b"]},
        submitted_wall=T0 + i,
        state=state,
        history=[(T0 + i, "queued", "")],
    )


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(len(xs) * q))]


def bench_triple(directory: Path, sync: str, jobs: int, payload: int, result: int) -> dict:
    path = directory / f"triple-{sync}.sqlite3"
    body, data = os.urandom(payload), os.urandom(result)
    sub: list[float] = []
    start: list[float] = []
    fin: list[float] = []
    clock = time.perf_counter
    with Journal.open(path, synchronous=sync) as j:  # type: ignore[arg-type]
        begin = clock()
        for i in range(1, jobs + 1):
            rec = _record(i, body)
            t = clock()
            j.record_submit(rec)
            t1 = clock()
            j.record_start(rec.id, T0 + i, "on sdxl (pid 4242)")
            t2 = clock()
            j.record_finish(
                rec.id,
                JobState.SUCCEEDED,
                T0 + i,
                data=data,
                headers={"content-type": "image/png"},
                status_code=200,
            )
            t3 = clock()
            sub.append(t1 - t)
            start.append(t2 - t1)
            fin.append(t3 - t2)
        total = clock() - begin
    return {
        "sync": sync,
        "submit": (statistics.median(sub), _pct(sub, 0.99)),
        "start": (statistics.median(start), _pct(start, 0.99)),
        "finish": (statistics.median(fin), _pct(fin, 0.99)),
        "triple_us": total / jobs * 1e6,
        "jobs_s": jobs / total,
    }


def bench_recovery(directory: Path, payload: int) -> tuple[float, float, int, int]:
    path = directory / "recover.sqlite3"
    body = os.urandom(payload)
    with Journal.open(path) as j:
        for i in range(1, RECOVER_JOBS + 1):
            j.record_submit(_record(i, body))
            if i % 10 == 0:
                j.record_start(f"j-{i:08x}", T0 + i)
    t = time.perf_counter()
    j = Journal.open(path, now_wall=T0)
    t_open = time.perf_counter() - t
    t = time.perf_counter()
    r = j.recover(T0 + RECOVER_JOBS)
    t_recover = time.perf_counter() - t
    j.close()
    return t_open, t_recover, len(r.jobs), len(r.interrupted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per synchronous mode")
    parser.add_argument("--payload", type=int, default=512, help="request payload bytes")
    parser.add_argument("--result", type=int, default=4096, help="result data bytes")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()

    directory = Path(tempfile.mkdtemp(prefix="vramtui-journal-bench-", dir=args.dir))
    try:
        print(
            f"journal bench: {args.jobs} jobs per mode, payload {args.payload} B, result "
            f"{args.result} B, in {directory} ({_fs_type(directory)})"
        )
        rows = [bench_triple(directory, s, args.jobs, args.payload, args.result)
                for s in ("NORMAL", "FULL")]  # fmt: skip
        print()
        print(
            f"{'synchronous':<12}{'submit µs':>16}{'start µs':>16}{'finish µs':>16}"
            f"{'triple µs':>12}{'jobs/s':>10}"
        )
        print(f"{'':<12}{'p50 / p99':>16}{'p50 / p99':>16}{'p50 / p99':>16}{'mean':>12}{'':>10}")
        for row in rows:
            cells = "".join(
                f"{row[k][0] * 1e6:>9.0f} /{row[k][1] * 1e6:>5.0f}"
                for k in ("submit", "start", "finish")
            )
            print(f"{row['sync']:<12}{cells}{row['triple_us']:>12.0f}{row['jobs_s']:>10.0f}")
        t_open, t_recover, n, interrupted = bench_recovery(directory, args.payload)
        print()
        print(
            f"recovery of {n} pending jobs ({interrupted} were running): open (with quick_check) "
            f"{t_open * 1e3:.1f} ms, recover {t_recover * 1e3:.1f} ms, "
            f"total {(t_open + t_recover) * 1e3:.1f} ms"
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
