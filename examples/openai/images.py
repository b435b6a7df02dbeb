"""An OpenAI-shaped image model (``api: images``), simulated: a small PNG drawn from the prompt.

Answers ``{"created", "data": [{"b64_json": …, "revised_prompt": …}]}`` with ``n`` images of
``size`` (at most 256x256 here: the pixels are a gradient coloured by the prompt's hash).
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
import zlib

import _common as c

import worker_sdk


@worker_sdk.initialize
def setup() -> None:
    c.load()


def png(width: int, height: int, seed: bytes) -> bytes:
    r, g, b = seed[0], seed[1], seed[2]
    rows = bytearray()
    for y in range(height):
        rows.append(0)
        for x in range(width):
            rows += bytes(((r + x) % 256, (g + y) % 256, (b + x + y) % 256))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(bytes(rows))) + chunk(b"IEND", b""))


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext) -> worker_sdk.Response:
    req = c.request(payload)
    prompt = str(req.get("prompt", ""))
    width, _, height = str(req.get("size") or "64x64").partition("x")
    w, h = min(256, int(width or 64)), min(256, int(height or 64))
    images = []
    with c.activation():
        for i in range(int(req.get("n") or 1)):
            c.step(ctx)
            seed = hashlib.sha256(f"{i}:{prompt}".encode()).digest()
            images.append({"b64_json": base64.b64encode(png(w, h, seed)).decode(),
                           "revised_prompt": prompt})
    return c.json_reply({"created": int(time.time()), "data": images})
