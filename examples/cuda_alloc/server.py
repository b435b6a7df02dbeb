"""The cuda_alloc model served as an HTTP model server, its memory held by a child process.

A model server as vLLM is one: an HTTP front process that holds no GPU memory, and a child
(its "engine core") that holds the CUDA context, the weights from start to exit and the
activation while a request runs. So the engine must find the memory in the server's process
*tree*, not in the process it started. The child is ``main.py``'s model (same knobs, read from
``CUDA_ALLOC_*``: ``WEIGHTS_MIB``, ``ACTIVATION_MIB``, ``LOAD_S``, ``STEPS``, ``STEP_S``...);
on vramtui's simulated GPU it only declares its memory, as the worker does.

    python server.py --port PORT [--host 127.0.0.1]

Routes: ``GET /health`` (503 while the child loads, 200 once the weights are held, 500 if it
failed or exited), ``POST /v1/chat/completions`` (runs one request on the child: the
activation held ``STEPS`` x ``STEP_S`` seconds; OpenAI's JSON answer says what was held; a
``stream`` request is answered whole, not as SSE). One request at a time (declare
``concurrency: 1``). SIGTERM stops the child and the server. Standard library only, besides
``main.py``'s model.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 1 << 20


def serve_child() -> int:
    """The child: load the model, say ``ready``, then run one request per line of stdin."""
    import main  # the worker's model: beside this file

    model = main.Model(main.Config.from_env(os.environ))
    try:
        model.open()
        time.sleep(model.config.load_s)
        model.load_weights()
    except Exception as exc:  # noqa: BLE001 - said to the parent in one line
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 3
    print(json.dumps({"ready": model.info()}), flush=True)
    for _request in sys.stdin:
        cfg = model.config
        try:
            held = model.hold(cfg.activation_mib)
        except Exception as exc:  # noqa: BLE001 - the request fails, the server goes on
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            continue
        try:
            time.sleep(cfg.steps * cfg.step_s)
            during = model.info()
        finally:
            held.free()
        print(json.dumps({"done": {**during, "activation_mib": cfg.activation_mib,
                                   "pid": os.getpid()}}), flush=True)
    model.release()
    return 0


class Core:
    """The parent's handle on the child: its state for /health, one request at a time."""

    def __init__(self) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=here, bufsize=1)
        self.state = "loading"
        self.error = ""
        self.lock = threading.Lock()
        threading.Thread(target=self._wait_ready, daemon=True).start()

    def _wait_ready(self) -> None:
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        try:
            said = json.loads(first)
        except ValueError:
            said = {"error": f"the model process exited (code {self.proc.wait()})"}
        if "ready" in said:
            self.state = "ready"
        else:
            self.state, self.error = "failed", str(said.get("error"))

    def status(self) -> str:
        """``loading``, ``ready`` or ``failed`` (the child gone counts as failed)."""
        if self.state != "failed" and self.proc.poll() is not None:
            self.state = "failed"
            self.error = f"the model process exited (code {self.proc.returncode})"
        return self.state

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self.lock:
            if self.status() == "failed":
                raise RuntimeError(self.error)
            try:
                self.proc.stdin.write("run\n")
                self.proc.stdin.flush()
                line = self.proc.stdout.readline()
            except OSError as exc:  # the child died under us (a broken pipe)
                line = json.dumps({"error": f"the model process: {exc}"})
            said = json.loads(line or '{"error": "the model process gave no answer"}')
        if "done" not in said:
            self.status()
            raise RuntimeError(str(said.get("error")))
        return dict(said["done"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


CORE: Core | None = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path != "/health":
            self._answer(404, {"error": {"message": f"no route {self.path}"}})
            return
        assert CORE is not None
        state = CORE.status()
        status = {"ready": 200, "loading": 503}.get(state, 500)
        self._answer(status, {"status": state, **({"error": CORE.error} if CORE.error
                                                  else {})})

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True  # its body is not read: the connection is spent
            self._answer(413 if length > MAX_BODY else 400,
                         {"error": {"message": f"a Content-Length of 0 to {MAX_BODY} bytes, "
                                               "please"}})
            return
        body = self.rfile.read(length)
        if self.path != "/v1/chat/completions":
            self._answer(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        if not isinstance(request, dict):
            self._answer(400, {"error": {"message": "the body must be a JSON object"}})
            return
        assert CORE is not None
        state = CORE.status()
        if state != "ready":
            self._answer(503, {"error": {"message": f"model {state}: {CORE.error}"}})
            return
        try:
            done = CORE.run()
        except (ValueError, RuntimeError) as exc:
            self._answer(500, {"error": {"message": str(exc)}})
            return
        text = json.dumps(done)
        self._answer(200, {
            "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion",
            "created": int(time.time()), "model": str(request.get("model", "cuda-alloc")),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return serve_child()
    if args.port is None:
        parser.error("--port is required")
    global CORE
    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    CORE = Core()

    def stop(*_: object) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        CORE.stop()
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
