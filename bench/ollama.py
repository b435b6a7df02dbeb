"""Benchmark of the Ollama routes beside the OpenAI ones they translate to, in one run.

One ``vramtui --serve --http`` (simulated 8 GiB GPU, fresh /tmp root) serves two backends: a
model server (``tests/model_server.py``, the llama-server look-alike, loaded from a
llama-swap ``config.yaml`` as it is) and a ``worker_sdk`` chat worker
(``examples/openai/chat.py``, no step delay).  For each, on kept-alive connections:

- the median (and p90) latency of a short non-streamed chat: ``POST /v1/chat/completions``
  vs ``POST /api/chat`` with ``"stream": false``;
- the median time to the first streamed line (SSE ``data:`` vs NDJSON) and to the end.

What the Ollama column adds over the OpenAI one is the translation both ways (and, for a
server, a parsed SSE stream instead of bytes passed on).  Run:
``.venv/bin/python bench/ollama.py [--n 60]``.  Prints a table; never run as a test.
"""

# ruff: noqa: E402  (the path is fixed before the imports: see below)
from __future__ import annotations

import os
import sys

# bench/http.py is beside this file: keep the folder off the path so `http` is the stdlib's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(
    os.path.abspath(__file__))]

import argparse
import http.client
import json
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "model_server.py"
CHAT = ROOT / "examples" / "openai" / "chat.py"


def config(root: Path) -> Path:
    """A llama-swap config.yaml for the server, and our descriptor for the worker."""
    (root / "ls").mkdir()
    (root / "ls" / "config.yaml").write_text(
        f"models:\n  server:\n    cmd: {sys.executable} {SERVER} --port ${{PORT}} "
        "--tokens 8 --token-s 0 --load-s 0\n    ttl: 0\n    concurrencyLimit: 4\n")
    (root / "worker.yaml").write_text(json.dumps({
        "name": "worker", "script": str(CHAT), "api": ["chat"], "simulated": True,
        "keep_alive": "never", "vram": {"weights": "256MiB", "activation": "64MiB",
                                        "context": "256MiB"},
        "env": {"SIM_WEIGHTS_MIB": "256", "SIM_ACTIVATION_MIB": "64", "SIM_LOAD_S": "0",
                "SIM_STEP_S": "0"}}))
    return root


def serve(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    out = root / "serve.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "vramtui", "--serve", "--gpus",
                                 "sim:8GiB", "--backends", str(root / "ls" / "config.yaml"),
                                 "--backends", str(root / "worker.yaml"),
                                 "--http", "127.0.0.1:0"], env=env, stdout=f,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while b"HTTP front door on" not in out.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("vramtui --serve --http did not start")
        time.sleep(0.05)
    line = next(x for x in out.read_text().splitlines() if "HTTP front door on" in x)
    return proc, line.split("HTTP front door on ", 1)[1].split()[0]


def request(conn: http.client.HTTPConnection, path: str, body: dict) -> tuple[float, float]:
    """(seconds to the first line of the answer, seconds to its end)."""
    t0 = time.perf_counter()
    conn.request("POST", path, body=json.dumps(body),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    while first is None:
        line = resp.readline()
        if not line:
            break
        if line.strip() and not line.startswith(b":"):
            first = time.perf_counter() - t0
    resp.read()
    if resp.status != 200:
        raise SystemExit(f"{path}: status {resp.status}")
    return first or 0.0, time.perf_counter() - t0


def measure(base: str, model: str, n: int) -> dict[str, list[float]]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    msgs = [{"role": "user", "content": "hi"}]
    shapes = {
        "openai": ("/v1/chat/completions", {"model": model, "messages": msgs,
                                            "max_tokens": 1}, False),
        "ollama": ("/api/chat", {"model": model, "messages": msgs, "stream": False,
                                 "options": {"num_predict": 1}}, False),
        "openai stream": ("/v1/chat/completions", {"model": model, "messages": msgs,
                                                   "stream": True}, True),
        "ollama stream": ("/api/chat", {"model": model, "messages": msgs}, True),
    }
    for path, body, _ in shapes.values():
        request(conn, path, body)  # loaded, warm
    out: dict[str, list[float]] = {k: [] for k in shapes}
    for _ in range(n):
        for key, (path, body, streamed) in shapes.items():
            first, end = request(conn, path, body)
            out[key].append(first if streamed else end)
            if streamed:
                out.setdefault(key + " end", []).append(end)
    return out


def ms(values: list[float], q: float = 0.5) -> str:
    ordered = sorted(values)
    if q == 0.5:
        return f"{statistics.median(ordered) * 1000:.2f}"
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=60, help="requests of each kind")
    args = parser.parse_args()
    root = config(Path(tempfile.mkdtemp(prefix="vt-bench-ollama-", dir="/tmp")))
    proc, base = serve(root)
    try:
        rows = [(model, measure(base, model, args.n)) for model in ("server", "worker")]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    print(f"Ollama routes vs the OpenAI routes they translate to ({args.n} requests each, "
          "kept-alive connection, simulated GPU; ms)")
    print(f"{'backend':8} {'what':28} {'OpenAI':>9} {'Ollama':>9} {'added':>8}")
    for model, got in rows:
        for label, a, b, q in (("short chat, median", "openai", "ollama", 0.5),
                               ("short chat, p90", "openai", "ollama", 0.9),
                               ("stream: first line, median", "openai stream",
                                "ollama stream", 0.5),
                               ("stream: whole, median", "openai stream end",
                                "ollama stream end", 0.5)):
            x, y = float(ms(got[a], q)), float(ms(got[b], q))
            print(f"{model:8} {label:28} {x:9.2f} {y:9.2f} {y - x:+8.2f}")


if __name__ == "__main__":
    main()
