"""A toy worker for each Dynamo endpoint type: no model, no GPU, deterministic answers.

The same script runs under ``python -m worker_sdk`` (a vramtui engine) and, here, as a Dynamo
endpoint; the ``--type`` decides what a request looks like (see worker_sdk/dynamo/shapes.py)::

    python -m worker_sdk.dynamo examples/dynamo/main.py --discovery-dir /tmp/dyn \\
        --endpoint demo.toy.generate --type embedding --model-name toy-embedder

What ``predict`` receives and returns (``payload`` is the request's JSON text on a typed
endpoint):

- ``embedding``: ``{"input": "text" or [...], "dimensions": 8}`` -> one unit vector per input,
  derived from a hash of the text (a JSON ``Response``: a list of vectors);
- ``image``: ``{"prompt": "...", "size": "16x16", "n": 1}`` -> PNG images of one colour derived
  from the prompt; with ``n`` > 1 they are streamed, one image per chunk;
- ``video``: ``{"prompt": "...", "seconds": 1}`` -> placeholder bytes (not a playable MP4),
  reporting progress per "frame";
- ``raw``: ``{"ticks": N, "interval": S}`` -> a stream of N ``tick i`` chunks, S seconds apart,
  that stops as soon as the request is cancelled; anything else is echoed back.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import sys
import zlib

import worker_sdk

state: dict[str, object] = {}


@worker_sdk.initialize
def setup() -> None:
    state["salt"] = b"toy"
    print("toy worker initialised", file=sys.stderr, flush=True)


def _vector(text: str, dimensions: int) -> list[float]:
    digest = hashlib.sha256(state["salt"] + text.encode()).digest()  # type: ignore[operator]
    raw = [(digest[i % len(digest)] - 127.5) / 127.5 for i in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


def _png(width: int, height: int, rgb: bytes) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + rgb * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _images(prompt: str, width: int, height: int, n: int):
    for i in range(n):
        worker_sdk.current().check_cancelled()
        yield _png(width, height, hashlib.sha256(f"{prompt}#{i}".encode()).digest()[:3])


def _ticks(count: int, interval: float):
    ctx = worker_sdk.current()
    for i in range(count):
        if i and ctx.wait_cancelled(interval):
            print(f"request {ctx.id} cancelled after {i} ticks", file=sys.stderr, flush=True)
            ctx.check_cancelled()
        yield f"tick {i}\n".encode()


@worker_sdk.predict
def predict(payload: bytes):
    try:
        request = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(request, dict):
        return payload
    if "input" in request:  # an embedding request
        texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
        dims = int(request.get("dimensions") or 8)
        body = json.dumps([_vector(str(t), dims) for t in texts]).encode()
        return worker_sdk.Response(body, headers={"Content-Type": "application/json"})
    if "seconds" in request:  # a video request
        ctx = worker_sdk.current()
        frames = max(1, int(float(request["seconds"]) * 4))
        for i in range(frames):
            ctx.check_cancelled()
            ctx.progress((i + 1) / frames, f"frame {i + 1} of {frames}")
        return b"\x00\x00\x00\x18ftypisom" + request["prompt"].encode()
    if "prompt" in request:  # an image request
        width, _, height = str(request.get("size") or "16x16").partition("x")
        n = int(request.get("n") or 1)
        images = _images(request["prompt"], int(width), int(height or width), n)
        return images if n > 1 else next(images)
    if "ticks" in request:
        return _ticks(int(request["ticks"]), float(request.get("interval", 0.05)))
    return payload


@worker_sdk.hardware_health
def health() -> dict:
    return {"status": "ok", "device": "cpu"}


@worker_sdk.unload
def unload() -> None:
    state.clear()
    print("toy worker unloaded", file=sys.stderr, flush=True)
