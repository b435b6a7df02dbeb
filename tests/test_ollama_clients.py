"""The official ``ollama`` client against the front door: chat and generate (NDJSON streamed and
not), embed, show, the load/unload idiom, pull answered honestly, and errors in Ollama's shape —
each request a job run through the same path as /v1/chat/completions."""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Iterator

import ollama
import pytest
from http_support import Front, openai_backends, serve_http
from spawning import spawns
from waiting import wait_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.process]
TEXT = "Hello from a simulated model on vramtui."


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    backends = [b for b in openai_backends()
                if b["name"] in ("chat-sim", "embed-sim", "slow-chat")]
    for b in backends:  # honest figures: the simulated GPU's context counts too
        b["vram"]["context"] = "256MiB"
    with serve_http(backends, gpus="sim:4GiB") as f:
        yield f


@pytest.fixture(scope="module")
def client(front: Front) -> ollama.Client:
    return ollama.Client(host=front.base, timeout=30)


def test_chat_whole_and_streamed(client: ollama.Client, front: Front) -> None:
    r = client.chat(model="gpt-4o-mini", stream=False,
                    messages=[{"role": "user", "content": "hi there"}])
    assert r.message.role == "assistant" and r.message.content == TEXT
    assert r.done and r.done_reason == "stop" and r.model == "gpt-4o-mini"
    assert r.prompt_eval_count == 2 and r.eval_count == len(TEXT.split())
    parts = list(client.chat(model="chat-sim", messages=[{"role": "user", "content": "hi"}],
                             options={"num_predict": 3}, stream=True))
    assert "".join(p.message.content or "" for p in parts) == "Hello from a"
    assert [p.done for p in parts] == [False] * 3 + [True]
    assert parts[-1].done_reason == "stop" and parts[-1].eval_count == 3
    # each request was a job of its backend, as /v1/chat/completions makes one
    jobs = front.get("/v1/jobs?backend=chat-sim").json()["data"]
    assert len(jobs) >= 2 and {j["state"] for j in jobs} == {"succeeded"}


def test_names_as_ollama_lists_them_reach_their_model(client: ollama.Client,
                                                      front: Front) -> None:
    """Open WebUI takes the names ``/api/tags`` lists and the ``ollama`` CLI adds
    ``:latest`` to a name without a tag; before, ``/api/tags`` listed ``chat-sim`` and
    ``chat-sim:latest`` was "model not found". And both ask ``GET``/``HEAD /`` first, which
    was a 404: Ollama answers "Ollama is running"."""
    root = front.get("/")
    assert (root.status, root.body) == (200, b"Ollama is running")
    assert front.request("HEAD", "/").status == 200
    listed = {m.model for m in client.list().models}
    assert {"chat-sim:latest", "gpt-4o-mini:latest", "embed-sim:latest"} <= listed
    assert all(":" in name for name in listed)
    r = client.chat(model="chat-sim:latest", messages=[{"role": "user", "content": "hi"}])
    assert r.message.content == TEXT
    assert client.embed(model="embed-sim:latest", input="x").embeddings
    loaded = {m.model for m in client.ps().models}
    assert "chat-sim:latest" in loaded  # as Ollama's ps names it
    # the OpenAI door takes either spelling too; a tag that is not there is not found
    done = front.post("/v1/chat/completions", {"model": "gpt-4o-mini:latest", "messages": [
        {"role": "user", "content": "hi"}]})
    assert done.status == 200, done.body
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="chat-sim:7b", messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 404


def test_generate_whole_and_streamed(client: ollama.Client) -> None:
    r = client.generate(model="chat-sim", prompt="say hi", system="be brief", stream=False)
    assert r.response == TEXT and r.done
    pieces = list(client.generate(model="chat-sim", prompt="say hi", stream=True))
    assert "".join(p.response for p in pieces) == TEXT and pieces[-1].done


def test_the_stream_is_ndjson_and_nothing_else(front: Front) -> None:
    r = front.post("/api/chat", {"model": "chat-sim",
                                 "messages": [{"role": "user", "content": "hi"}]})
    assert r.status == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = r.body.decode().splitlines()
    assert all(line for line in lines)  # no blank or comment line an NDJSON reader chokes on
    objs = [json.loads(line) for line in lines]
    assert objs[-1]["done"] is True and not any(o["done"] for o in objs[:-1])


def test_embed_and_the_legacy_embeddings(client: ollama.Client) -> None:
    r = client.embed(model="embed-sim", input=["one", "two"])
    assert len(r.embeddings) == 2 and all(isinstance(x, float) for x in r.embeddings[0])
    assert r.embeddings[0] != r.embeddings[1]
    one = client.embed(model="text-embedding-3-small", input="one")
    assert one.embeddings[0] == r.embeddings[0]
    assert all(abs(sum(x * x for x in v) - 1) < 1e-9 for v in r.embeddings)  # unit length
    legacy = client.embeddings(model="embed-sim", prompt="one")  # the model's, as it is
    norm = sum(x * x for x in legacy.embedding) ** 0.5
    assert [x / norm for x in legacy.embedding] == pytest.approx(r.embeddings[0])
    cut = client.embed(model="embed-sim", input="one", dimensions=2).embeddings[0]
    assert len(cut) == 2 and abs(cut[0] ** 2 + cut[1] ** 2 - 1) < 1e-9
    # nothing to embed: the model is loaded, and no vector comes (it was a 400)
    assert client.embed(model="embed-sim", input=[]).embeddings == []


def test_show_pull_and_errors_in_ollamas_shape(client: ollama.Client, front: Front) -> None:
    shown = client.show("gpt-4o-mini")
    assert shown.capabilities == ["completion"]
    assert shown.modelinfo is not None and shown.modelinfo["vramtui.backend"] == "chat-sim"
    assert client.show("embed-sim").capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as err:
        client.show("nope")
    assert err.value.status_code == 404 and "'nope' not found" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3")
    assert err.value.status_code == 501 and "pull is not supported" in err.value.error
    assert "chat-sim" in err.value.error
    for call in (lambda: client.chat(model="nope", stream=True,
                                     messages=[{"role": "user", "content": "x"}]),
                 lambda: client.chat(model="nope", stream=False, messages=[]),
                 lambda: client.embed(model="nope", input="x")):
        with pytest.raises(ollama.ResponseError) as err:
            result = call()
            list(result) if not isinstance(result, ollama.ChatResponse) else None
        assert err.value.status_code == 404 and "'nope' does not exist" in err.value.error
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="embed-sim", stream=False, messages=[{"role": "user",
                                                                 "content": "x"}])
    assert err.value.status_code == 400 and "not chat" in err.value.error
    bad = front.post("/api/embed", {"model": "embed-sim", "input": [1, 2]})  # the client
    assert bad.status == 400 and "input" in bad.json()["error"]  # would refuse to send it
    bad = front.post("/api/chat", raw=b"{not json")
    assert bad.status == 400 and set(bad.json()) == {"error"}
    # No route under /api/ (Ollama's namespace): Ollama's shape too; elsewhere OpenAI's.
    for method, path, status in (("POST", "/api/nosuch", 404), ("GET", "/api/chat", 405)):
        r = front.request(method, path)
        assert r.status == status and isinstance(r.json()["error"], str), (path, r.body)
    assert isinstance(front.request("POST", "/v1/nosuch").json()["error"], dict)


def test_an_empty_prompt_loads_and_keep_alive_0_unloads(client: ollama.Client,
                                                        front: Front) -> None:
    def state() -> str:
        return {b.name: b.state for b in front.sup.snapshot().backends}["chat-sim"]

    client.generate(model="chat-sim", prompt="hi", stream=False)  # loaded
    r = client.generate(model="chat-sim", prompt="", keep_alive=0)
    assert r.done and r.done_reason == "unload"
    wait_until(lambda: state() == "cold", 10, "chat-sim to unload")
    (loaded,) = list(client.chat(model="chat-sim", messages=[], stream=True))  # one line
    assert loaded.done and loaded.done_reason == "load"
    wait_until(lambda: state() == "ready", 10, "chat-sim to load")


def test_keep_alive_0_on_a_busy_model_unloads_it_once_its_answer_is_done(
        client: ollama.Client, front: Front) -> None:
    """Ollama unloads a busy model once its requests are answered; the answer said "unload"
    and the model stayed loaded (the engine refused to evict a busy backend, and that was
    swallowed)."""
    def state() -> str:
        return {b.name: b.state for b in front.sup.snapshot().backends}["slow-chat"]

    conn, resp = _slow_chat_begun(front)  # it works …
    r = client.generate(model="slow-chat", prompt="", keep_alive=0)
    assert r.done_reason == "unload" and state() == "busy"  # … and finishes its answer
    lines = [json.loads(line) for line in resp.read().splitlines()]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    conn.close()
    wait_until(lambda: state() == "cold", 10, "slow-chat to unload once idle")
    client.generate(model="slow-chat", prompt="hi", options={"num_predict": 1})
    assert state() == "ready"  # (a new load keeps its keep_alive)


def test_keep_alive_0_with_a_prompt_unloads_the_model_once_it_answered(
        client: ollama.Client, front: Front) -> None:
    """``ollama run --keepalive 0`` (and any client's ``keep_alive: "0ms"``): the answer,
    then the model unloads; it stayed loaded for its descriptor's keep_alive."""
    def state() -> str:
        return {b.name: b.state for b in front.sup.snapshot().backends}["chat-sim"]

    r = client.generate(model="chat-sim", prompt="hi", keep_alive="0ms", stream=False)
    assert r.response == TEXT
    wait_until(lambda: state() == "cold", 10, "chat-sim to unload after its answer")
    parts = list(client.chat(model="chat-sim", messages=[{"role": "user", "content": "hi"}],
                             keep_alive=0, stream=True))
    assert "".join(p.message.content or "" for p in parts) == TEXT
    wait_until(lambda: state() == "cold", 10, "chat-sim to unload after its stream")
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model="chat-sim", prompt="hi", keep_alive="soon")
    assert err.value.status_code == 400 and "keep_alive" in err.value.error


def _slow_chat_begun(front: Front) -> tuple[http.client.HTTPConnection,
                                             http.client.HTTPResponse]:
    """A streamed chat of slow-chat, its first line read: its answer has begun."""
    conn = front.conn()
    conn.request("POST", "/api/chat", body=json.dumps({
        "model": "slow-chat", "messages": [{"role": "user", "content": "hi"}]}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert json.loads(resp.readline())["done"] is False
    return conn, resp


def test_a_client_that_goes_away_cancels_its_job(front: Front) -> None:
    conn, resp = _slow_chat_begun(front)  # it streams …
    resp.close()
    conn.close()  # … and its client goes
    job = wait_until(lambda: front.get("/v1/jobs?backend=slow-chat&state=cancelled")
                     .json()["data"], 10, "the abandoned job to be cancelled")[0]
    assert "went away" in job["error"]


@pytest.mark.parametrize("flag", ["maybe", 1, "no", [True]])
def test_a_stream_flag_that_is_not_a_boolean_is_refused(front: Front, flag: object) -> None:
    """``"stream": "maybe"`` was streamed by the worker and answered as one unframed body
    (no ``data:`` lines); Ollama's ``"stream": "no"`` streamed. Both are refused now, in
    their route's error shape; true and false still do what they say."""
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    bad = front.post("/v1/chat/completions", {**chat, "stream": flag})
    assert bad.status == 400, bad.body
    assert bad.json()["error"]["param"] == "stream" and "true or false" in \
        bad.json()["error"]["message"]
    bad = front.post("/api/chat", {**chat, "stream": flag})
    assert bad.status == 400 and "stream: true or false" in bad.json()["error"], bad.body
    whole = front.post("/v1/chat/completions", {**chat, "stream": False})
    assert whole.status == 200 and whole.json()["choices"][0]["message"]["content"] == TEXT
    streamed = front.post("/v1/chat/completions", {**chat, "stream": True})
    events = [e for e in streamed.body.split(b"\n\n") if e and not e.startswith(b":")]
    assert streamed.status == 200 and events[0].startswith(b"data: "), streamed.body


def test_a_body_in_an_encoding_the_door_cannot_undo_is_a_clear_4xx(
        front: Front, caplog: pytest.LogCaptureFixture) -> None:
    """A gzip body that does not unzip was a 500 (an internal error, a traceback in the log);
    an encoding nobody undoes (``foo``) was read as the bytes it is. Now: 400 and 415, and
    a body that is gzip is read as ever."""
    import gzip
    import socket

    chat = json.dumps({"model": "gpt-4o-mini", "stream": False,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    with caplog.at_level(logging.ERROR):
        broken = front.post("/v1/chat/completions", raw=chat,
                            headers={"Content-Encoding": "gzip"})
        assert broken.status == 400 and broken.json()["error"]["code"] == "unreadable_body"
        front.get("/healthz")  # (the first connection's end is logged before this answer)
    assert not [r for r in caplog.records if r.exc_info], caplog.text  # no traceback logged
    odd = front.post("/v1/chat/completions", raw=chat, headers={"Content-Encoding": "foo"})
    assert odd.status == 415 and odd.json()["error"]["code"] == "unsupported_content_encoding"
    # (br: aiohttp's parser refuses it with its head, without Brotli installed: before us)
    odd = front.post("/v1/chat/completions", raw=chat, headers={"Content-Encoding": "br"})
    assert odd.status in (400, 415) and "br" in odd.json()["error"]["message"], odd.body
    zipped = front.post("/v1/chat/completions", raw=gzip.compress(chat),
                        headers={"Content-Encoding": "gzip"})
    assert zipped.status == 200 and zipped.json()["choices"][0]["message"]["content"] == TEXT
    # deflate is refused unread: aiohttp waited for ever for the rest of a deflate body cut
    # short whose bytes came after its head (a loaded box: 3 requests in 90, never answered).
    # Its head alone gets the answer, the body never sent:
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     b"application/json\r\nContent-Encoding: deflate\r\nContent-Length: 6"
                     b"\r\n\r\n")
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 415 "), head[:200]
