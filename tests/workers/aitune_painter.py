"""AITune user code (seed page), only the import changed: an image model.

The ``mapping`` reads the typed image request's ``.prompt`` and ``.size``; the function returns
PNG bytes, which the worker packs as ``{"created", "data": [{"b64_json"}]}``.
"""

import hashlib
import struct
import zlib

from worker_sdk.dynamo import DynamoWorkerConfig, dynamo_worker  # was: aitune.dynamo.worker


def paint(prompt, width, height):
    rgb = hashlib.sha256(prompt.encode()).digest()[:3]
    rows = b"".join(b"\x00" + rgb * width for _ in range(height))

    def chunk(tag, data):
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def to_kwargs(request):
    width, _, height = (request.size or "8x8").partition("x")
    return {"prompt": request.prompt, "width": int(width), "height": int(height)}


if __name__ == "__main__":
    dynamo_worker(paint, DynamoWorkerConfig(type="image", model_path="org/toy-painter",
                                            mapping=to_kwargs, component="painter"))
