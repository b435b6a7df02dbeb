"""Ollama's shapes to and from OpenAI's, as pure functions (supervisor/http/ollama_shapes.py)."""

from __future__ import annotations

import json
import math

import pytest

from supervisor.http import ollama_shapes as shapes


def test_chat_request_maps_options_format_images_and_tools() -> None:
    body = {"model": "m", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is this?", "images": ["iVBORw0KGgo="]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "look", "arguments": {"q": 1}}}]},
        {"role": "tool", "content": "42", "tool_name": "look"}],
        "options": {"temperature": 0.1, "num_predict": 5, "top_k": 7, "num_ctx": 4096},
        "format": {"type": "object"}, "tools": [{"type": "function", "function": {}}]}
    out = shapes.chat_request(body, "m")
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert out["temperature"] == 0.1 and out["max_tokens"] == 5 and out["top_k"] == 7
    assert "num_ctx" not in out  # the server's context is its command's business
    assert out["response_format"]["json_schema"]["schema"] == {"type": "object"}
    user = out["messages"][1]["content"]
    assert user[0] == {"type": "text", "text": "what is this?"}
    assert user[1]["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="
    call = out["messages"][2]["tool_calls"][0]
    assert call["function"] == {"name": "look", "arguments": '{"q": 1}'}
    assert out["messages"][3]["tool_call_id"] == call["id"] == "call00001"  # paired
    assert shapes.chat_request({"messages": [], "stream": False, "options": {
        "num_predict": -1}, "format": "json"}, "m") == {
        "model": "m", "messages": [], "stream": False,
        "response_format": {"type": "json_object"}}


def test_tool_results_are_paired_with_the_calls_they_answer() -> None:
    """Each result's ``tool_call_id`` is the id of the call it answers (a call's id was
    ``call_<its index in its message>``, a result's its tool's name: never the same, which
    servers that check the pairing refuse): by the tool's name, in order; by the id a client
    gave; or the first call left unanswered."""
    def calls(*names: str) -> dict:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": n, "arguments": {}}} for n in names]}

    messages = [calls("weather", "time"),
                {"role": "tool", "content": "12:00", "tool_name": "time"},
                {"role": "tool", "content": "sunny", "tool_name": "weather"},
                calls("weather", "weather"),
                {"role": "tool", "content": "rain"},
                {"role": "tool", "content": "snow", "tool_name": "weather"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "abcDEF123", "function": {"name": "time", "arguments": {}}}]},
                {"role": "tool", "content": "13:00", "tool_call_id": "abcDEF123"}]
    out = shapes.chat_request({"messages": messages}, "m")["messages"]
    made = [c["id"] for m in out for c in m.get("tool_calls", [])]
    assert made == ["call00001", "call00002", "call00003", "call00004", "abcDEF123"]
    answered = [m["tool_call_id"] for m in out if m["role"] == "tool"]
    assert answered == ["call00002", "call00001", "call00003", "call00004", "abcDEF123"]
    assert all(len(i) == 9 and i.isalnum() for i in made)  # (as Mistral's templates want)


def test_think_reaches_the_chat_template() -> None:
    """Ollama's ``think`` was dropped: a thinking model (Qwen3) thought when told not to."""
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    off = shapes.chat_request({**chat, "think": False}, "m")
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    high = shapes.generate_request({"prompt": "hi", "think": "high"}, "m", "chat")
    assert high["chat_template_kwargs"] == {"enable_thinking": True}
    assert high["reasoning_effort"] == "high"
    assert "chat_template_kwargs" not in shapes.chat_request(chat, "m")  # not said: the model's
    assert "chat_template_kwargs" not in shapes.generate_request(
        {"prompt": "hi", "think": True}, "m", "completions")  # (a prompt as it is)
    with pytest.raises(shapes.ShapeError, match="think"):
        shapes.chat_request({**chat, "think": "max"}, "m")


@pytest.mark.parametrize(("said", "seconds"), [
    (0, 0.0), ("0", 0.0), ("0s", 0.0), ("0ms", 0.0), ("0h", 0.0), ("0m0s", 0.0), ("5m", 300.0),
    ("1h30m", 5400.0), (".5s", 0.5), ("90", 90.0), (3.0, 3.0), (-1, math.inf),
    ("-1m", math.inf), (None, None), ("", None), (10 ** 400, math.inf), (1e300, math.inf)])
def test_keep_alive_is_read_as_ollama_reads_it(said: object, seconds: float | None) -> None:
    """Only 0, "0", "0s" and "0m" unloaded; "0ms" or "0h" kept the model loaded."""
    assert shapes.keep_alive_s({"keep_alive": said}) == seconds


@pytest.mark.parametrize("said", [False, True, "soon", "5 m", [1], {"s": 1}, "1" * 80,
                                  "\u0660", "\u0661s", float("nan")])
def test_a_keep_alive_ollama_refuses_is_refused(said: object) -> None:
    with pytest.raises(shapes.ShapeError, match="keep_alive"):
        shapes.keep_alive_s({"keep_alive": said})


def test_whole_number_options_sent_as_floats_are_taken() -> None:
    """Ollama casts ``"num_predict": 100.0`` (JavaScript clients send such numbers); it was
    a 400 here."""
    out = shapes.chat_request({"messages": [], "options": {
        "num_predict": 100.0, "seed": 42.0, "top_k": 5.0, "temperature": 0.5}}, "m")
    assert (out["max_tokens"], out["seed"], out["top_k"], out["temperature"]) == (
        100, 42, 5, 0.5)
    assert all(type(out[k]) is int for k in ("max_tokens", "seed", "top_k"))


def test_generate_is_a_chat_or_a_completion() -> None:
    body = {"prompt": "hi", "system": "sys", "suffix": "end", "stream": False}
    chat = shapes.generate_request(body, "m", "chat")
    assert chat["messages"] == [{"role": "system", "content": "sys"},
                                {"role": "user", "content": "hi"}]
    done = shapes.generate_request(body, "m", "completions")
    assert done["prompt"] == "hi" and done["suffix"] == "end" and "messages" not in done


@pytest.mark.parametrize("body", [
    {"messages": "hi"}, {"messages": [{"content": "no role"}]},
    {"messages": [{"role": "user", "content": 5}]}, {"messages": [], "options": [1]},
    {"messages": [], "format": "yaml"},
])
def test_bad_requests_say_what_to_send(body: dict) -> None:
    with pytest.raises(shapes.ShapeError):
        shapes.chat_request(body, "m")


def test_a_streamed_answer_with_usage_reasoning_and_tool_calls() -> None:
    reply = shapes.Reply("chat", "m")
    lines = []
    for chunk in (
        {"choices": [{"delta": {"role": "assistant", "reasoning_content": "hmm"}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
            "name": "look", "arguments": '{"q"'}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {
            "arguments": ': 1}'}}]}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}},
    ):
        lines += reply.chunk(chunk)
    lines += reply.done(1000)
    assert lines[0]["message"] == {"role": "assistant", "content": "", "thinking": "hmm"}
    assert lines[1]["message"]["content"] == "Hi" and not lines[1]["done"]
    assert lines[2]["message"]["tool_calls"] == [{"function": {"name": "look",
                                                               "arguments": {"q": 1}}}]
    last = lines[-1]
    assert last["done"] and last["done_reason"] == "stop" and last["total_duration"] == 1000
    assert (last["prompt_eval_count"], last["eval_count"]) == (3, 9)


def test_a_whole_completion_answer_and_a_length_stop() -> None:
    reply = shapes.Reply("generate", "m", "completions")
    out = reply.whole({"choices": [{"text": "abc", "finish_reason": "length"}]}, 5)
    assert out["response"] == "abc" and out["done_reason"] == "length" and out["done"]


def test_embeddings_in_their_order() -> None:
    data = {"data": [{"index": 1, "embedding": [0.0, 2.0]},
                     {"index": 0, "embedding": [1.0, 0.0]}], "usage": {"prompt_tokens": 2}}
    assert shapes.embed_reply(data, "m", 7)["embeddings"] == [[1.0, 0.0], [0.0, 1.0]]
    assert shapes.embed_reply(data, "m", 7, legacy=True) == {"embedding": [1.0, 0.0]}
    assert shapes.embed_request({"input": "x"}, "m")["input"] == ["x"]
    assert shapes.embed_request({"prompt": "x"}, "m", legacy=True)["input"] == "x"


def test_embed_vectors_are_cut_and_of_length_one_as_ollamas() -> None:
    """Ollama's ``/api/embed`` answers unit vectors, cut to ``dimensions`` first (a client
    that takes dot products for cosines got the model's raw lengths; ``dimensions`` went to
    a server that may not cut); the legacy route gives the model's vector as it is."""
    data = {"data": [{"index": 0, "embedding": [3.0, 4.0, 12.0]}, {"index": 1,
                                                                  "embedding": [0.0, 0.0]}]}
    assert shapes.embed_reply(data, "m", 1)["embeddings"] == [
        [3 / 13, 4 / 13, 12 / 13], [0.0, 0.0]]
    assert shapes.embed_reply(data, "m", 1, dimensions=2)["embeddings"][0] == [0.6, 0.8]
    assert shapes.embed_reply(data, "m", 1, legacy=True) == {"embedding": [3.0, 4.0, 12.0]}
    body = {"input": "x", "dimensions": 2}
    assert "dimensions" not in shapes.embed_request(body, "m")
    assert shapes.embed_dimensions(body) == 2
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(shapes.ShapeError, match="dimensions"):
            shapes.embed_request({"input": "x", "dimensions": bad}, "m")
    # nothing to embed: a load (answered with no vectors)
    for empty in ({"input": ""}, {"input": []}):
        assert shapes.embed_request(empty, "m") is None
    assert shapes.embed_request({}, "m", legacy=True) is None


def test_chunk_reader_takes_worker_json_and_server_sse_cut_anywhere() -> None:
    worker = shapes.ChunkReader()
    assert worker.feed(b'{"a": 1}') == [{"a": 1}] and worker.feed(b"junk") == []
    sse = b'data: {"n": 1}\n\ndata: {"n": 2}\n\n: comment\n\ndata: [DONE]\n\n'
    for cut in range(1, len(sse)):
        reader = shapes.ChunkReader()
        got = reader.feed(sse[:cut]) + reader.feed(sse[cut:])
        assert got == [{"n": 1}, {"n": 2}] and reader.ended, cut
    endless = shapes.ChunkReader()
    endless.feed(b"data: ")
    for _ in range(3):
        endless.feed(b"x" * shapes.MAX_PENDING_BYTES)
    assert len(endless.buffer) <= shapes.MAX_PENDING_BYTES  # bounded


def test_a_servers_json_cut_anywhere_is_put_together_and_bounded() -> None:
    """A model server's JSON body (its error, say) in pieces: each piece was parsed alone,
    none was JSON, and the error was dropped."""
    body = b'{"error": {"code": 400, "message": "too long"}}'
    for cut in range(1, len(body)):
        reader = shapes.ChunkReader(server=True)
        assert reader.feed(body[:cut]) == [] and reader.feed(body[cut:]) == [
            json.loads(body)], cut
    endless = shapes.ChunkReader(server=True)
    endless.feed(b'{"a": "')
    for _ in range(3):
        assert endless.feed(b"x" * shapes.MAX_PENDING_BYTES) == []
        assert len(endless.buffer) <= shapes.MAX_PENDING_BYTES  # bounded
    worker = shapes.ChunkReader()  # a worker's chunk is whole: junk is not kept for the next
    assert worker.feed(b'{"a": ') == [] and worker.feed(b'{"b": 2}') == [{"b": 2}]


@pytest.mark.parametrize("data,said", [
    ({"error": {"message": "no"}}, "no"),
    ({"error": "plain"}, "plain"),
    ({"error": {"code": 5}}, '{"code": 5}'),
    ({"object": "error", "message": "vLLM's", "code": 400}, "vLLM's"),
    ({"detail": "FastAPI's"}, "FastAPI's"),
    ({"detail": [{"loc": ["body", "model"], "msg": "field required"}, {"msg": "x"}]},
     "body.model: field required; x"),
    ({"error": "two\nlines\x1b[2J"}, "two lines\\x1b[2J"),
    ({"choices": []}, None), ({"data": [], "detail": "x"}, None), ([1], None), (5, None),
])
def test_a_models_error_in_every_shape_is_one_line(data: object, said: str | None) -> None:
    assert shapes.server_error(data) == said


def test_an_answer_that_is_not_2xx_says_the_models_words_bounded() -> None:
    assert shapes.answer_error(b'{"object": "error", "message": "too long"}', 400) == \
        "the model answered status 400: too long"
    assert shapes.answer_error(b"Bad Request\r\n", 400) == \
        "the model answered status 400: Bad Request"
    assert shapes.answer_error(b"", 404) == "the model answered status 404: (no body)"
    long = shapes.answer_error(b"x " * 1_000_000, 413)
    assert len(long) < shapes.MAX_ERROR_CHARS + 40 and long.endswith("…")
    assert shapes.error_body("m") == {"error": "m"}


@pytest.mark.parametrize("data,streamed,problem", [
    ({"choices": {"a": 1}}, False, 'choices is {"a": 1}, not a list'),
    ({}, False, "it has no choices"),
    ([], True, "it is [], not an object"),
    ({"choices": [5]}, True, "choices[0] is 5, not an object"),
    ({"choices": [{"message": "hi"}]}, False, 'choices[0].message is "hi", not an object'),
    ({"choices": [{"delta": {"content": 5}}]}, True, "choices[0].delta.content is 5, not text"),
    ({"choices": [{"message": {"tool_calls": [{"function": None}]}}]}, False,
     "choices[0].message.tool_calls[0].function is null, not an object"),
    ({"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}, True,
     'choices[0].delta.tool_calls[0].index is "0", not a number'),
    ({"choices": [{"message": {"tool_calls": [{"function": {"name": ["x" * 99]}}]}}]}, False,
     'choices[0].message.tool_calls[0].function.name is ["' + "x" * 58 + "…, not text"),
])
def test_an_answer_of_the_wrong_shape_says_what_came(data: object, streamed: bool,
                                                     problem: str) -> None:
    reply = shapes.Reply("chat", "m")
    with pytest.raises(shapes.BadAnswer) as err:
        reply.chunk(data) if streamed else reply.whole(data, 1)
    assert str(err.value) == f"the model's answer is not an OpenAI chat answer: {problem}"


def test_what_is_open_in_an_answer_stays_open() -> None:
    """A stream's usage chunk without choices, nulls where a value may be absent, a stream's
    tool call without its function yet: read, not refused."""
    reply = shapes.Reply("chat", "m")
    assert reply.chunk({"usage": {"completion_tokens": 2}}) == []
    assert reply.chunk({"choices": [{"delta": {"content": None, "tool_calls": [
        {"index": 0, "function": None}]}, "finish_reason": None}]}) == []
    out = reply.whole({"choices": [{"message": {"content": None, "tool_calls": None}}]}, 1)
    assert out["message"] == {"role": "assistant", "content": ""}
    with pytest.raises(shapes.BadAnswer, match="data\\[0\\].embedding is \\[true\\], not a list"):
        shapes.embed_reply({"data": [{"embedding": [True]}]}, "m", 1)
