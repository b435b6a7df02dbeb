"""Ollama's shapes to and from OpenAI's, as pure functions (supervisor/http/ollama_shapes.py)."""

from __future__ import annotations

import json

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
    assert out["messages"][3]["tool_call_id"] == "look"
    assert shapes.chat_request({"messages": [], "stream": False, "options": {
        "num_predict": -1}, "format": "json"}, "m") == {
        "model": "m", "messages": [], "stream": False,
        "response_format": {"type": "json_object"}}


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
    data = {"data": [{"index": 1, "embedding": [2.0]}, {"index": 0, "embedding": [1.0]}],
            "usage": {"prompt_tokens": 2}}
    assert shapes.embed_reply(data, "m", 7)["embeddings"] == [[1.0], [2.0]]
    assert shapes.embed_reply(data, "m", 7, legacy=True) == {"embedding": [1.0]}
    assert shapes.embed_request({"input": "x"}, "m")["input"] == ["x"]
    assert shapes.embed_request({"prompt": "x"}, "m", legacy=True)["input"] == "x"


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


def test_openai_errors_become_one_message() -> None:
    assert shapes.openai_error({"error": {"message": "no"}}, 400) == "no"
    assert "status 500" in shapes.openai_error({"detail": "x"}, 500)
    assert json.loads(json.dumps(shapes.error_body("m"))) == {"error": "m"}
