"""HTTP model servers as backends (issue 24), end to end: a real engine on the simulated GPU,
real server processes (``tests/model_server.py``, which behaves like llama-server), real
clients (http.client, the official ``openai`` client).

What is checked: requests forwarded byte for byte and answered as the server answers (JSON,
SSE chunk by chunk, status and headers); each request an ordinary job; two servers that
cannot co-reside alternate and are never both on the simulated GPU (its own ledger says so);
a client that goes away frees the server's slot; bad servers (never healthy, exiting at once,
a port taken, 500s, endless and broken streams) and a too-large body each get one clear error,
leave no process behind and the queue goes on.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from escaping import Escaper
from http_support import Front, expecting, serve_http
from waiting import wait_until

from supervisor.backends.http import free_port
from supervisor.engine import EngineConfig
from vramtui.output import backend_table

pytestmark = pytest.mark.process

SERVER = Path(__file__).resolve().parent / "model_server.py"
CONTEXT_MIB = 256  # the simulated GPU's CUDA context per process


def server_backend(name: str, mib: int = 512, *, mode: str = "ok", api: Any = None,
                   args: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A descriptor for ``tests/model_server.py``: it holds ``mib`` (+ its context)."""
    spec: dict[str, Any] = {
        "name": name,
        "command": [sys.executable, str(SERVER), "--port", "${PORT}", "--mib", str(mib),
                    "--mode", mode, *args],
        "http": {"health": "/health"},
        "api": api or ["chat", "completions", "embeddings"],
        "vram": {"weights": f"{mib}MiB", "activation": "0MiB", "context": f"{CONTEXT_MIB}MiB"},
        "safety": "0MiB",
        "simulated": True,
        "concurrency": 4,
        "timeouts": {"start": "20s", "stop_grace": "3s"},
    }
    spec.update(extra)
    return spec


def _state(front: Front, name: str) -> str:
    return {b.name: b.state for b in front.sup.snapshot().backends}[name]


def chat(model: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}],
            "stream": stream, **extra}


def sim_holders(front: Front) -> dict[int, int]:
    """pid -> MiB, as the simulated GPU's own ledger has it (not the engine's view)."""
    out = {}
    for path in Path(front.sup.paths.sim_dir).glob("*.json"):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = int(entry["pid"])
        if os.path.exists(f"/proc/{pid}"):
            out[pid] = int(entry["mib"])
    return out


def server_pids(root: Path) -> set[int]:
    """Live processes running tests/model_server.py for the engine under ``root`` (an orphan
    shows here; servers of other test runs do not)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
                if str(SERVER).encode() not in cmd:
                    continue
                env = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if str(root).encode() in env:
                found.add(int(entry))
    return found


def test_requests_are_forwarded_byte_for_byte_as_jobs() -> None:
    api = ["chat", "completions", "embeddings", "transcriptions"]
    with serve_http([server_backend("llama", api=api, args=("--tokens", "3"))]) as front:
        reply = front.post("/v1/chat/completions", chat("llama"))
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["message"]["content"] == "tok tok tok"
        # The job is an ordinary job, seen by every face.
        jobs = front.get("/v1/jobs?backend=llama").json()
        assert any(j["state"] == "succeeded" for j in jobs["data"]), jobs
        # Streamed: the server's own bytes, chunk by chunk, under its headers.
        sse = front.sse("POST", "/v1/chat/completions", chat("llama", stream=True))
        assert sse.resp.status == 200
        assert sse.headers["x-server"] == "model_server"
        body = sse.resp.read()
        sse.close()
        assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n"), body
        # The server closed that connection without saying so: the next requests still go.
        for _ in range(3):
            assert front.post("/v1/chat/completions", chat("llama", stream=True)).status == 200
            assert front.post("/v1/chat/completions", chat("llama")).status == 200
        # Any request through /upstream: body, query and status as they were.
        raw = b'{"z": 1,  "a" : [1,2]}\n'
        reply = front.request("POST", "/upstream/llama/echo?x=1&y=2", raw=raw,
                              headers={"X-Custom": "yes"})
        assert (reply.status, reply.body) == (201, raw)
        assert reply.headers["x-query"] == "x=1&y=2" and reply.headers["x-seen-x-custom"] == "yes"
        assert "x-seen-connection" not in reply.headers  # hop-by-hop: never forwarded
        # A gzipped body: the door has decoded it, so it goes decoded, not labelled gzip
        # (the server would gunzip plain JSON), by either route.
        for path, sent in (("/upstream/llama/echo", raw),
                           ("/v1/chat/completions", json.dumps(chat("llama")).encode())):
            reply = front.request("POST", path, raw=gzip.compress(sent), headers={
                "Content-Encoding": "gzip"})
            assert "x-seen-content-encoding" not in reply.headers, (path, reply)
            assert reply.status in (200, 201), (path, reply)
        assert reply.json()["choices"]  # (the chat server read the body as JSON)
        # A multipart upload (audio to transcribe), as it came.
        form = (b'--XX\r\nContent-Disposition: form-data; name="model"\r\n\r\nllama\r\n'
                b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                b'Content-Type: audio/wav\r\n\r\nRIFF\x00\x01\r\n--XX--\r\n')
        reply = front.request("POST", "/v1/audio/transcriptions", raw=form, headers={
            "Content-Type": "multipart/form-data; boundary=XX"})
        assert (reply.status, reply.body) == (201, form)
        assert asyncio.run(_ws_echo(front.base + "/upstream/llama/ws")) == "echo:ping"
        server = front.get("/v1/backends/llama").json()["server"]
        assert server == {"url": front.engine.backends["llama"].worker.url, "health": "/health"}
        pid = front.engine.backends["llama"].worker.command_pid
        assert pid in server_pids(front.root)
    wait_until(lambda: not server_pids(front.root), 10, "the server to be gone")


def test_upstream_takes_the_longest_model_id_in_the_path_as_llama_swap_does() -> None:
    """With models ``org`` and ``org/model``, ``/upstream/org/model/echo`` is the second's
    ``/echo`` (llama-swap's ``FindModelInPath`` keeps the last match); it was the first's
    ``/model/echo``, a 404 from a server the client never meant."""
    with serve_http([server_backend("first", 256, aliases=["org", "a?q%41"]),
                     server_backend("second", 256, aliases=["org/model"])]) as front:
        reply = front.request("POST", "/upstream/org/model/echo", raw=b"{}")
        assert (reply.status, reply.body) == (201, b"{}"), reply
        states = {b.name: b.state for b in front.sup.snapshot().backends}
        assert (states["first"], states["second"]) == ("cold", "ready"), \
            states
        assert front.request("POST", "/upstream/org/echo", raw=b"[]").body == b"[]"
        # the model's root without its slash: redirected there, as llama-swap does, so the
        # relative links of a server's page (ComfyUI's) resolve under it
        for method, path, status, where in (
                ("GET", "/upstream/org/model?a=1", 301, "/upstream/org/model/?a=1"),
                ("POST", "/upstream/first", 308, "/upstream/first/"),
                ("HEAD", "/upstream/org", 301, "/upstream/org/")):
            reply = front.request(method, path)
            assert (reply.status, reply.headers.get("location")) == (status, where), reply
        assert front.get("/upstream/org/model/health").status == 200
        assert front.get("/upstream/nobody").status == 404
        # the name and the query as they came: still encoded (a decoded ? or % in the
        # Location led to another model, a # cut the rest off)
        reply = front.get("/upstream/a%3Fq%2541?next=%23f&y=%2F")
        assert reply.headers["location"] == "/upstream/a%3Fq%2541/?next=%23f&y=/", reply


def test_a_pinned_server_of_unknown_footprint_does_not_stall_the_others() -> None:
    """A llama-swap ``persistent`` group imported as it is: its member pinned, preloaded, no
    memory figures. It held the GPU alone and every other model's request waited for ever;
    now it leaves for the room (saying why) and comes back when asked."""
    keep = server_backend("keep", 256, pinned=True, preload=True)
    other = server_backend("other", 256)
    for spec in (keep, other):
        del spec["vram"], spec["safety"]
    with serve_http([keep, other]) as front:
        wait_until(lambda: _state(front, "keep") == "ready", 20, "keep preloaded")
        assert front.post("/v1/chat/completions", chat("other"), timeout=30).status == 200
        logs = front.get("/logs").body.decode()  # the engine's event log
        assert "footprint is unknown" in logs, logs
        assert front.post("/v1/chat/completions", chat("keep"), timeout=30).status == 200


def test_two_servers_on_one_fixed_port_take_turns() -> None:
    """Two models whose servers listen on one fixed port (llama-swap's shared ``proxy``):
    the second failed three times ("something already listens") and stayed failed; now the
    first leaves for it, though both fit in memory, and each answers in turn."""
    port = free_port("127.0.0.1")
    specs = []
    for name in ("one", "two"):
        spec = server_backend(name, 256)
        spec["command"] = [w.replace("${PORT}", str(port)) for w in spec["command"]]
        spec["http"]["url"] = f"http://127.0.0.1:{port}"
        specs.append(spec)
    with serve_http(specs) as front:
        for name in ("one", "two", "one"):
            reply = front.post("/v1/chat/completions", chat(name), timeout=30)
            assert reply.status == 200, (name, reply)
        jobs = front.get("/v1/jobs?state=failed").json()["data"]
        assert jobs == []
        assert "already listens" not in front.get("/logs").body.decode()
        # Ollama's warm-up load of the other: it takes the port from the idle one (it was
        # given up after 30 s: a load evicts nothing for memory)
        reply = front.post("/api/generate", {"model": "two", "prompt": ""}, timeout=20)
        assert reply.status == 200 and reply.json()["done_reason"] == "load", reply
        assert (_state(front, "one"), _state(front, "two")) == ("cold", "ready")


def test_two_servers_that_cannot_co_reside_alternate_and_never_overlap() -> None:
    # 2 x (5000 + 256) MiB on an 8 GiB simulated GPU: one at a time.
    backends = [server_backend("a", 5000, args=("--tokens", "2")),
                server_backend("b", 5000, args=("--tokens", "2"))]
    with serve_http(backends) as front:
        overlap: list[dict[int, int]] = []
        seen: set[int] = set()
        done = threading.Event()

        def watch_ledger() -> None:  # the device's own ledger, sampled all along
            while not done.is_set():
                holders = sim_holders(front)
                seen.update(holders)
                if len(holders) > 1:
                    overlap.append(holders)

        watcher = threading.Thread(target=watch_ledger)
        watcher.start()
        try:
            results: list[int] = []
            threads = [threading.Thread(target=lambda m=m: results.append(
                front.post("/v1/chat/completions", chat(m)).status)) for m in "abab"]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        finally:
            done.set()
            watcher.join()
        assert results == [200] * 4
        assert overlap == []
        assert len(seen) >= 2  # both ran, one after the other
        ends = front.get("/v1/jobs?state=succeeded").json()["data"]
        assert sorted(j["backend"] for j in ends) == ["a", "a", "b", "b"]


def test_a_client_that_goes_away_frees_the_servers_slot() -> None:
    slow = server_backend("slow", args=("--tokens", "200", "--token-s", "0.05"))
    capped = server_backend("capped", args=("--tokens", "200", "--token-s", "0.05"),
                            timeouts={"request": "0.5s", "start": "20s", "stop_grace": "3s"})
    with serve_http([slow, capped]) as front:
        sse = front.sse("POST", "/v1/chat/completions", chat("slow", stream=True))
        assert first_data(sse).startswith(b"data: ")
        job_id = sse.headers["x-vramtui-job"]
        url = front.engine.backends["slow"].worker.url
        assert any(s["is_processing"] for s in _get_json(url + "/slots"))
        sse.close()
        front.wait_state(job_id, "cancelled")
        # Its answer began with the server's 200: the job records it cut short, not whole.
        assert front.get(f"/v1/jobs/{job_id}").json()["status_code"] == 499
        wait_until(lambda: not any(s["is_processing"] for s in _get_json(url + "/slots")), 10,
                   "the server to free the slot")
        # timeouts.request bounds a request the same way.
        reply = front.post("/v1/chat/completions", chat("capped", stream=True))
        assert "timed out after 0.5 s" in _error_text(reply.body), reply.body[-300:]
        url = front.engine.backends["capped"].worker.url
        wait_until(lambda: not any(s["is_processing"] for s in _get_json(url + "/slots")), 10,
                   "the server to free the slot of the request that timed out")


async def _ws_echo(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(url) as sock:
        await sock.send_str("ping")
        return str((await sock.receive(timeout=10)).data)


def test_an_open_websocket_holds_its_server_until_room_is_needed() -> None:
    """An open websocket through /upstream is use of its server: keep_alive does not unload
    it (its process stays, per /proc) while the websocket is open, even silent; room for
    another model's job still evicts it, and the client's websocket is then closed with 1012
    ("service restart": a client may reconnect); once closed, keep_alive counts again."""
    backends = [server_backend("a", 5000, keep_alive="0.5s"),
                server_backend("b", 5000, keep_alive="0.5s")]
    with serve_http(backends) as front:
        asyncio.run(_held_then_evicted(front))
        assert front.get("/v1/backends/a").json()["websockets"] == 0
        asyncio.run(_held_then_closed(front, "b"))
        wait_until(lambda: front.get("/v1/backends/b").json()["state"] == "cold", 10,
                   "b to be unloaded by keep_alive once its websocket closed")


def _backend(front: Front, name: str) -> dict[str, Any]:
    return dict(front.get(f"/v1/backends/{name}").json())


async def _stays_loaded(front: Front, name: str, for_s: float) -> int:
    """Watch ``name`` for ``for_s`` (several keep_alives): loaded, by the same process."""
    first = await asyncio.to_thread(_backend, front, name)
    assert first["websockets"] == 1 and first["keep_alive_left_s"] is None, first
    snap = await asyncio.to_thread(front.sup.snapshot)
    table = backend_table(snap, wide=True).render(width=200)
    assert any(name in line and "1 websocket" in line for line in table.splitlines()), table
    pid = first["pid"]
    loop = asyncio.get_running_loop()
    end = loop.time() + for_s
    while loop.time() < end:
        await asyncio.sleep(0.1)  # (watching that nothing happens for a while)
        now = await asyncio.to_thread(_backend, front, name)
        assert now["state"] == "ready" and now["pid"] == pid, now
        assert os.path.exists(f"/proc/{pid}")
    return int(pid)


async def _held_then_evicted(front: Front) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, \
            session.ws_connect(front.base + "/upstream/a/ws") as sock:
        await _stays_loaded(front, "a", 2.0)
        await sock.send_str("ping")
        assert (await sock.receive(timeout=10)).data == "echo:ping"
        reply = await asyncio.to_thread(front.post, "/v1/chat/completions", chat("b"))
        assert reply.status == 200, reply.body[:300]
        msg = await sock.receive(timeout=20)
        assert msg.type is aiohttp.WSMsgType.CLOSE, msg
        assert msg.data == 1012 and "server closed the websocket" in msg.extra, msg


async def _held_then_closed(front: Front, name: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session, \
            session.ws_connect(front.base + f"/upstream/{name}/ws") as sock:
        await _stays_loaded(front, name, 2.0)
        await sock.close()


def first_data(sse: Any) -> bytes:
    """The first line of an answer that is not an SSE comment (a waiting request's place)."""
    while (line := sse.resp.readline()).startswith(b":") or line == b"\n":
        pass
    return bytes(line)


def one_streaming_one_queued(front: Front, **second: Any) -> tuple[Any, Any]:
    """A stream running on backend "one" (concurrency 1), and a second (of ``second``'s
    fields) that waits behind it, once it has heard its place."""
    first = front.sse("POST", "/v1/chat/completions", chat("one", stream=True))
    assert first_data(first).startswith(b"data: ")
    waiting = front.sse("POST", "/v1/chat/completions", chat("one", stream=True, **second))
    assert waiting.wait_comment(10).startswith(": queued, position 1")
    return first, waiting


def _get_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_a_streamed_request_waiting_in_the_queue_hears_its_place() -> None:
    one = server_backend("one", concurrency=1, args=("--tokens", "30", "--token-s", "0.05"))
    with serve_http([one]) as front:
        first, second = one_streaming_one_queued(front)
        first.close()
        assert first_data(second) == b'data: {"id": "c", "model": "one", "choices": [' \
            b'{"index": 0, "delta": {"content": "t0 "}}]}\n'  # the server's, once it ran
        second.close()


def test_a_queued_stream_the_server_refuses_gets_the_refusal_as_an_event() -> None:
    # Opened as SSE for its queue notes, it is answered with the server's 400 JSON: that body
    # must come as a data event (raw, it is no event at all: the client saw an empty stream).
    one = server_backend("one", concurrency=1, args=("--tokens", "30", "--token-s", "0.05"))
    with serve_http([one]) as front:
        first, second = one_streaming_one_queued(front, max_tokens="lots")
        first.close()
        event = second.next()
        assert event is not None and event.json()["error"]["code"] == 400, event
        assert second.next() is None
        second.close()


def test_a_waiting_stream_whose_server_never_starts_ends_with_an_error_event() -> None:
    # Opened as SSE for its notes ("starting the model server"), the answer must not end
    # bare when the job fails before the server answers: the openai client read that as an
    # empty, successful completion.
    from openai import APIError, OpenAI

    backend = server_backend("neverup", mode="never-healthy", http={"ready_timeout": "1.5s"})
    with serve_http([backend]) as front:
        waiting = front.sse("POST", "/v1/chat/completions", chat("neverup", stream=True))
        assert waiting.wait_comment(10).startswith(": starting the model server")
        event = waiting.next()
        assert event is not None and "not healthy after 1.5 s" in \
            event.json()["error"]["message"], event
        assert waiting.next() is None
        waiting.close()
        client = OpenAI(base_url=front.base + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(APIError, match="neverup"):
            list(client.chat.completions.create(
                model="neverup", messages=[{"role": "user", "content": "hi"}], stream=True))


def test_a_waiting_stream_hears_the_engine_stop_as_an_error_event() -> None:
    one = server_backend("one", concurrency=1, args=("--tokens", "400", "--token-s", "0.05"))
    with serve_http([one]) as front:
        first, second = one_streaming_one_queued(front)
        threading.Thread(target=front.sup.stop, kwargs={"timeout": 30}, daemon=True).start()
        event = second.next()
        assert event is not None and "error" in event.json(), event
        first.close()
        second.close()


@pytest.mark.parametrize("before", [b"\n", b"  ", b"\xef\xbb\xbf"])
def test_a_body_with_blanks_or_a_bom_before_its_json_is_still_a_servers(before: bytes) -> None:
    # (`curl -d @pretty.json`): it went the worker's way once, and its SSE was framed twice
    backend = server_backend("llama", args=("--tokens", "3"), http={"model_name": "real"})
    with serve_http([backend]) as front:
        body = before + json.dumps(chat("llama", stream=True)).encode()
        reply = front.post("/v1/chat/completions", raw=body)
        assert reply.status == 200, reply.body
        events = [line for line in reply.body.split(b"\n") if line.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]" and len(events) == 4, reply.body
        assert all(not e.startswith(b"data: data:") for e in events)
        # the server got its own model name (http.model_name), as for any JSON body
        assert json.loads(events[0][6:])["model"] == "real", events[0]


def test_the_official_openai_client_streams_through_the_engine() -> None:
    from openai import OpenAI

    with serve_http([server_backend("llama", args=("--tokens", "5"))]) as front:
        client = OpenAI(base_url=front.base + "/v1", api_key="unused", max_retries=0)
        parts = [c.choices[0].delta.content for c in client.chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "hi"}], stream=True)]
        assert "".join(p or "" for p in parts) == "t0 t1 t2 t3 t4 "
        emb = client.embeddings.create(model="llama", input="x")
        assert emb.data[0].embedding == [0.1, 0.2, 0.3]


def _taken_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_bad_servers_each_get_one_clear_error_and_leave_nothing_behind() -> None:
    taken = _taken_port()
    port = taken.getsockname()[1]
    fixed = server_backend("taken", args=())
    fixed["command"][fixed["command"].index("${PORT}")] = str(port)
    fixed["http"] = {"url": f"http://127.0.0.1:{port}"}
    backends = [
        server_backend("never", mode="never-healthy", http={"ready_timeout": "0.5s"}),
        server_backend("exits", mode="exit"),
        fixed,
        server_backend("err500", mode="error500"),
        server_backend("endless", mode="endless"),
        server_backend("broken", mode="broken"),
        server_backend("good", 256),
    ]
    config = EngineConfig(reserve_mib=0, tick_s=0.1, max_result_bytes=256 * 1024)
    try:
        with serve_http(backends, engine_config=config) as front:
            wanted = {
                "never": "not healthy after 0.5 s (http.ready_timeout)",
                "exits": "its server failed to start: server exited with code 1; its log "
                         "ends: model_server: error: failed to load model 'x.gguf'",
                "taken": f"something already listens on http://127.0.0.1:{port}",
                "err500": "KV cache is full",  # (its own answer, under its own status)
                "endless": "went over the result limit of 262144 bytes",
                "broken": "its answer broke off",
            }
            for name, text in wanted.items():
                stream = name in ("endless", "broken")
                reply = front.post("/v1/chat/completions", chat(name, stream=stream))
                message = _error_text(reply.body)
                assert text in message, (name, reply.status, message)
                if name == "broken":  # every event whole: the cut one never went out
                    # (an SSE comment, ": starting the model server", comes while it starts)
                    events = [e for e in reply.body.split(b"\n\n")
                              if e.strip() and not e.startswith(b":")]
                    assert events and all(json.loads(e.removeprefix(b"data: ")) for e in events), \
                        reply.body
                assert "\n" not in message and "Traceback" not in message, message
                assert (reply.status == 500) == (name == "err500"), (name, reply.status)
                # its client waited for every start: the error says so, not one timeout
                if name in ("never", "exits"):
                    assert message.endswith("(tried 3 times in a row)"), message
                assert front.post("/v1/chat/completions", chat("good")).status == 200
            assert front.get("/v1/jobs?state=queued").json()["data"] == []
            failed = front.get("/v1/jobs?backend=err500").json()["data"]
            assert [j["state"] for j in failed] == ["failed"], failed
            assert 'answered HTTP 500: {"error": {"code": 500' in failed[0]["error"], failed
            held = {b["name"]: b["jobs"] for b in front.get("/v1/backends").json()["data"]}
            assert all(j["running"] == 0 and j["queued"] == 0 for j in held.values()), held
        assert not server_pids(front.root)  # no orphan server
    finally:
        taken.close()


def _error_text(body: bytes) -> str:
    """The error an answer carries: the JSON error's message, or an SSE error event's."""
    for line in body.splitlines():
        text = line.removeprefix(b"data: ")
        if text.startswith(b'{"error"'):
            return str(json.loads(text)["error"]["message"])
    return body.decode(errors="replace")


def test_an_answer_that_is_no_event_stream_and_breaks_off_reaches_the_client_broken() -> None:
    # A download through /upstream (every request there is relayed as it comes): the server
    # declares 4096 bytes and closes after 100. The relay's own framing (chunked) must not end
    # it as if whole: the client has to see a broken answer, not 100 bytes that look complete.
    import http.client

    # A server's 5xx fails its job too, but that answer came whole: it goes whole, under its
    # own status, streamed or not (it was a 502 of ours that quoted it).
    with serve_http([server_backend("llama"), server_backend("err500", mode="error500")]) \
            as front:
        conn = front.conn()
        try:
            conn.request("GET", "/upstream/llama/files/cut")
            resp = conn.getresponse()
            assert resp.status == 200
            with pytest.raises(http.client.IncompleteRead) as cut:
                resp.read()
            assert cut.value.partial == b"x" * 100
        finally:
            conn.close()
        jobs = front.get("/v1/jobs?backend=llama").json()["data"]
        assert [j["state"] for j in jobs] == ["failed"], jobs
        assert "broke off" in jobs[0]["error"], jobs[0]
        assert front.post("/v1/chat/completions", chat("llama")).status == 200
        said = b'{"error": {"code": 500, "message": "KV cache is full", "type": "server_error"}}'
        for path, stream in (("/upstream/err500/v1/chat/completions", False),
                             ("/v1/chat/completions", False), ("/v1/chat/completions", True)):
            refused = front.post(path, chat("err500", stream=stream))
            assert (refused.status, refused.body) == (500, said), (path, stream, refused)
            assert refused.headers["content-type"].startswith("application/json"), refused


def test_a_server_whose_health_never_answers_fails_at_its_ready_timeout() -> None:
    # It takes the health request's connection and never answers: the one request must be
    # given up at the deadline, not after a health request's own 30 s (times three starts).
    backend = server_backend("mute", mode="health-hangs", http={"ready_timeout": "0.5s"})
    with serve_http([backend]) as front:
        started = time.monotonic()
        reply = front.post("/v1/chat/completions", chat("mute"))
        took = time.monotonic() - started
        message = _error_text(reply.body)
        assert reply.status == 502 and "not healthy after 0.5 s" in message, message
        assert took < 10, took  # three starts of 0.5 s each, and their stops
    wait_until(lambda: not server_pids(front.root), 10, "the server to be gone")


def test_an_ollama_stream_from_a_failing_server_ends_with_one_error_line() -> None:
    import ollama

    with serve_http([server_backend("err500", mode="error500")]) as front:
        reply = front.post("/api/chat", {"model": "err500", "stream": True,
                                         "messages": [{"role": "user", "content": "hi"}]})
        lines = [json.loads(line) for line in reply.body.splitlines() if line.strip()]
        assert len(lines) == 1 and "KV cache is full" in lines[0]["error"], lines
        whole = front.post("/api/chat", {"model": "err500", "stream": False,
                                         "messages": [{"role": "user", "content": "hi"}]})
        assert whole.status == 500, whole  # the model's status (it was a 502 of ours)
        assert whole.json()["error"] == "the model answered status 500: KV cache is full"
        client = ollama.Client(host=front.base, timeout=30)
        with pytest.raises(ollama.ResponseError, match="KV cache is full"):
            list(client.chat(model="err500", messages=[{"role": "user", "content": "hi"}],
                             stream=True))


def test_an_ollama_load_answers_once_loaded_or_with_its_error() -> None:
    """Ollama's load (an empty prompt) answers when the model is loaded; it said "load" at
    once, while the server still started, or when it could not start at all."""
    import ollama

    slow = server_backend("slow", args=("--load-s", "0.5"))
    with serve_http([slow, server_backend("dead", mode="exit")]) as front:
        client = ollama.Client(host=front.base, timeout=30)
        r = client.generate(model="slow", prompt="")
        assert r.done_reason == "load" and _state(front, "slow") == "ready"
        with pytest.raises(ollama.ResponseError) as err:
            client.generate(model="dead", prompt="")
        assert err.value.status_code == 500 and "dead did not load" in err.value.error


def test_an_ollama_load_while_the_model_stops_loads_it_once_it_has_gone() -> None:
    """``ollama stop m; ollama run m``: the load came while the old server still stopped
    and was answered 503 "no room for it now" on an empty GPU."""
    with serve_http([server_backend("m", 256, mode="deaf")]) as front:  # (slow to stop)
        assert front.post("/v1/chat/completions", chat("m")).status == 200
        assert front.post("/v1/backends/m/unload", {}).status < 300
        assert _state(front, "m") == "stopping"
        reply = front.post("/api/generate", {"model": "m", "prompt": ""}, timeout=30)
        assert reply.status == 200 and reply.json()["done_reason"] == "load", reply
        assert _state(front, "m") == "ready"


def test_ollamas_lists_name_each_model_by_a_name_that_reaches_it() -> None:
    """Backend ``x`` beside ``y`` with the alias ``x:latest``: the lists named both
    ``x:latest`` (x dropped out of ``/api/tags``), and ``ollama stop x:latest``, the name
    ``/api/ps`` showed for x, unloaded y."""
    with serve_http([server_backend("x", 256), server_backend("y", 256,
                                                              aliases=["x:latest"])]) as front:
        tags = {m["name"]: m["digest"] for m in front.get("/api/tags").json()["models"]}
        assert set(tags) == {"x", "x:latest", "y:latest"}
        assert tags["x"] != tags["x:latest"] == tags["y:latest"]
        assert front.post("/v1/chat/completions", chat("x")).status == 200
        assert [m["name"] for m in front.get("/api/ps").json()["models"]] == ["x"]


def test_an_ollama_stream_a_server_answers_whole_keeps_its_text() -> None:
    """A server that answers a stream request with one whole JSON answer: the Ollama door
    read its message as no delta and sent an empty reply, done, with nothing said."""
    import ollama

    with serve_http([server_backend("odd", mode="odd")]) as front:
        client = ollama.Client(host=front.base, timeout=30)
        parts = list(client.chat(model="odd", stream=True,
                                 messages=[{"role": "user", "content": "whole"}]))
        assert "".join(p.message.content or "" for p in parts) == "all at once"
        assert parts[-1].done and parts[-1].done_reason == "stop"
        said = client.generate(model="odd", prompt="whole", stream=True)
        assert "".join(p.response for p in said) == "all at once"


def test_a_body_of_a_gibibyte_is_refused_and_the_queue_goes_on() -> None:
    with serve_http([server_backend("llama")], max_body=1024 * 1024) as front:
        with socket.create_connection(("127.0.0.1", front.port), timeout=30) as sock:
            host = f"Host: 127.0.0.1:{front.port}\r\n".encode()
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n" + host +
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: 1073741824\r\n\r\n")
            try:
                for _ in range(64):
                    sock.sendall(b"x" * 65536)
            except OSError:
                pass  # the door closed it: the answer is already there
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"request body too large" in answer
        assert front.post("/v1/chat/completions", chat("llama")).status == 200


def test_a_body_declared_over_the_limit_is_refused_before_a_byte_of_it_is_read() -> None:
    # Read to the limit first, each such request held max_body in the engine's memory (eight
    # curl uploads of 1 GiB at once: +420 MiB of RSS at the default 64 MiB): its declared
    # length says enough. Nothing of the body is sent here: the answer must come anyway.
    with serve_http([server_backend("llama")], max_body=1024 * 1024) as front:
        with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
            sock.sendall(b"POST /upstream/llama/echo HTTP/1.1\r\n"
                         b"Host: 127.0.0.1:%d\r\n" % front.port +
                         b"Content-Type: application/octet-stream\r\n"
                         b"Content-Length: 1073741824\r\n\r\n")
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"request body too large: the limit is 1 MiB" in answer, answer
        # Under /api/ the refusal is in Ollama's shape, which its clients read
        with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
            sock.sendall(b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % front.port +
                         b"Content-Type: application/json\r\n"
                         b"Content-Length: 1073741824\r\n\r\n")
            head, _, body = sock.recv(65536).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head
        error = json.loads(body)["error"]
        assert isinstance(error, str) and "request body too large" in error, body
        assert front.get("/v1/jobs?backend=llama").json()["data"] == []
        assert front.post("/v1/chat/completions", chat("llama")).status == 200


def test_expect_100_continue_is_answered_after_the_checks_that_need_no_body() -> None:
    # aiohttp's own handler said 100 to anyone before any check: a body over the limit, or a
    # client without the token, was asked for its body and refused only once it came.
    with serve_http([server_backend("llama")], max_body=1024 * 1024,
                    token="t0ken-0123456789abcdef0123456789", token_source="test") as front:
        auth = {"Authorization": "Bearer t0ken-0123456789abcdef0123456789"}
        with expecting(front.port, "/v1/chat/completions", 1024 ** 3, auth) as sock:
            answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        with expecting(front.port, "/api/chat", 10) as sock:  # no token
            head, _, body = sock.recv(65536).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 401"), head
        assert isinstance(json.loads(body)["error"], str), body  # Ollama's shape under /api/
        payload = json.dumps(chat("llama")).encode()
        with expecting(front.port, "/v1/chat/completions", len(payload), auth) as sock:
            assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(payload)
            reply = b""
            while b"\r\n\r\n" not in reply:
                reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_a_server_that_crashes_or_hangs_is_killed_and_started_again() -> None:
    backends = [server_backend("crashy", mode="crash"),
                server_backend("hangs", mode="hang", timeouts={"ping": "0.5s", "start": "20s",
                                                               "stop_grace": "1s"})]
    with serve_http(backends) as front:
        for name, text in (("crashy", "server exited with code 3; its log ends: model_server: "
                            "GGML_ASSERT failed"),
                           ("hangs", "hangs hung: its server")):
            reply = front.post("/v1/chat/completions", chat(name))
            message = _error_text(reply.body)
            assert reply.status == 502 and text in message, message
            job_id = message.split()[1]  # "job j-… failed: …"
            history = front.get(f"/v1/jobs/{job_id}").json()["history"]
            assert any("requeued once" in str(h) for h in history), history  # retried once
        # Its stderr is in its log, where `vramtui logs crashy` reads it.
        assert b"GGML_ASSERT failed" in front.get("/v1/backends/crashy/logs").body
        # The next request starts it again (and it crashes again).
        assert front.post("/v1/chat/completions", chat("crashy")).status == 502
        crashes = [line for line in front.get("/metrics").body.decode().splitlines()
                   if line.startswith('vramtui_backend_crashes_total{backend="crashy"}')]
        assert crashes and float(crashes[0].split()[-1]) >= 3, crashes
    wait_until(lambda: not server_pids(front.root), 10, "every server to be gone")


def test_a_server_is_calibrated_like_a_worker() -> None:
    # it loads its weights 0.6 s after its context, as a real server takes a while: the
    # calibration tells the two apart from what it samples in between (at 0.05 s a loaded box
    # could sample both at once)
    unmeasured = server_backend("fresh", 700, args=("--load-s", "0.6", "--wake-s", "0.1"))
    unmeasured["http"].update(sleep="POST /sleep?level=1", wake="POST /wake_up")
    del unmeasured["vram"]
    with serve_http([unmeasured]) as front:
        job = front.post("/v1/backends/fresh/calibrate", {"repeats": 1, "settle_s": 0.3}).json()
        assert front.wait_state(job["id"], "succeeded", "failed", timeout=60) == "succeeded"
        report = front.get("/v1/backends/fresh/calibration").json()
        assert report["record"]["source"] == "simulated"
        assert report["analysis"]["weights"]["value_mib"] == 700, report["analysis"]
        # It can sleep: what it keeps asleep (its context) and its wake, measured.
        assert report["analysis"]["sleep_residual"]["value_mib"] == CONTEXT_MIB
        assert report["analysis"]["wake_s"] >= 0.1


def test_a_stop_command_stops_the_server_and_a_port_can_be_its_health() -> None:
    quit_it = [sys.executable, "-c", "import urllib.request as r; r.urlopen("
               "'http://127.0.0.1:${PORT}/quit', data=b'')"]
    # health: none: ready once its port answers, and alive while it does
    polite = server_backend("polite", http={"stop": quit_it, "health": "none"})
    with serve_http([polite]) as front:
        assert front.post("/v1/chat/completions", chat("polite")).status == 200
        assert front.post("/v1/backends/polite/unload").status in (200, 202)
        wait_until(lambda: front.get("/v1/backends/polite").json()["state"] == "cold", 10,
                   "the server to stop")
        assert b"stopped by POST /quit" in front.get("/v1/backends/polite/logs").body
        assert not server_pids(front.root)


def test_a_fault_of_ours_while_forwarding_fails_the_job_and_the_queue_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the forwarding (injected: the exchange raises what nothing expects) fails the
    job with a one-line reason; it is never left running, and the next request is served."""
    from supervisor.servers import wire

    real = wire.Link.complete
    faults = [RuntimeError("injected fault")]

    async def faulty(self: Any, ex: Any) -> None:
        if faults:
            raise faults.pop()
        await real(self, ex)

    monkeypatch.setattr(wire.Link, "complete", faulty)
    with serve_http([server_backend("a")]) as front:
        reply = front.post("/v1/chat/completions", chat("a"))
        assert reply.status == 502 and "injected fault" in reply.error["message"], reply.body
        assert front.post("/v1/chat/completions", chat("a")).status == 200
        failed = front.get("/v1/jobs?state=failed").json()["data"]
        assert [j["backend"] for j in failed] == ["a"]


@pytest.mark.parametrize("launcher", ["setsid", "setsid -f", "setsid -f env -i"])
def test_a_child_that_left_the_servers_process_group_goes_with_it(launcher: str) -> None:
    # A server whose command starts a helper in a session of its own (setsid): a signal to
    # the server's process group misses it, so it is killed by pid once the server is gone.
    # With setsid -f the helper is a daemon (forked twice, out of the server's tree, were it
    # not for the reaper that adopts it), and with env -i nothing in it names the worker.
    escaper = Escaper(f"{sys.executable} {SERVER} --port ${{PORT}} --mib 256", launcher)
    backend = server_backend("escaper", command=escaper.command)
    try:
        _serve_escaper(backend, escaper)
    finally:
        escaper.kill_left()


@pytest.mark.parametrize("launcher", ["setsid", "setsid -f", "setsid -f env -i"])
def test_a_child_that_left_the_group_of_a_server_that_crashed_goes_too(launcher: str) -> None:
    # Nobody stopped it: the reaper kills what its tree left once the server is gone (and
    # what carries its mark is found too).
    escaper = Escaper(f"{sys.executable} {SERVER} --port ${{PORT}} --mib 256 --mode crash",
                      launcher)
    backend = server_backend("crasher", command=escaper.command)
    try:
        with serve_http([backend]) as front:
            reply = front.post("/v1/chat/completions", chat("crasher"))
            assert reply.status == 502 and "exited with code 3" in _error_text(reply.body)
            wait_until(lambda: not escaper.pids(), 10, "the crashed server's helper to be gone")
            assert front.get("/v1/backends/crasher").json()["state"] in ("cold", "crashed")
    finally:
        escaper.kill_left()


def _serve_escaper(backend: dict[str, Any], escaper: Escaper) -> None:
    with serve_http([backend]) as front:
        assert front.post("/v1/chat/completions", chat("escaper")).status == 200
        (pid,) = wait_until(escaper.pids, 10, "the server's helper to start")
        server_pid = next(iter(server_pids(front.root)))
        assert os.getpgid(pid) != os.getpgid(server_pid)  # out of the server's group
        assert front.post("/v1/backends/escaper/unload").status in (200, 202)
        wait_until(lambda: front.get("/v1/backends/escaper").json()["state"] == "cold", 10,
                   "the server to stop")
        wait_until(lambda: not escaper.pids(), 10, "the helper that left its group to be gone")


def test_ollama_ps_shows_a_server_that_holds_nothing_simulated_by_its_figures() -> None:
    """A real server on the simulated GPU writes nothing to the simulated device's ledger (it
    declares no memory there): ``/api/ps`` gives its declared figures as what it holds on the
    GPU, as admission counts them, and says they are simulated (``ollama ps`` reads
    ``size_vram`` as its share on the GPU: 0 said "100% CPU")."""
    real_like = server_backend("real", 512, env={"VRAMTUI_SIM_DIR": ""})  # (as one not ours)
    with serve_http([real_like]) as front:
        assert front.post("/v1/chat/completions", chat("real")).status == 200
        assert not any(sim_holders(front).values())  # the device's own ledger: nothing
        (model,) = front.get("/api/ps").json()["models"]
        assert model["size"] == (512 + CONTEXT_MIB) * 1024 * 1024
        assert model["size_vram"] == model["size"] and model["simulated"] is True
