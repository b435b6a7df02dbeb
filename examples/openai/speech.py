"""An OpenAI-shaped text-to-speech model (``api: speech``), simulated: a tone per word, as WAV.

The reply is the audio itself (``Content-Type: audio/wav``), not JSON, as OpenAI's
``/v1/audio/speech`` answers.
"""

from __future__ import annotations

import io
import math
import struct
import wave

import _common as c

import worker_sdk

RATE = 16000


@worker_sdk.initialize
def setup() -> None:
    c.load()


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext) -> worker_sdk.Response:
    req = c.request(payload)
    words = str(req.get("input", "")).split() or ["silence"]
    frames = bytearray()
    with c.activation():
        for i, word in enumerate(words[:50]):
            c.step(ctx)
            freq = 220 + 40 * (sum(word.encode()) % 12) + i
            for n in range(RATE // 10):
                frames += struct.pack("<h", int(8000 * math.sin(2 * math.pi * freq * n / RATE)))
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(bytes(frames))
    return worker_sdk.Response(out.getvalue(), headers={"Content-Type": "audio/wav"})
