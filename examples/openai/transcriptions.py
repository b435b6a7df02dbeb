"""An OpenAI-shaped speech-to-text model (``api: transcriptions``), simulated.

The front door turns the multipart upload into JSON: the form's fields, and the file as
``{"filename", "content_type", "b64"}``.  The canned transcript says how much audio came.
"""

from __future__ import annotations

import base64

import _common as c

import worker_sdk


@worker_sdk.initialize
def setup() -> None:
    c.load()


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext) -> worker_sdk.Response:
    req = c.request(payload)
    audio = base64.b64decode(req["file"]["b64"])
    with c.activation():
        c.step(ctx)
    text = f"simulated transcript of {req['file'].get('filename') or 'audio'} ({len(audio)} bytes)"
    if req.get("response_format") == "text":
        return worker_sdk.Response(text.encode(), headers={"Content-Type": "text/plain"})
    return c.json_reply({"text": text})
