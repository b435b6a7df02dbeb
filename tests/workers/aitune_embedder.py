"""AITune user code (seed page ``aitune.dynamo.worker``), with only the import changed.

An embedding model served with a keyword ``DynamoWorkerConfig`` and a ``mapping`` that reads the
typed request's ``.input`` and returns the model's keyword arguments.  The "model" derives each
vector from a hash of its text, so a test can tell which vector belongs to which input.
Discovery and transport come from Dynamo's environment (``DYN_DISCOVERY_BACKEND``, ...).
"""

import hashlib

import numpy as np

from worker_sdk.dynamo import DynamoWorkerConfig, dynamo_worker  # was: aitune.dynamo.worker


def embed(sentences, dimensions):
    rows = []
    for text in sentences:
        digest = hashlib.sha256(text.encode()).digest()
        rows.append(np.frombuffer(digest[:dimensions], dtype=np.uint8).astype(np.float32))
    return np.stack(rows) / 255.0


def to_kwargs(request):
    if request.user == "broken-mapping":  # a mapping with a bug: not a dict
        return [request.input]
    sentences = request.input if isinstance(request.input, list) else [request.input]
    return {"sentences": sentences, "dimensions": request.dimensions or 16}


config = DynamoWorkerConfig(
    type="embedding",
    model_path="org/toy-embedder",
    mapping=to_kwargs,
    namespace="aitune",
    component="embedder",
    model_name="toy-embedder",
)

if __name__ == "__main__":
    dynamo_worker(embed, config)
