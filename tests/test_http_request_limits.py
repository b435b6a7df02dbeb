"""What a request's body may cost the door, and what a bad one is answered (after an attack on
the HTTP door): a JSON body of a million empty objects, a form of thousands of parts, a gzip
body cut short, a model's name of megabytes, ``stream`` asked of a worker that cannot, and a
field of the wrong type that a worker failed on.  A real engine and its door, real workers
(``examples/openai``) and a real model server (``tests/model_server.py``)."""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_support import Front, openai_backends, serve_http
from spawning import spawns

from supervisor.http.bodies import (
    MAX_FORM_PARTS,
    MAX_JSON_ITEMS,
    depth,
    form_parts,
    gunzip,
    structure,
)
from supervisor.plain import nesting

pytestmark = [pytest.mark.timeout(120)]
SERVER = Path(__file__).resolve().parent / "model_server.py"
CHAT = [{"role": "user", "content": "hi"}]
FORM = "multipart/form-data; boundary=XX"


def _server_backend() -> dict[str, Any]:
    return {"name": "llama", "command": [sys.executable, str(SERVER), "--port", "${PORT}",
                                         "--mib", "64", "--tokens", "3"],
            "http": {"health": "/health"}, "api": ["chat", "transcriptions"],
            "vram": {"weights": "64MiB", "activation": "0MiB", "context": "256MiB"},
            "safety": "0MiB", "simulated": True, "concurrency": 4,
            "timeouts": {"start": "20s", "stop_grace": "3s"}}


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    backends = [b for b in openai_backends() if b["name"] in ("chat-sim", "embed-sim", "stt-sim")]
    with serve_http([*backends, _server_backend()], gpus="sim:4GiB") as f:
        yield f


def _form(*fields: tuple[str, bytes], filename: str | None = None) -> bytes:
    out = b""
    for name, value in fields:
        file = f'; filename="{filename}"' if name == "file" and filename else ""
        out += (f'--XX\r\nContent-Disposition: form-data; name="{name}"{file}\r\n\r\n'.encode()
                + value + b"\r\n")
    return out + b"--XX--\r\n"


# -- 1. JSON: counted before it is parsed, parsed once --------------------------------------
def test_a_bodys_structure_is_read_from_its_bytes_outside_its_strings() -> None:
    """What parsing would cost, known before it is paid: the values and keys, and the depth."""
    body = {"a": [1, 2, {}], "text": "one, two: [three] {four} \"five\", \\ six" * 100,
            "deep": [[[{"x": [[]]}]]]}
    raw = json.dumps(body).encode()
    shape = structure(raw, MAX_JSON_ITEMS)
    assert shape == b"{:[,,{}],:,:[[[{:[[]]}]]]}"  # (its strings' marks are text)
    assert structure(raw, 16) == shape and structure(raw, 15) is None  # 16, exactly
    assert depth(shape) == nesting(body, 1000) == 7
    for wide in ([[0]] * 1000, [[[[[]]]]] * 30_000, [[[1] * 3] * 3] * 40_000):
        assert depth(structure(json.dumps(wide).encode(), MAX_JSON_ITEMS) or b"") == \
            nesting(wide, 1000)
    assert structure(b"[" + b"{}," * 200 + b"{}]", 201) is None  # 202 values
    assert structure(b"[" + b'"",' * 600 + b'""]', 500) is None  # (strings: values too)


@pytest.mark.process
def test_a_json_body_of_a_million_values_is_refused_unparsed(front: Front) -> None:
    """A body of empty objects at the size limit was 1.5 GB of objects a parse, parsed twice,
    and stalled the engine's loop for half a minute: past MAX_JSON_ITEMS it is a 413."""
    wide = b'{"model":"chat-sim","messages":[{"role":"user","content":"hi"}],"x":[' + \
        b"{}," * MAX_JSON_ITEMS + b"{}]}"
    for path in ("/v1/chat/completions", "/v1/jobs"):
        reply = front.post(path, raw=wide)
        assert reply.status == 413, (path, reply.status, reply.body[:200])
        assert reply.error["code"] == "too_many_json_items"
        assert f"{MAX_JSON_ITEMS:,}" in reply.error["message"]
    ollama = front.post("/api/chat", raw=wide)
    assert ollama.status == 413 and "values and keys" in ollama.json()["error"]
    # Text full of commas is not values: a long message goes through.
    long = {"model": "chat-sim", "messages": [
        {"role": "user", "content": "a, b: c," * (MAX_JSON_ITEMS // 2)}]}
    assert front.post("/v1/chat/completions", long).status == 200


# -- 2. forms: split on their boundary, their parts counted ----------------------------------
def test_form_parts_are_split_on_the_boundary_lines_only() -> None:
    data = b"RIFF\r\n--XY not the boundary\r\n\r\nend\n"
    raw = (b"preamble\r\n" + _form(("model", b"whisper-1"), ("file", data), filename="a.wav")
           + b"epilogue")
    parts = form_parts(raw, 'multipart/form-data; boundary="XX"')
    assert parts == [("model", None, "text/plain", b"whisper-1"),
                     ("file", "a.wav", "text/plain", data)]
    assert form_parts(raw, "application/json") is None
    # a part in base64 is decoded; a part without a name is left out
    b64 = (b'--XX\r\nContent-Disposition: form-data; name="f"\r\nContent-Transfer-Encoding: '
           b'base64\r\n\r\naGVs\r\nbG8=\r\n--XX\r\nContent-Type: text/plain\r\n\r\nx\r\n--XX--')
    assert form_parts(b64, FORM) == [("f", None, "text/plain", b"hello")]


@pytest.mark.process
def test_a_form_of_thousands_of_parts_is_refused(front: Front) -> None:
    """Each part cost a millisecond of the engine's loop (the email package), on any OpenAI
    route: past MAX_FORM_PARTS the form is a 413, before a part is read."""
    many = _form(*[("f", b"v")] * (MAX_FORM_PARTS * 20))
    for path in ("/v1/chat/completions", "/v1/audio/transcriptions"):
        reply = front.post(path, raw=many, headers={"Content-Type": FORM})
        assert reply.status == 413, (path, reply.status, reply.body[:200])
        assert reply.error["code"] == "too_many_parts"
    # A file of many short lines is one part: transcribed.
    audio = b"a\r\n" * 200_000
    reply = front.post("/v1/audio/transcriptions", headers={"Content-Type": FORM}, raw=_form(
        ("model", b"whisper-1"), ("file", audio), filename="a.wav"))
    assert reply.status == 200, reply.body[:300]
    assert f"({len(audio)} bytes)" in reply.json()["text"]


# -- 3. gzip: unzipped whole, or refused -----------------------------------------------------
@pytest.mark.process
def test_a_gzip_body_cut_short_is_refused_not_forwarded(front: Front) -> None:
    """aiohttp's decoder never checked that a gzip body ended: one cut short reached the
    worker or the model server as if whole."""
    chat = json.dumps({"model": "chat-sim", "messages": CHAT}).encode()
    zipped = gzip.compress(chat)
    gz = {"Content-Encoding": "gzip"}
    for cut in (4, 8, len(zipped) // 2):  # its size, its CRC and size, half its data
        reply = front.post("/v1/chat/completions", raw=zipped[:-cut], headers=gz)
        assert reply.status == 400, (cut, reply.status, reply.body[:200])
        assert reply.error["code"] == "unreadable_body", reply.body
    echo = gzip.compress(b"0123456789abcdef" * 10_000)
    for cut in (8, len(echo) // 2):
        reply = front.post("/upstream/llama/echo", raw=echo[:-cut],
                           headers={**gz, "Content-Type": "application/octet-stream"})
        assert reply.status == 400, (cut, reply.status, reply.body[:200])
    # whole, and in two gzip members, it is read as ever
    two = gzip.compress(chat[:10]) + gzip.compress(chat[10:])
    for body in (zipped, two):
        assert front.post("/v1/chat/completions", raw=body, headers=gz).status == 200
    with pytest.raises(Exception, match="cut short"):
        gunzip(zipped[:-4], 1 << 20)


# -- 4. a model's name is cut short in what comes back ---------------------------------------
@pytest.mark.process
def test_an_unknown_models_name_is_cut_short_in_its_error(front: Front) -> None:
    name = "x" * 1_000_000
    for path, body in (("/v1/chat/completions", {"model": name, "messages": CHAT}),
                       ("/v1/embeddings", {"model": name, "input": "hi"}),
                       ("/api/chat", {"model": name, "messages": CHAT}),
                       ("/api/show", {"model": name})):
        reply = front.post(path, body)
        assert reply.status == 404, (path, reply.status)
        assert len(reply.body) < 1000 and "x" * 61 not in reply.body.decode(), (path, reply)
    for path in ("/v1/models/" + "y" * 5000, "/upstream/" + "z" * 5000 + "/x"):
        reply = front.get(path)
        assert reply.status == 404 and len(reply.body) < 1000, (path[:20], reply.body[:200])


# -- 5. stream, asked of what cannot stream --------------------------------------------------
@pytest.mark.process
def test_a_transcription_stream_is_refused_by_a_worker_and_forwarded_to_a_server(
        front: Front) -> None:
    """``stream=true`` was dropped silently for a worker (the official client then read no
    event at all); a model server gets it with the rest of the form, and its answer is
    relayed as it comes."""
    form = _form(("model", b"whisper-1"), ("stream", b"true"), ("file", b"RIFF"),
                 filename="a.wav")
    reply = front.post("/v1/audio/transcriptions", raw=form, headers={"Content-Type": FORM})
    assert reply.status == 400 and reply.error["param"] == "stream", reply.body
    assert "not supported for transcriptions" in reply.error["message"]
    off = form.replace(b"\r\n\r\ntrue\r\n", b"\r\n\r\nfalse\r\n")
    assert front.post("/v1/audio/transcriptions", raw=off,
                      headers={"Content-Type": FORM}).status == 200
    embed = front.post("/v1/embeddings", {"model": "embed-sim", "input": "hi", "stream": True})
    assert embed.status == 400 and embed.error["param"] == "stream"
    served = form.replace(b"whisper-1", b"llama")
    reply = front.post("/v1/audio/transcriptions", raw=served, headers={"Content-Type": FORM})
    assert reply.status in (200, 201) and b"RIFF" in reply.body, reply  # (the server's echo)
    job = front.engine.jobs.get(reply.headers["x-vramtui-job"])
    assert job is not None and job.stream  # (it was no stream: answered whole)
    maybe = served.replace(b"\r\n\r\ntrue\r\n", b"\r\n\r\nmaybe\r\n")
    reply = front.post("/v1/audio/transcriptions", raw=maybe, headers={"Content-Type": FORM})
    assert reply.status == 400 and reply.error["param"] == "stream"


# -- 6. a field of the wrong type: a 400 naming it, not the worker's exception ---------------
@pytest.mark.process
@pytest.mark.parametrize("path,body,field", [
    ("/v1/chat/completions", b'{"model":"chat-sim","messages":[{"role":"user","content":"x"}],'
                             b'"max_tokens":NaN}', "max_tokens"),
    ("/v1/chat/completions", {"model": "chat-sim", "messages": CHAT, "temperature": "hot"},
     "temperature"),
    ("/v1/completions", {"model": "chat-sim", "messages": [1, 2]}, "messages"),
    ("/v1/completions", {"model": "chat-sim", "messages": "hi"}, "messages"),
    ("/v1/embeddings", {"model": "embed-sim", "input": "hi", "dimensions": -1}, "dimensions"),
    ("/api/chat", {"model": "chat-sim", "messages": CHAT, "stream": False,
                   "options": {"num_predict": "x"}}, "options.num_predict"),
    ("/api/generate", {"model": "chat-sim", "prompt": "hi", "stream": False,
                       "options": {"num_predict": [1]}}, "options.num_predict"),
    ("/api/embed", {"model": "embed-sim", "input": "hi", "dimensions": -1}, "dimensions"),
    # an integer past a float's range: math.isfinite raised OverflowError, a 500
    ("/v1/chat/completions", {"model": "chat-sim", "messages": CHAT, "top_p": 10**400},
     "top_p"),
    ("/api/chat", {"model": "chat-sim", "messages": CHAT, "stream": False,
                   "options": {"temperature": 10**400}}, "options.temperature"),
    # a vector of 10**30 floats: the worker built it until it was killed, the client waiting
    ("/v1/embeddings", {"model": "embed-sim", "input": "hi", "dimensions": 10**30},
     "dimensions"),
])
def test_a_field_of_the_wrong_type_is_a_400_naming_it(front: Front, path: str, body: Any,
                                                      field: str) -> None:
    reply = front.post(path, raw=body) if isinstance(body, bytes) else front.post(path, body)
    assert reply.status == 400, (reply.status, reply.body[:300])
    message = reply.json()["error"]
    message = message if isinstance(message, str) else message["message"]
    assert message.startswith(f"{field}: ") and "Error" not in message, message


@pytest.mark.process
def test_a_refused_body_is_let_go_at_once() -> None:
    """A body over the limit is a 413, and what was read of it goes with the answer: the
    door's error middleware kept the exception, whose traceback held the read's frame and
    its buffer in a cycle that only a full collection freed (the engine grew about 70 MB a
    refused 1 GiB chunked body). With the collector off, no such exception outlives its
    request."""
    import gc
    import http.client

    from aiohttp import web

    from supervisor.http.errors import HttpError

    with serve_http([_server_backend()], max_body=256 * 1024) as front:
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=30)
                try:
                    conn.request("POST", "/v1/chat/completions",
                                 body=iter([b"x" * 65536] * 8), encode_chunked=True,
                                 headers={"Content-Type": "application/json"})
                    reply = conn.getresponse()
                    assert reply.status == 413, reply.read()[:200]
                    reply.read()
                finally:
                    conn.close()
            kept = [o for o in gc.get_objects()
                    if isinstance(o, web.HTTPRequestEntityTooLarge | HttpError)]
            assert kept == [], kept
        finally:
            gc.enable()
