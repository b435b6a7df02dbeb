"""A worker that misbehaves on request (JSON in), for the attack tests and bench/hostile.py.

- ``{"status": N}``            -> a reply with status code N (any integer, even 2**64-1)
- ``{"data": N}``              -> N bytes in one reply
- ``{"stream": N, "chunk": C}`` -> N bytes streamed in chunks of C bytes
- ``{"flood": N}``             -> N bytes written to stderr, then a short reply
- ``{"body": S, "headers": H}`` -> the text S with the headers H (and ``"status"`` if given),
  as a worker that wants its result served as a web page would answer
- anything else                -> ``ok``
"""

import json
import sys

import worker_sdk


@worker_sdk.predict
def predict(payload: bytes):
    try:
        request = json.loads(payload)
    except ValueError:
        return b"ok"
    if not isinstance(request, dict):
        return b"ok"
    if "body" in request:
        return worker_sdk.Response(str(request["body"]).encode(),
                                   headers=dict(request.get("headers") or {}),
                                   status_code=int(request.get("status", 200)))
    if "status" in request:
        return worker_sdk.Response(b"odd status", status_code=int(request["status"]))
    if "data" in request:
        return b"d" * int(request["data"])
    if "stream" in request:
        return _stream(int(request["stream"]), int(request.get("chunk", 65536)))
    if "flood" in request:
        line = b"x" * 1023 + b"\n"
        left = int(request["flood"])
        while left > 0:
            sys.stderr.buffer.write(line[: min(left, len(line))])
            left -= len(line)
        sys.stderr.buffer.flush()
        return b"flooded"
    return b"ok"


def _stream(total: int, chunk: int):
    block = b"s" * chunk
    while total > 0:
        yield block[: min(total, chunk)]
        total -= chunk
