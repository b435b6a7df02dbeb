"""AITune user code (seed page), only the import changed: the power-user ``DynamoWorker``.

``setup`` loads the "model"; ``on_ready`` registers it with Dynamo's frontend (and notes that it
ran, with the endpoint it was given, in ``$AITUNE_TEST_NOTES``); ``serve`` is an async generator
that streams one embedding per input.
"""

import json
import os

from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

from worker_sdk.dynamo import DynamoWorker  # was: from aitune.dynamo.worker import DynamoWorker


def note(event, **fields):
    with open(os.environ["AITUNE_TEST_NOTES"], "a") as fh:
        fh.write(json.dumps({"event": event, **fields}) + "\n")


class LengthEmbedder(DynamoWorker):
    namespace = "aitune"
    component = "lengths"
    endpoint_name = "embed"

    def setup(self):
        self.scale = 0.5
        note("setup")

    async def on_ready(self, runtime, endpoint):
        await register_model(ModelInput.Text, ModelType.Embedding, endpoint, "org/lengths",
                             model_name="lengths", worker_type=WorkerType.Aggregated,
                             skip_model_assets=True)
        note("on_ready", endpoint=type(endpoint).__name__, runtime=type(runtime).__name__)

    async def serve(self, request):
        note("request")
        texts = request["input"] if isinstance(request["input"], list) else [request["input"]]
        for index, text in enumerate(texts):
            yield {"object": "list", "model": "lengths",
                   "data": [{"object": "embedding", "index": index,
                             "embedding": [len(text) * self.scale] * 3}]}


if __name__ == "__main__":
    LengthEmbedder().run(enable_nats=False)
