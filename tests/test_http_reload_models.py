"""A reload changes the model names every HTTP route knows: the OpenAI and Ollama lists, what
a request may name (a backend added, an alias given, a backend removed), at once and without
a restart. The door kept the names it read at its start: after a reload that removed a
backend, ``/v1/models`` and ``/api/tags`` answered 500 (``KeyError``) until a restart, a new
alias and a new backend were 404s (found by a helper attacking the model-server path)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from http_support import openai_backends, serve_http

pytestmark = [pytest.mark.timeout(90), pytest.mark.process]


def _ids(front: object) -> set[str]:
    reply = front.get("/v1/models")  # type: ignore[attr-defined]
    assert reply.status == 200, reply
    return {m["id"] for m in reply.json()["data"]}


def test_a_reload_changes_the_model_names_every_route_knows() -> None:
    backends = [b for b in openai_backends() if b["name"] in ("chat-sim", "embed-sim")]
    with serve_http(backends) as front:
        assert _ids(front) == {"chat-sim", "gpt-4o-mini", "embed-sim", "text-embedding-3-small"}
        chat = next(b for b in backends if b["name"] == "chat-sim")
        renamed = {**chat, "aliases": ["gpt-4o-mini", "gpt-x"]}
        added = {**chat, "name": "chat-two", "aliases": []}
        Path(front.env["VRAMTUI_TEST_BACKENDS"]).write_text(
            yaml.safe_dump({"backends": [renamed, added]}))  # embed-sim: gone
        reloaded = front.post("/v1/backends/reload")
        assert reloaded.status == 200, reloaded
        assert reloaded.json()["removed"] == ["embed-sim"], reloaded.json()
        assert _ids(front) == {"chat-sim", "gpt-4o-mini", "gpt-x", "chat-two"}
        tags = front.get("/api/tags")
        assert tags.status == 200, tags
        assert {m["name"] for m in tags.json()["models"]} >= {"gpt-x:latest",
                                                              "chat-two:latest"}, tags.json()
        messages = [{"role": "user", "content": "hi"}]
        for model in ("gpt-x", "chat-two"):
            reply = front.post("/v1/chat/completions", {"model": model, "messages": messages})
            assert reply.status == 200, (model, reply)
        gone = front.post("/v1/embeddings", {"model": "embed-sim", "input": "x"})
        assert gone.status == 404 and "embed-sim" in gone.error["message"], gone
        assert front.get("/v1/models/gpt-x").json()["backend"] == "chat-sim"
