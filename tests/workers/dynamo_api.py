"""Test worker: served through the Python API, ``dynamo_worker(fn, DynamoWorkerConfig(...))``.

Run as ``python dynamo_api.py ENDPOINT DISCOVERY_DIR``: a plain function (not decorated) is
the predict, with the decorated ``@initialize`` and ``@unload`` of this script, and a
``mapping`` that picks the request's ``text`` field.
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


def shout(payload: bytes) -> bytes:
    return payload.upper() + b"!" + worker_sdk.current().id.encode()


if __name__ == "__main__":
    config = DynamoWorkerConfig(
        endpoint=sys.argv[1],
        discovery_dir=sys.argv[2],
        mapping=lambda request: request["text"],
    )
    sys.exit(dynamo_worker(shout, config))
