"""Test worker: served through the Python API, ``dynamo_worker(fn, DynamoWorkerConfig(...))``.

Run as ``python dynamo_api.py ENDPOINT DISCOVERY_DIR``: a plain function (not decorated) is
served with the decorated ``@initialize`` and ``@unload`` of this script, on a ``raw`` endpoint
given as the combined ``NS.COMPONENT.ENDPOINT`` path, with a ``mapping`` whose dict becomes the
function's keyword arguments.
"""

from __future__ import annotations

import sys

from _helpers import mark

import worker_sdk
from worker_sdk.dynamo import DynamoWorkerConfig, dynamo_worker


@worker_sdk.initialize
def setup() -> None:
    mark("init", "init")


@worker_sdk.unload
def teardown() -> None:
    mark("unload", "unload")


def shout(text: str, suffix: str) -> bytes:
    return (text.upper() + suffix + worker_sdk.current().id).encode()


if __name__ == "__main__":
    config = DynamoWorkerConfig(
        "raw",
        None,
        endpoint=sys.argv[1],
        discovery_dir=sys.argv[2],
        mapping=lambda request: {"text": request["text"], "suffix": "!"},
    )
    dynamo_worker(shout, config)
