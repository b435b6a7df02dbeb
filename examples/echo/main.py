"""Echo worker: the smallest useful worker, showing each kind of reply.

- plain bytes in  -> the same bytes back
- a JSON object   -> a JSON ``Response`` ({"echo": <object>}, Content-Type application/json)
- ``{"stream": N}`` -> N streamed chunks ``chunk i\\n``, reporting progress as it goes
"""

import json

import worker_sdk


@worker_sdk.initialize
def setup() -> None:
    global greeting
    greeting = "echo"


@worker_sdk.predict
def predict(payload: bytes):
    try:
        request = json.loads(payload)
    except ValueError:
        return payload  # not JSON: echo the bytes as they came
    if not isinstance(request, dict):
        return payload
    if "stream" in request:
        return stream(int(request["stream"]))
    body = json.dumps({greeting: request}).encode()
    return worker_sdk.Response(body, headers={"Content-Type": "application/json"})


def stream(n: int):
    ctx = worker_sdk.current()
    for i in range(n):
        ctx.progress((i + 1) / n, f"chunk {i + 1} of {n}")
        yield f"chunk {i}\n".encode()


@worker_sdk.hardware_health
def health() -> dict:
    return {"status": "ok", "device": "cpu"}
