"""Serve a model, a function or a decorated worker as an NVIDIA Dynamo endpoint (``dynamo`` extra).

The Python API is NVIDIA AITune's ``aitune.dynamo.worker``: code written for it runs unchanged
with ``from worker_sdk.dynamo import ...`` instead::

    from worker_sdk.dynamo import DynamoWorkerConfig, dynamo_worker

    def embed(texts, dims):                       # a model, a function, any callable
        return [[0.0] * dims for _ in texts]

    config = DynamoWorkerConfig(
        type="embedding",                         # "image", "video", "embedding" (ours: "raw")
        model_path="org/my-embedder",
        mapping=lambda request: {"texts": request.texts, "dims": request.dimensions or 8},
        namespace="demo", component="embedder",   # endpoint="generate" by default
    )
    dynamo_worker(embed, config)                  # blocks until SIGTERM or SIGINT

``mapping(request) -> dict`` receives the typed request of the type (:mod:`.requests`:
``request.input``, ``request.prompt``, ...), and its dict is unpacked as ``**kwargs``; without
a mapping a plain function gets the typed request as its one argument; a ``torch.nn.Module``
needs a mapping (a ``ValueError`` before anything starts).  What the function returns is packed
per type (:mod:`.shapes`: a dict as it is; for ``embedding`` a vector, a list of vectors, a numpy
array or a tensor; for ``image`` / ``video`` the bytes).  :class:`DynamoWorker` is AITune's
power-user base class (``setup``, ``serve`` as an async generator, ``on_ready``, ``run``).

The other entry, ``python -m worker_sdk.dynamo main.py --endpoint NS.COMPONENT.ENDPOINT``, serves
the same decorated worker script (``@initialize``, ``@predict``, ``@hardware_health``,
``@unload``) that ``python -m worker_sdk`` serves to a vramtui engine; ``predict`` then gets the
request's bytes, as under the engine.  Both entries run on one implementation
(:class:`.server.FunctionWorker`, a :class:`DynamoWorker`): ``@initialize`` functions run once,
in order, on the predict thread, before the runtime starts; typed endpoints are advertised with
``register_model`` (a minimal card: no Hugging Face download); SIGTERM or SIGINT shut the
runtime down (its discovery entries go with it), let the requests in flight finish for up to
``drain_timeout`` seconds, cancel the rest, and run the ``@unload`` functions.  Dynamo's stop or
kill of a request cancels its :class:`~worker_sdk.RequestContext` (``worker_sdk.current()``).
``@hardware_health`` answers ``GET /engine/hardware_health`` on Dynamo's system server when
``DYN_SYSTEM_PORT`` is set.

Discovery and transport come from Dynamo's environment (``DYN_DISCOVERY_BACKEND``,
``ETCD_ENDPOINTS``, ``DYN_REQUEST_PLANE``, ...); ``discovery_dir`` (``--discovery-dir``) is the
shortcut for file discovery and the TCP request plane, with no etcd and no NATS.  Errors a caller
can act on (try another instance) are described in :mod:`.errors`.

Dynamo is imported lazily (:mod:`.loader`): without it, :func:`dynamo_worker` and
:meth:`DynamoWorker.run` raise :class:`DynamoMissing`, an ``ImportError``, and the CLI prints
one line and exits 2.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..registry import REGISTRY, Registry
from .config import DynamoWorkerConfig, split_endpoint
from .errors import ErrorInfo, RequestError, error_info
from .loader import MISSING_MESSAGE, DynamoMissing, apply_discovery_dir, import_dynamo
from .shapes import KINDS
from .worker import DynamoFailed, DynamoWorker

log = logging.getLogger("worker_sdk.dynamo")

__all__ = [
    "KINDS",
    "MISSING_MESSAGE",
    "DynamoFailed",
    "DynamoMissing",
    "DynamoWorker",
    "DynamoWorkerConfig",
    "ErrorInfo",
    "RequestError",
    "apply_discovery_dir",
    "dynamo_worker",
    "error_info",
    "import_dynamo",
    "serve_async",
    "split_endpoint",
]


def _worker_for(model_or_fn: Any, config: DynamoWorkerConfig, script: str) -> Any:
    """Validate (before anything starts) and build the worker that serves ``model_or_fn``."""
    from .server import FunctionWorker, is_torch_module

    if not isinstance(config, DynamoWorkerConfig):
        raise TypeError(f"config must be a DynamoWorkerConfig, got {type(config).__name__}")
    if is_torch_module(model_or_fn) and config.mapping is None:
        raise ValueError("A mapping function is required when passing a torch.nn.Module. "
                         "Provide config.mapping=fn(request) -> dict.")
    if model_or_fn is None or model_or_fn is REGISTRY.predict:
        target: Callable[..., Any] | Registry = REGISTRY
    elif isinstance(model_or_fn, Registry) or callable(model_or_fn):
        target = model_or_fn
    else:
        raise TypeError(f"dynamo_worker() serves a function, a torch.nn.Module or a callable, "
                        f"got {type(model_or_fn).__name__}")
    if isinstance(target, Registry):
        target.require_predict(script)
    return FunctionWorker(target, config, script=script)


def dynamo_worker(
    model_or_fn: Callable[..., Any] | Registry | None = None,
    config: DynamoWorkerConfig | None = None,
    *,
    script: str = "worker script",
) -> None:
    """Serve ``model_or_fn`` as a Dynamo worker endpoint; blocks until SIGTERM/SIGINT.

    ``model_or_fn``: a ``torch.nn.Module`` (requires ``config.mapping``) or any callable, served
    with AITune's convention (see the module docstring); or None (or the decorated ``@predict``
    itself, or a :class:`~worker_sdk.registry.Registry`): the script's decorated functions,
    ``predict`` getting bytes.

    Raises (before any runtime starts): ``ValueError`` for an unknown ``type`` or a
    ``torch.nn.Module`` without a mapping; :class:`DynamoMissing` (``ImportError``) without
    ``ai-dynamo-runtime``.  Later: what an ``@initialize`` function raised
    (:class:`~worker_sdk.dynamo.server.InitializeFailed`), and :class:`DynamoFailed` when the
    runtime cannot start or stops serving.
    """
    if config is None:
        raise TypeError("dynamo_worker() needs a DynamoWorkerConfig(type, model_path, ...)")
    worker = _worker_for(model_or_fn, config, script)
    import_dynamo()  # the ImportError before the discovery directory is made
    if config.discovery_dir:
        apply_discovery_dir(config.discovery_dir)
    worker.run(enable_nats=config.enable_nats)


async def serve_async(
    runtime: Any,
    config: DynamoWorkerConfig,
    model_or_fn: Callable[..., Any] | Registry | None = None,
    *,
    script: str = "worker script",
) -> None:
    """Serve on an existing ``DistributedRuntime`` (inside Dynamo's own ``@dynamo_worker``).

    Runs the setup on a thread, then serves until the runtime shuts down.  Signal handlers are
    installed only when ``config.handle_signals`` (and on the main thread).
    """
    import asyncio

    worker = _worker_for(model_or_fn, config, script)
    import_dynamo()
    await asyncio.to_thread(worker.setup)
    await worker.serve_on(runtime, handle_signals=config.handle_signals)
