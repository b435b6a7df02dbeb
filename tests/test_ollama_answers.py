"""What a model answers, through Ollama's routes, when it is not a good answer: a refusal (a
4xx in vLLM's, FastAPI's or llama-server's shape, plain text, a JSON error in two pieces), an
answer of the wrong shape, a stream that goes wrong after it began.  A real engine and door on
the simulated GPU, a real model server process (``tests/model_server.py --mode odd``, whose
answer the request's text names), the official ``ollama`` client and raw HTTP.

Each becomes one Ollama error, ``{"error": "…"}`` with the model's own words, bounded: with
the model's status (a 502 for a shape that is not OpenAI's), streamed or not; a stream that
began ends with one error line, cleanly, and its job is cancelled: the engine says so, and
the server's slot is free at once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import ollama
import pytest
from http_support import Front, serve_http
from model_server import SEPARATORS
from spawning import spawns
from test_model_servers import server_backend
from waiting import wait_until

pytestmark = [pytest.mark.timeout(90), pytest.mark.process]


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    with serve_http([server_backend("odd", 256, mode="odd")]) as f:
        yield f


@pytest.fixture(scope="module")
def client(front: Front) -> ollama.Client:
    return ollama.Client(host=front.base, timeout=30)


def ask(what: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": what}]


def _chat(client: ollama.Client, what: str, stream: bool) -> object:
    answer = client.chat(model="odd", messages=ask(what), stream=stream)
    return list(answer) if stream else answer


@pytest.mark.parametrize("what,status,said", [
    ("vllm400", 400, "This model's maximum context length is 4096 tokens"),
    ("text400", 400, "Bad Request: context too long"),
    ("detail422", 422, "body.messages: field required"),
    ("split400", 400, "the request exceeds the available context size"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_refusal_is_an_ollama_error_with_its_status_streamed_or_not(
        client: ollama.Client, what: str, status: int, said: str, stream: bool) -> None:
    """Streamed, a refusal was an empty, successful answer (one ``done`` line); whole, one in
    plain text was a 502 "not JSON", one in vLLM's shape its JSON quoted whole."""
    with pytest.raises(ollama.ResponseError) as err:
        _chat(client, what, stream)
    assert err.value.status_code == status, err.value
    assert err.value.error == f"the model answered status {status}: {said}"


def test_a_long_refusal_is_told_in_one_bounded_line(front: Front) -> None:
    for stream in (False, True):
        reply = front.post("/api/chat", {"model": "odd", "messages": ask("long400"),
                                         "stream": stream})
        assert reply.status == 400 and reply.headers["content-type"].startswith(
            "application/json"), reply
        error = reply.json()["error"]
        assert error.startswith("the model answered status 400: too long too long")
        assert len(error) < 500 and "\n" not in error


def test_a_json_error_in_pieces_after_a_200_is_put_together(front: Front) -> None:
    """A server's 200 whose body is a JSON error written in two pieces: each piece was read
    alone, neither was JSON, and the stream ended as a successful empty answer."""
    reply = front.post("/api/chat", {"model": "odd", "messages": ask("split200")})
    assert reply.status == 200
    lines = [json.loads(line) for line in reply.body.splitlines()]
    assert lines == [{"error": "the model answered an error: the request exceeds the "
                               "available context size"}], lines


@pytest.mark.parametrize("answer,problem", [
    ("choices5", "choices is 5, not a list"),
    ("fnnull", "choices[0].message.tool_calls[0].function is null, not an object"),
    ("toolcalls5", "choices[0].message.tool_calls is 5, not a list"),
])
def test_an_answer_of_the_wrong_shape_is_a_502_that_says_what_came(
        client: ollama.Client, answer: str, problem: str) -> None:
    """Each was a 500 with a Python exception's words (``KeyError: 0``, ``'int' object is not
    iterable``)."""
    for call in (lambda: client.chat(model="odd", messages=ask(answer), stream=False),
                 lambda: client.generate(model="odd", prompt=answer, stream=False)):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 502 and err.value.error == (
            f"the model's answer is not an OpenAI chat answer: {problem}")


def test_a_stream_of_the_wrong_shape_is_one_error_line(front: Front) -> None:
    """It was a 500 response, head and all, written inside the 200's body."""
    reply = front.post("/api/chat", {"model": "odd", "messages": ask("choices5")})
    assert reply.status == 200
    assert [json.loads(line) for line in reply.body.splitlines()] == [{
        "error": "the model's answer is not an OpenAI chat answer: choices is 5, not a list"}]


def test_embeddings_of_the_wrong_shape_are_a_502(client: ollama.Client) -> None:
    for call in (lambda: client.embed(model="odd", input="data5"),
                 lambda: client.embeddings(model="odd", prompt="data5")):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 502 and err.value.error == (
            "the model's answer is not an OpenAI embeddings answer: data is 5, not a list")


def _busy_slots(front: Front) -> int:
    slots = front.get("/upstream/odd/slots").json()
    return sum(1 for s in slots if s["is_processing"])


@pytest.mark.parametrize("what,error", [
    ("bad-then-more", "the model's answer is not an OpenAI chat answer: choices is 5, "
                      "not a list"),
    ("error-then-more", "the model answered an error: out of memory"),
])
def test_a_stream_that_goes_wrong_ends_with_one_error_line_and_its_job_is_cancelled(
        front: Front, what: str, error: str) -> None:
    """The server goes on generating after its bad chunk. A bad shape gave a 500 response
    head written inside the 200's body, and the stream stayed open; a server's error event
    gave its error line and then waited for the server's end: both left the job running,
    generating for nobody, its slot held."""
    conn = front.conn(timeout=10)
    try:
        conn.request("POST", "/api/chat", body=json.dumps({"model": "odd",
                                                           "messages": ask(what)}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "application/x-ndjson"
        job_id = resp.getheader("X-Vramtui-Job")
        body = resp.read()  # the stream ends by itself, whole (no IncompleteRead)
    finally:
        conn.close()
    lines = [json.loads(line) for line in body.splitlines()]
    assert lines[0]["message"]["content"] == "a" and lines[0]["done"] is False
    assert lines[1:] == [{"error": error}], lines
    # The engine's own view: the job was cancelled (its server told to stop), not left
    # running; and the server itself says no slot generates any more.
    front.wait_state(job_id, "cancelled", timeout=10)
    assert error in front.get(f"/v1/jobs/{job_id}").json()["error"]
    wait_until(lambda: _busy_slots(front) == 0, 10, "the server's slot to be free")
    odd = {b.name: b for b in front.sup.snapshot().backends}["odd"]
    assert odd.running == 0, odd
    ok = front.post("/api/chat", {"model": "odd", "messages": ask("hi"), "stream": False})
    assert ok.status == 200 and ok.json()["message"]["content"], ok


def test_tokens_that_unicode_counts_as_line_breaks_stay_inside_their_line(
        client: ollama.Client, front: Front) -> None:
    """A token with U+2028, U+2029 or U+0085 (llama-server writes them raw): the NDJSON line
    that carried it was cut in two by the ``ollama`` client, which splits lines as httpx's
    ``iter_lines`` does, and its stream failed (``JSONDecodeError``). They go escaped now."""
    parts = _chat(client, "separators", True)
    assert isinstance(parts, list)
    assert "".join(p.message.content or "" for p in parts) == "".join(SEPARATORS)
    raw = front.post("/api/chat", {"model": "odd", "messages": ask("separators")}).body
    lines = raw.decode().splitlines()  # (every break Unicode knows)
    assert len(lines) == len(SEPARATORS) + 1 and all(json.loads(line) for line in lines)
