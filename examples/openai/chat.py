"""An OpenAI-shaped chat model (``api: [chat, completions]``), simulated, with canned words.

Non-streaming: a ``chat.completion`` (or ``text_completion``) JSON.  With ``"stream": true``
it yields one ``chat.completion.chunk`` JSON per word, which the front door frames as
``data: …`` and ends with ``data: [DONE]``.  ``SIM_REPLY`` sets the words; a request with
``"max_tokens": N`` gets at most N of them.
"""

from __future__ import annotations

import os
import time

import _common as c

import worker_sdk

REPLY = os.environ.get("SIM_REPLY", "Hello from a simulated model on vramtui.").split()


@worker_sdk.initialize
def setup() -> None:
    c.load()


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext):
    try:
        req = c.request(payload)
    except ValueError as exc:
        return c.json_reply({"error": {"message": str(exc), "type": "invalid_request_error"}},
                            400)
    words = REPLY[: max(1, int(req.get("max_tokens") or len(REPLY)))]
    chat = "messages" in req
    if req.get("stream"):
        return stream(req, words, chat, ctx)
    with c.activation():
        for i in range(len(words)):
            c.step(ctx)
            ctx.progress((i + 1) / len(words), f"token {i + 1}/{len(words)}")
    text = " ".join(words)
    usage = {"prompt_tokens": _prompt_tokens(req), "completion_tokens": len(words),
             "total_tokens": _prompt_tokens(req) + len(words)}
    if chat:
        return c.json_reply({
            "id": c.new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
            "model": req.get("model"), "usage": usage,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}]})
    return c.json_reply({
        "id": c.new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
        "model": req.get("model"), "usage": usage,
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]})


def stream(req: dict, words: list[str], chat: bool, ctx: worker_sdk.RequestContext):
    import json

    cid, created = c.new_id("chatcmpl" if chat else "cmpl"), int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    with c.activation():
        for i, word in enumerate(words):
            c.step(ctx)
            piece = word if i == 0 else " " + word
            choice = ({"index": 0, "delta": ({"role": "assistant"} if i == 0 else {})
                       | {"content": piece}, "finish_reason": None} if chat else
                      {"index": 0, "text": piece, "finish_reason": None})
            ctx.progress((i + 1) / len(words), f"token {i + 1}/{len(words)}")
            yield json.dumps({"id": cid, "object": kind, "created": created,
                              "model": req.get("model"), "choices": [choice]}).encode()
        last = ({"index": 0, "delta": {}, "finish_reason": "stop"} if chat else
                {"index": 0, "text": "", "finish_reason": "stop"})
        yield json.dumps({"id": cid, "object": kind, "created": created,
                          "model": req.get("model"), "choices": [last]}).encode()


def _prompt_tokens(req: dict) -> int:
    if "messages" in req:
        return sum(len(str(m.get("content", "")).split()) for m in req["messages"])
    return len(str(req.get("prompt", "")).split())
