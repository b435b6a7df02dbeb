"""An OpenAI-shaped embedding model (``api: embeddings``), simulated: vectors from a hash.

Each input string gets a deterministic unit vector of ``SIM_DIMENSIONS`` floats (or the
request's ``dimensions``), so equal texts embed equally.  ``encoding_format: base64`` (what
the official client asks for by default) answers little-endian float32 bytes in base64.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import struct

import _common as c

import worker_sdk

DIMENSIONS = int(os.environ.get("SIM_DIMENSIONS", "16"))


@worker_sdk.initialize
def setup() -> None:
    c.load()


def vector(text: str, n: int) -> list[float]:
    raw = b""
    counter = 0
    while len(raw) < 4 * n:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    values = [v / 2**31 - 1.0 for v in struct.unpack(f"<{n}I", raw[: 4 * n])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext) -> worker_sdk.Response:
    req = c.request(payload)
    inputs = req.get("input", "")
    texts = [inputs] if isinstance(inputs, str) else [str(x) for x in inputs]
    n = int(req.get("dimensions") or DIMENSIONS)
    data = []
    with c.activation():
        for i, text in enumerate(texts):
            c.step(ctx)
            vec = vector(text, n)
            emb = (base64.b64encode(struct.pack(f"<{n}f", *vec)).decode()
                   if req.get("encoding_format") == "base64" else vec)
            data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = sum(len(t.split()) for t in texts)
    return c.json_reply({"object": "list", "data": data, "model": req.get("model"),
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
