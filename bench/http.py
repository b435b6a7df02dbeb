"""Benchmark of the HTTP front door: a small job's round trip, and SSE fan-out to 100 clients.

Starts ``vramtui --serve --http 127.0.0.1:0`` (simulated GPU, the echo example backend kept
hot) in a fresh /tmp root and measures, after a warm-up:

- submit-to-result of a hot echo job, sequentially: ``POST /v1/jobs`` (sync) on one kept-alive
  HTTP connection, against ``submit_wait`` over the control socket — the same engine, the
  same job, one round trip each;
- SSE fan-out: ``--subscribers`` clients on ``GET /v1/events?kinds=job`` while jobs run; for
  each job, the time from its submit until every subscriber has read its final event (beside
  the time until its submitter has the answer), and the events delivered per second in all.

Run: ``.venv/bin/python bench/http.py [--jobs 1000] [--subscribers 100] [--fanout-jobs 50]``.
Never run as a test.
"""

# ruff: noqa: E402  (the path is fixed before the imports: see below)
from __future__ import annotations

import os
import sys

# This file is named http.py: keep its folder off the path so that `http` is the stdlib's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse
import asyncio
import http.client
import json
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.timing import percentile, time_jobs  # noqa: E402
from supervisor.client import Client  # noqa: E402
from vramtui.http_serve import front_door_url  # noqa: E402

ECHO = {"name": "echo", "script": str(ROOT / "examples" / "echo" / "main.py"),
        "vram": {"weights": "0MiB", "activation": "16MiB"}, "keep_alive": "forever"}
PAYLOAD = {"prompt": "hello"}


def start(root: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    desc = root / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": [ECHO]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    out = root / "serve.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vramtui", "--serve", "--gpus",
                                 "sim:24GiB", "--backends", str(desc), "--http", "127.0.0.1:0"],
                                env=env, stdout=f, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while (url := front_door_url(out.read_text(errors="replace"))) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("vramtui --serve --http did not start")
        time.sleep(0.05)
    return proc, url, root / "run" / "control.sock"


def http_round_trips(url: str, n: int) -> tuple[list[float], float]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"backend": "echo", "input": PAYLOAD})

    def one() -> None:
        conn.request("POST", "/v1/jobs", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status

    try:
        return time_jobs(one, n)
    finally:
        conn.close()


async def fanout(url: str, subscribers: int,
                 jobs: int) -> tuple[list[float], list[float], float, int]:
    """Per job: seconds from its submit until all subscribers have its final event, and
    until its submitter has the answer."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    done_at: dict[str, list[float]] = {}
    events = 0

    async def subscriber(ready: asyncio.Event, count: list[int]) -> None:
        nonlocal events
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 22)
        writer.write(f"GET /v1/events?kinds=job HTTP/1.1\r\nHost: {host}\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        await writer.drain()
        count[0] += 1
        if count[0] == subscribers:
            ready.set()
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                if line.startswith(b"data: ") and b'"state":"succeeded"' in line:
                    events += 1
                    job_id = json.loads(line[6:])["job"]["id"]
                    done_at.setdefault(job_id, []).append(time.perf_counter())
                elif line.startswith(b"data: "):
                    events += 1
        finally:
            writer.close()

    ready = asyncio.Event()
    count = [0]
    tasks = [asyncio.create_task(subscriber(ready, count)) for _ in range(subscribers)]
    await ready.wait()
    await asyncio.sleep(0.5)  # every stream has its first snapshot
    loop = asyncio.get_running_loop()
    answered: dict[str, float] = {}

    sent: dict[str, float] = {}

    def submit() -> tuple[str, float]:
        t_sent = time.perf_counter()
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        conn.request("POST", "/v1/jobs", body=json.dumps({"backend": "echo", "input": 1}),
                      headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        sent[resp.headers["X-Vramtui-Job"]] = t_sent
        return resp.headers["X-Vramtui-Job"], time.perf_counter()

    start_events = events
    t0 = time.perf_counter()
    for _ in range(jobs):
        job_id, t = await loop.run_in_executor(None, submit)
        answered[job_id] = t
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and any(
            len(done_at.get(j, [])) < subscribers for j in answered):
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - t0
    delivered = events - start_events
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    lags = [max(done_at[j]) - sent[j] for j in answered
            if len(done_at.get(j, [])) >= subscribers]
    answers = [answered[j] - sent[j] for j in answered]
    missing = sum(1 for j in answered if len(done_at.get(j, [])) < subscribers)
    if missing:
        print(f"warning: {missing} job(s) did not reach every subscriber", file=sys.stderr)
    return lags, answers, delivered / elapsed, len(lags)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--fanout-jobs", type=int, default=50)
    opts = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
    proc, url, sock = start(root)
    try:
        client = Client(sock)
        client.submit_wait("echo", json.dumps(PAYLOAD).encode())  # the worker is hot
        sock_rt, sock_total = time_jobs(
            lambda: client.submit_wait("echo", json.dumps(PAYLOAD).encode()), opts.jobs)
        http_rt, http_total = http_round_trips(url, opts.jobs)
        client.close()
        lags, answers, rate, jobs_seen = asyncio.run(
            fanout(url, opts.subscribers, opts.fanout_jobs))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
    ms = 1000.0
    rows = [
        ("hot echo over the control socket (submit_wait), median",
         f"{statistics.median(sock_rt) * ms:.2f} ms", f"p90 {percentile(sock_rt, 0.9) * ms:.2f} ms",
         f"{opts.jobs / sock_total:.0f} jobs/s"),
        ("hot echo over HTTP (POST /v1/jobs, sync, keep-alive), median",
         f"{statistics.median(http_rt) * ms:.2f} ms", f"p90 {percentile(http_rt, 0.9) * ms:.2f} ms",
         f"{opts.jobs / http_total:.0f} jobs/s"),
        ("  HTTP / control socket (median)",
         f"{statistics.median(http_rt) / statistics.median(sock_rt):.2f}x", "", ""),
        ("SSE fan-out: submit -> the submitter has the answer, median",
         f"{statistics.median(answers) * ms:.1f} ms", f"p90 {percentile(answers, 0.9) * ms:.1f} ms",
         ""),
        (f"SSE fan-out: submit -> all {opts.subscribers} subscribers have its end, median",
         f"{statistics.median(lags) * ms:.1f} ms" if lags else "-",
         f"p90 {percentile(lags, 0.9) * ms:.1f} ms" if lags else "",
         f"{jobs_seen}/{opts.fanout_jobs} jobs"),
        ("  events delivered to all subscribers together", f"{rate:.0f} /s", "", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>10}  {'spread':>14}  rate")
    for name, value, spread, rate_ in rows:
        print(f"{name:<{width}}  {value:>10}  {spread:>14}  {rate_}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
