"""Test helper (not a worker): Dynamo's own OpenAI HTTP frontend, from ai-dynamo-runtime.

Run as ``python dynamo_frontend.py PORT DISCOVERY_DIR``: the frontend discovers the models that
workers register in DISCOVERY_DIR (file discovery, TCP request plane) and serves
``/v1/models``, ``/v1/embeddings``, ``/v1/images/generations``, ``/v1/videos`` on 127.0.0.1
until SIGTERM.  This is what ``python -m dynamo.frontend`` (the ``ai-dynamo`` package) does.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from worker_sdk.dynamo import apply_discovery_dir


async def main(port: int) -> None:
    from dynamo.llm import EngineType, EntrypointArgs, make_engine, run_input
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "file", "tcp")
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, runtime.shutdown)
    args = EntrypointArgs(EngineType.Dynamic, http_host="127.0.0.1", http_port=port)
    engine = await make_engine(runtime, args)
    await run_input(runtime, "http", engine)


if __name__ == "__main__":
    apply_discovery_dir(sys.argv[2])
    asyncio.run(main(int(sys.argv[1])))
