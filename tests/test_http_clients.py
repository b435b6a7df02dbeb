"""Real clients nobody here wrote, against the front door: openai, ollama, prometheus_client.

The official ``openai`` package (chat with and without streaming, completions, embeddings,
images, speech, transcriptions), the ``ollama`` package's ``ps()`` and version, and
``prometheus_client``'s own text parser over ``/metrics`` — with the counts checked against
what this module really did, not against the counters' own idea of it.
"""

from __future__ import annotations

import base64
import io
import struct
import threading
import wave
from collections.abc import Iterator

import ollama
import openai
import pytest
from http_support import Front, openai_backends, serve_http
from prometheus_client.parser import text_string_to_metric_families
from spawning import spawns
from waiting import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    with serve_http(openai_backends(), gpus="sim:4GiB") as f:
        yield f


@pytest.fixture(scope="module")
def client(front: Front) -> openai.OpenAI:
    return openai.OpenAI(base_url=front.base + "/v1", api_key="unused", max_retries=0,
                         timeout=30)


@pytest.mark.process
def test_models_lists_api_backends_and_aliases_with_their_state(client: openai.OpenAI) -> None:
    models = {m.id: m for m in client.models.list()}
    # Aliases are models too: a UI offers only what this lists.
    assert set(models) == {"chat-sim", "embed-sim", "image-sim", "tts-sim", "stt-sim",
                           "slow-chat", "gpt-4o-mini", "text-embedding-3-small", "dall-e-3",
                           "tts-1", "whisper-1"}
    assert models["chat-sim"].model_extra["aliases"] == ["gpt-4o-mini"]
    assert models["chat-sim"].model_extra["state"] in ("cold", "ready", "starting")
    assert models["gpt-4o-mini"].model_extra["backend"] == "chat-sim"
    alias = client.models.retrieve("gpt-4o-mini")
    assert alias.id == "gpt-4o-mini" and alias.model_extra["backend"] == "chat-sim"


@pytest.mark.process
def test_chat_without_and_with_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="gpt-4o-mini",
                                       messages=[{"role": "user", "content": "hi there"}])
    assert r.object == "chat.completion"
    assert r.choices[0].message.content == "Hello from a simulated model on vramtui."
    assert r.usage is not None and r.usage.prompt_tokens == 2
    pieces = []
    finish = None
    for chunk in client.chat.completions.create(
            model="chat-sim", messages=[{"role": "user", "content": "hi"}], stream=True):
        assert chunk.object == "chat.completion.chunk"
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == "Hello from a simulated model on vramtui."
    assert finish == "stop" and len(pieces) > 3


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model="chat-sim", prompt="say", max_tokens=2)
    assert r.choices[0].text == "Hello from"
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="chat-sim", prompt="say", max_tokens=3, stream=True))
    assert text == "Hello from a"


@pytest.mark.process
def test_embeddings_float_and_base64(client: openai.OpenAI) -> None:
    r = client.embeddings.create(model="text-embedding-3-small", input=["a", "b", "a"])
    vecs = [d.embedding for d in r.data]
    assert len(vecs) == 3 and len(vecs[0]) == 16
    assert vecs[0] == vecs[2] and vecs[0] != vecs[1]
    assert abs(sum(v * v for v in vecs[0]) - 1.0) < 1e-5
    f = client.embeddings.create(model="embed-sim", input="a", encoding_format="float")
    assert f.data[0].embedding == pytest.approx(vecs[0], abs=1e-6)


@pytest.mark.process
def test_images(client: openai.OpenAI) -> None:
    r = client.images.generate(model="dall-e-3", prompt="a cat", size="32x32", n=2)
    assert len(r.data) == 2
    png = base64.b64decode(r.data[0].b64_json)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (32, 32)


@pytest.mark.process
def test_speech_and_transcriptions(client: openai.OpenAI) -> None:
    audio = client.audio.speech.create(model="tts-1", voice="alloy", input="two words")
    data = audio.read()
    with wave.open(io.BytesIO(data)) as wav:
        assert wav.getframerate() == 16000 and wav.getnframes() == 3200
    t = client.audio.transcriptions.create(model="whisper-1",
                                           file=("clip.wav", data, "audio/wav"))
    assert t.text == f"simulated transcript of clip.wav ({len(data)} bytes)"


def test_openai_errors_arrive_as_the_clients_own_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-5", messages=[])
    assert "gpt-5" in str(err.value) and err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.embeddings.create(model="chat-sim", input="x")
    assert "speaks chat" in str(bad.value)
    with pytest.raises(openai.BadRequestError) as none:  # no messages: not a completion
        client.chat.completions.create(model="gpt-4o-mini", messages=[])
    assert none.value.param == "messages" and "messages" in str(none.value)


def test_a_streaming_client_that_disconnects_cancels_its_job(front: Front,
                                                             client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="slow-chat", messages=[{"role": "user", "content": "hi"}], stream=True)
    first = next(iter(stream))
    assert first.choices[0].delta.content == "Hello"
    job_id = stream.response.headers["x-vramtui-job"]
    assert front.job_state(job_id) == "running"
    stream.close()
    front.wait_state(job_id, "cancelled")
    assert "went away" in front.get(f"/v1/jobs/{job_id}").json()["error"]


def test_a_waiting_client_that_disconnects_cancels_its_job(front: Front) -> None:
    slow = openai.OpenAI(base_url=front.base + "/v1", api_key="x", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        slow.chat.completions.create(model="slow-chat",
                                     messages=[{"role": "user", "content": "hi"}])
    job = wait_until(lambda: front.get("/v1/jobs?backend=slow-chat&state=cancelled").json()["data"],
               10, "the abandoned job to be cancelled")[0]
    assert "went away" in job["error"]


def test_ollama_ps_and_version(front: Front, client: openai.OpenAI) -> None:
    client.embeddings.create(model="embed-sim", input="x")  # something loaded
    o = ollama.Client(host=front.base)
    ps = o.ps()
    names = {m.name for m in ps.models}
    assert "embed-sim:latest" in names  # (Ollama's names carry a tag)
    m = next(m for m in ps.models if m.name == "embed-sim:latest")
    snap = {b.name: b for b in front.sup.snapshot().backends}["embed-sim"]
    # (what its process was seen to hold; on the simulated GPU, its figures when nothing)
    assert m.size_vram == (snap.observed_mib or snap.reserved_mib) * 1024 * 1024
    assert m.size == snap.reserved_mib * 1024 * 1024 and m.size > 0
    assert m.expires_at is not None and m.details.family == "embeddings"
    version = front.get("/api/version").json()
    assert version == {"version": "test"}
    tags = {t["name"] for t in front.get("/api/tags").json()["models"]}
    # its alias too, as /v1/models lists it, but with Ollama's tag
    assert "chat-sim:latest" in tags and "gpt-4o-mini:latest" in tags
    assert tags == {m["id"] + ":latest" for m in front.get("/v1/models").json()["data"]}


def test_metrics_parse_with_prometheus_clients_own_parser(front: Front,
                                                          client: openai.OpenAI) -> None:
    before = _samples(front)
    done = 0
    for _ in range(3):
        client.embeddings.create(model="embed-sim", input="x")
        done += 1
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")  # not a job: not counted
    after = _samples(front)
    key = ("vramtui_jobs_total", (("backend", "embed-sim"), ("outcome", "succeeded")))
    assert after[key] - before.get(key, 0) == done
    gpu = {k: v for k, v in after.items() if k[0] == "vramtui_gpu_memory_total_bytes"}
    assert list(gpu.values()) == [4 * 1024**3]
    labels = dict(next(iter(gpu))[1])
    assert labels["gpu"] == "0" and labels["UUID"] == "SIM-0"
    assert after[("vramtui_gpu_info", (("UUID", "SIM-0"), ("gpu", "0"), ("kind", "SIMULATED"),
                                       ("modelName", labels["modelName"]),
                                       ("simulated", "true")))] == 1
    states = {dict(k[1])["state"]: v for k, v in after.items()
              if k[0] == "vramtui_backend_state" and dict(k[1])["backend"] == "embed-sim"}
    assert sum(states.values()) == 1
    assert after[("vramtui_backend_loads_total", (("backend", "embed-sim"),))] >= 1
    count = after[("vramtui_job_duration_seconds_count", (("backend", "embed-sim"),))]
    assert count == after[key] + after.get(("vramtui_jobs_total", (
        ("backend", "embed-sim"), ("outcome", "failed"))), 0)
    for name, labels_ in after:
        assert name.startswith("vramtui_")
        assert "job" not in dict(labels_) and "id" not in dict(labels_)


def test_six_concurrent_openai_clients_each_get_their_own_answer(front: Front) -> None:
    results: list[str] = []

    def one() -> None:
        c = openai.OpenAI(base_url=front.base + "/v1", api_key="x", max_retries=0, timeout=30)
        r = c.chat.completions.create(model="chat-sim",
                                      messages=[{"role": "user", "content": "hi"}])
        results.append(r.choices[0].message.content or "")

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == ["Hello from a simulated model on vramtui."] * 6


def _samples(front: Front) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = front.get("/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out



