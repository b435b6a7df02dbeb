"""A small HTTP model server that behaves like llama.cpp's ``llama-server``, for the tests.

``python tests/model_server.py --port N [--mib M] [--load-s S] [--token-s S] [--tokens N]
[--slots N] [--wake-s S] [--mode MODE] [--once-file PATH]``

- ``GET /health``: 503 ``{"error": …loading…}`` for ``--load-s`` seconds, then 200
  ``{"status": "ok"}``; while loading it declares ``--mib`` MiB on the simulated GPU through
  ``worker_sdk.sim`` (when the engine runs it on one), as llama-server allocates its weights
  and KV cache at start.
- ``POST /v1/chat/completions`` and ``/v1/completions``: OpenAI's JSON, or with
  ``"stream": true`` its SSE chunks (``--tokens`` of them, ``--token-s`` apart) then
  ``data: [DONE]``; the next request on that connection finds it closed (llama-server
  closes it after a stream without saying so); an answer's ``system_fingerprint`` is
  ``pid-`` and its pid; ``/v1/embeddings``; ``GET /v1/models``; ``GET /slots`` (each slot's
  ``is_processing``; a client that goes away frees its slot, as llama-server's does);
  a ``max_tokens`` that is not a number is refused with a 400, in OpenAI's error shape;
  ``POST /echo`` answers the body it got, byte for byte, with the headers it got as
  ``X-Seen-*`` (``/v1/audio/transcriptions`` too); ``GET /ws``: a websocket that echoes;
  ``POST /quit``: exits (what a descriptor's ``http.stop`` may call); ``GET /files/cut``:
  a file of 4096 bytes declared whose connection closes after its first 100 (a download
  that broke off); ``GET /twice``: an answer with ``Cache-Control`` and ``X-Tag`` twice
  each.
- ``POST /sleep?level=1`` and ``POST /wake_up`` (vLLM's routes; SGLang's
  ``/release_memory_occupation`` and ``/resume_memory_occupation`` too): sleep really gives
  its ``--mib`` back on the simulated GPU (its context stays), wake takes it again after
  ``--wake-s``; ``GET /is_sleeping``. A completion asked of it asleep answers 500.
- ``--mode``: ``ok``; ``never-healthy`` (503 forever); ``health-hangs`` (takes connections,
  its health never answers); ``exit`` (exits at once, a line on
  stderr); ``crash`` (exits 3 on its first completion); ``hang`` (its first completion stops
  the whole server answering); ``error500`` (completions answer 500); ``endless`` (a stream
  that never ends); ``broken`` (a stream cut in the middle of its body); ``stall`` (a
  completion that stops after its first chunk, never ending, while health answers: a server
  hung mid-answer); ``stuck`` (every completion's answer never comes, a stream's head alone
  does, while health answers: its generation loop stuck, as llama-server's HTTP thread
  answers health and writes a stream's head on its own; with ``--once-file PATH``, only a
  server that finds no PATH at its start, and creates it: the next one started is ``ok``);
  ``deaf`` (ignores SIGTERM: only
  SIGKILL stops it); ``sleep-keeps``
  (its sleep answers 200 and gives nothing back); ``wake-hangs`` (its wake never answers);
  ``asleep-hangs`` (once asleep, the whole server stops answering); ``odd``: each answer is
  the one the request's text names (its last message, its prompt or its input): an error
  (``vllm400``, ``text400``, ``detail422``, ``long400``, ``split400``: written in two
  pieces), an answer of the wrong shape (``choices5``, ``fnnull``, ``toolcalls5``,
  ``data5``), no answer at all until its client goes (``silent``), or a stream that goes
  wrong after a good chunk and then goes on, a chunk every 50 ms until its client goes
  (``bad-then-more``: ``{"choices": 5}``, ``error-then-more``: an error event);
  ``split200``: a 200 whose JSON error comes in two pieces; ``separators``: a stream of
  tokens with U+2028, U+2029 and U+0085 in them; ``whole``: a stream asked for, answered
  with one whole JSON answer (as some servers do); anything else as in ``ok``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web
from multidict import CIMultiDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from worker_sdk import sim  # noqa: E402


class Server:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.slots = [False] * args.slots
        self.loaded = False
        self.asleep = False
        self.frozen = asyncio.Event()
        self.streamed: set[object] = set()  # connections that carried a stream

    # -- loading ----------------------------------------------------------------------------
    async def load(self) -> None:
        sim.attach()
        await asyncio.sleep(self.args.load_s)
        if self.args.mib:
            sim.allocate(self.args.mib)
        self.loaded = self.args.mode != "never-healthy"

    async def health(self, request: web.Request) -> web.Response:
        if self.args.mode == "health-hangs":
            self.frozen.set()
        await self._maybe_frozen()
        if not self.loaded:
            return web.json_response({"error": {"code": 503, "message": "Loading model",
                                                "type": "unavailable_error"}}, status=503)
        return web.json_response({"status": "ok"})

    async def _maybe_frozen(self) -> None:
        if self.frozen.is_set():
            await asyncio.Event().wait()  # never answers again

    # -- the OpenAI routes --------------------------------------------------------------------
    async def completion(self, request: web.Request) -> web.StreamResponse:
        await self._maybe_frozen()
        if request.transport in self.streamed:
            request.transport.close()  # type: ignore[union-attr]
            return web.Response()  # never sent
        body = await request.json()
        if not isinstance(body.get("max_tokens", 0), int):  # as llama-server refuses it
            return web.json_response({"error": {"code": 400, "message": "Field 'max_tokens':"
                                                " type must be number",
                                                "type": "invalid_request_error"}}, status=400)
        mode = self.args.mode
        if mode == "odd" and (odd := await self._odd(request, body)) is not None:
            return odd
        if mode == "stuck":
            return await self._stuck(request, bool(body.get("stream")))
        if mode == "crash":
            sys.stderr.write("model_server: GGML_ASSERT failed, crashing\n")
            sys.stderr.flush()
            os._exit(3)
        if mode == "hang":
            self.frozen.set()
            await self._maybe_frozen()
        if mode == "error500" or self.asleep:
            return web.json_response({"error": {"code": 500, "message": "KV cache is full",
                                                "type": "server_error"}}, status=500)
        chat = request.path.endswith("/chat/completions")
        slot = self._take_slot()
        try:
            if body.get("stream"):
                return await self._stream(request, body, chat)
            await asyncio.sleep(self.args.token_s * self.args.tokens)
            if mode == "stall":
                await self._hang(request)  # its answer never comes
            text = " ".join(["tok"] * self.args.tokens)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "stop"} if chat else
                      {"index": 0, "text": text, "finish_reason": "stop"})
            return web.json_response({
                "id": "cmpl-1", "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": body.get("model", "?"),
                "system_fingerprint": f"pid-{os.getpid()}",  # which process answered
                "choices": [choice],
                "usage": {"prompt_tokens": 3, "completion_tokens": self.args.tokens,
                          "total_tokens": 3 + self.args.tokens}})
        finally:
            self.slots[slot] = False

    async def _odd(self, request: web.Request, body: Any) -> web.StreamResponse | None:
        """The answer the request's text names (``--mode odd``), or None for an ordinary one."""
        said = _text_of(body)
        if said == "vllm400":
            return web.json_response({"object": "error", "message": "This model's maximum "
                                      "context length is 4096 tokens", "type":
                                      "BadRequestError", "param": None, "code": 400},
                                     status=400)
        if said == "text400":
            return web.Response(status=400, text="Bad Request: context too long")
        if said == "long400":
            return web.Response(status=400, text="too long " * 20_000)
        if said == "detail422":
            return web.json_response({"detail": [{"loc": ["body", "messages"],
                                                  "msg": "field required"}]}, status=422)
        if said in ("split400", "split200"):
            resp = web.StreamResponse(status=int(said[-3:]),
                                      headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"error": {"code": 400, "message": "the request exceeds the ')
            await asyncio.sleep(0.05)
            await resp.write(b'available context size", "type": "exceed_context_size_error"}}')
            await resp.write_eof()
            return resp
        if said == "whole" and body.get("stream"):  # a stream asked, a whole answer given
            return web.json_response({"id": "c", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "all at once"},
                 "finish_reason": "stop"}]})
        if said == "silent":
            return await self._stuck(request, False)
        shapes = {"choices5": {"choices": 5},
                  "fnnull": {"choices": [{"message": {"content": "x",
                                                      "tool_calls": [{"function": None}]}}]},
                  "toolcalls5": {"choices": [{"message": {"content": "x", "tool_calls": 5}}]}}
        if said in shapes and not body.get("stream"):
            return web.json_response(shapes[said])
        if said == "choices5":
            return await self._events(request, [b'{"choices": 5}'], more=False)
        if said == "separators":  # tokens that Unicode counts as line breaks
            return await self._events(request, [_delta(t) for t in SEPARATORS], more=False)
        if said in ("bad-then-more", "error-then-more"):
            bad = b'{"choices": 5}' if said == "bad-then-more" else \
                b'{"error": {"code": 500, "message": "out of memory"}}'
            return await self._events(request, [_delta("a"), bad], more=True)
        return None

    async def _events(self, request: web.Request, events: list[bytes],
                      more: bool) -> web.StreamResponse:
        """An SSE answer of ``events``; ``more``: then a chunk every 50 ms, until its client
        goes (its slot is held till then, as a generating server's is)."""
        slot = self._take_slot()
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for event in events:
                await resp.write(b"data: " + event + b"\n\n")
            while more:
                await asyncio.sleep(0.05)
                await resp.write(b"data: " + _delta("x") + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.slots[slot] = False

    async def _stuck(self, request: web.Request, stream: bool) -> web.StreamResponse:
        """No answer (a stream: its head alone) until its client goes, a slot held."""
        slot = self._take_slot()
        try:
            if stream:
                await web.StreamResponse(headers={"Content-Type": "text/event-stream"}
                                         ).prepare(request)
            await self._hang(request)
            raise AssertionError("unreachable")
        finally:
            self.slots[slot] = False

    @staticmethod
    async def _hang(request: web.Request) -> None:
        """Never answer more; return once the client went (its slot is freed then, as
        llama-server frees a slot whose client closed)."""
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.02)
        raise ConnectionResetError("the client went")

    def _take_slot(self) -> int:
        for i, busy in enumerate(self.slots):
            if not busy:
                self.slots[i] = True
                return i
        raise web.HTTPServiceUnavailable(text="no slot available")

    async def _stream(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Server": "model_server"})
        await resp.prepare(request)
        n = 0
        while self.args.mode == "endless" or n < self.args.tokens:
            if self.args.mode == "stall" and n == 1:
                await self._hang(request)  # hung mid-answer
            if self.args.mode == "broken" and n == 1:
                assert request.transport is not None
                await resp.write(b'data: {"choices": [{"ind')  # an event cut short …
                request.transport.close()  # … and the chunked body with it
                return resp
            delta = {"choices": [{"index": 0, "delta": {"content": f"t{n} "}}]} if chat \
                else {"choices": [{"index": 0, "text": f"t{n} "}]}
            await resp.write(b"data: " + json.dumps({"id": "c", "model": body.get("model"),
                                                     **delta}).encode() + b"\n\n")
            n += 1
            if self.args.token_s:
                await asyncio.sleep(self.args.token_s)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        # llama-server closes a connection after a stream, saying nothing; a client that
        # reuses it at once loses the race with the close: this server closes it when the
        # next request comes on it, which is the same, every time.
        self.streamed.add(request.transport)
        return resp

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.args.mode == "odd" and _text_of(body) == "data5":
            return web.json_response({"data": 5})
        return web.json_response({"object": "list", "model": body.get("model"),
                                  "data": [{"object": "embedding", "index": 0,
                                            "embedding": [0.1, 0.2, 0.3]}]})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def slots_view(self, request: web.Request) -> web.Response:
        return web.json_response([{"id": i, "is_processing": busy}
                                  for i, busy in enumerate(self.slots)])

    async def echo(self, request: web.Request) -> web.Response:
        data = await request.read()
        seen = {f"X-Seen-{k}": v for k, v in request.headers.items()
                if k.lower() in ("content-type", "x-custom", "connection", "upgrade",
                                 "content-encoding")}
        return web.Response(body=data, status=201, headers={
            "Content-Type": request.headers.get("Content-Type", "application/octet-stream"),
            "X-Query": request.query_string, **seen})

    async def twice(self, request: web.Request) -> web.Response:
        headers = CIMultiDict([("Cache-Control", "no-cache"), ("X-Tag", "a"),
                               ("cache-control", "no-store"), ("X-Tag", "b")])
        return web.Response(text="twice", headers=headers)

    async def cut(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = 4096
        await resp.prepare(request)
        await resp.write(b"x" * 100)
        assert request.transport is not None
        request.transport.close()
        return resp

    async def sleep(self, request: web.Request) -> web.Response:
        if not self.asleep:
            self.asleep = True
            if self.args.mode != "sleep-keeps" and self.args.mib:
                sim.free(self.args.mib)
            if self.args.mode == "asleep-hangs":
                asyncio.get_running_loop().call_later(0.1, self.frozen.set)
        return web.json_response({"is_sleeping": True})

    async def wake_up(self, request: web.Request) -> web.Response:
        if self.args.mode == "wake-hangs":
            await asyncio.Event().wait()
        if self.asleep:
            await asyncio.sleep(self.args.wake_s)
            if self.args.mode != "sleep-keeps" and self.args.mib:
                sim.allocate(self.args.mib)
            self.asleep = False
        return web.json_response({"is_sleeping": False})

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": self.asleep})

    async def quit(self, request: web.Request) -> web.Response:
        sys.stderr.write("model_server: stopped by POST /quit\n")
        sys.stderr.flush()
        asyncio.get_running_loop().call_later(0.05, os._exit, 0)
        return web.Response(text="bye")

    async def ws(self, request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            if msg.type == WSMsgType.TEXT:
                await sock.send_str("echo:" + msg.data)
        return sock


def _text_of(body: Any) -> str:
    """A request's text: its last message's, its prompt, or its (first) input."""
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
        return str(messages[-1].get("content"))
    text = body.get("prompt", body.get("input", ""))
    return str(text[0] if isinstance(text, list) and text else text)


SEPARATORS = ("a\u2028", "b\u2029", "c\x85", "d")


def _delta(text: str) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": text}}]},
                      ensure_ascii=False).encode()  # (raw UTF-8, as llama-server writes it)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--mib", type=int, default=0)
    parser.add_argument("--load-s", type=float, default=0.05)
    parser.add_argument("--token-s", type=float, default=0.0)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--wake-s", type=float, default=0.05)
    parser.add_argument("--mode", default="ok", choices=(
        "ok", "never-healthy", "health-hangs", "exit", "crash", "hang", "error500", "endless",
        "broken", "stall", "stuck", "deaf", "sleep-keeps", "wake-hangs", "asleep-hangs",
        "odd"))
    parser.add_argument("--once-file")
    args = parser.parse_args()
    if args.once_file is not None:
        try:
            Path(args.once_file).touch(exist_ok=False)
        except FileExistsError:
            args.mode = "ok"
    if args.mode == "exit":
        sys.stderr.write("model_server: error: failed to load model 'x.gguf'\n")
        sys.exit(1)
    server = Server(args)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.add_routes([
        web.get("/health", server.health), web.get("/v1/models", server.models),
        web.post("/v1/chat/completions", server.completion),
        web.post("/v1/completions", server.completion),
        web.post("/v1/embeddings", server.embeddings), web.get("/slots", server.slots_view),
        web.post("/echo", server.echo), web.post("/v1/audio/transcriptions", server.echo),
        web.post("/quit", server.quit), web.get("/ws", server.ws),
        web.post("/sleep", server.sleep), web.post("/wake_up", server.wake_up),
        web.get("/is_sleeping", server.is_sleeping), web.get("/files/cut", server.cut),
        web.get("/twice", server.twice),
        web.post("/release_memory_occupation", server.sleep),
        web.post("/resume_memory_occupation", server.wake_up)])

    async def on_startup(app: web.Application) -> None:
        app["load"] = asyncio.get_running_loop().create_task(server.load())

    app.on_startup.append(on_startup)
    if args.mode == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    web.run_app(app, host=args.host, port=args.port, print=None,
                handle_signals=args.mode != "deaf", access_log=None)


if __name__ == "__main__":
    main()
