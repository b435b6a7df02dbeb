"""AITune user code (seed page), only the import changed: a positional config, no mapping.

``DynamoWorkerConfig("embedding", "org/positional")`` takes AITune's defaults (namespace
``aitune``, component ``backend``, endpoint ``generate``); with ``mapping=None`` the function
gets the request object itself and reads ``request.input`` and ``request.dimensions``.
"""

import numpy as np

from worker_sdk.dynamo import DynamoWorkerConfig, dynamo_worker  # was: aitune.dynamo.worker


def embed(request):
    texts = request.input if isinstance(request.input, list) else [request.input]
    width = request.dimensions or 4
    return np.array([[float(len(text))] * width for text in texts])


if __name__ == "__main__":
    dynamo_worker(embed, DynamoWorkerConfig("embedding", "org/positional"))
