"""Serve a decorated worker as an NVIDIA Dynamo endpoint (the optional ``dynamo`` extra).

The same script that ``python -m worker_sdk`` serves to a vramtui engine (``@initialize``,
``@predict``, ``@hardware_health``, ``@unload``) becomes a Dynamo endpoint with
``python -m worker_sdk.dynamo main.py --endpoint NS.COMPONENT.ENDPOINT`` or, from Python, in the
spirit of NVIDIA AITune's ``DynamoWorkerConfig`` / ``dynamo_worker(fn, config)``::

    from worker_sdk.dynamo import DynamoWorkerConfig, dynamo_worker

    config = DynamoWorkerConfig(endpoint="demo.embedder.generate", type="embedding",
                                model_name="toy-embedder")
    raise SystemExit(dynamo_worker(config=config))   # the functions decorated in this script

What happens: the ``@initialize`` functions run once, in order, on the predict thread; with a
``type`` other than ``raw`` the model is advertised with ``register_model`` (a minimal card:
no Hugging Face download); the endpoint serves until SIGTERM or SIGINT, which shut the Dynamo
runtime down (so its discovery entries are removed), let the requests in flight finish for up
to ``drain_timeout`` seconds, cancel the rest, and run the ``@unload`` functions.  ``predict``
runs off the event loop; sync and async functions, generators and async generators behave as
under the socket worker; a generator's chunks become streamed responses; Dynamo's stop or kill
of a request cancels its :class:`~worker_sdk.RequestContext`.  Request and response shapes per
``type`` are in :mod:`worker_sdk.dynamo.shapes`.  ``@hardware_health`` answers
``GET /engine/hardware_health`` on Dynamo's system server when ``DYN_SYSTEM_PORT`` is set.

Discovery and transport come from Dynamo's environment (``DYN_DISCOVERY_BACKEND``,
``ETCD_ENDPOINTS``, ``DYN_REQUEST_PLANE``, ...); ``discovery_dir`` (``--discovery-dir``) is the
shortcut for file discovery and the TCP request plane, with no etcd and no NATS.

Dynamo is imported lazily, here only: without it, :func:`dynamo_worker` raises
:class:`DynamoMissing` and the CLI prints one line and exits 2.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ..registry import REGISTRY, Registry
from .shapes import KINDS, TYPED_KINDS

log = logging.getLogger("worker_sdk.dynamo")

MISSING_MESSAGE = "worker_sdk.dynamo needs NVIDIA Dynamo: pip install 'vramtui[dynamo]'"

__all__ = [
    "KINDS",
    "MISSING_MESSAGE",
    "DynamoMissing",
    "DynamoWorkerConfig",
    "apply_discovery_dir",
    "dynamo_worker",
    "import_dynamo",
    "serve_async",
]


class DynamoMissing(ImportError):
    """``ai-dynamo-runtime`` is not installed, or does not import; the message is one line."""

    def __init__(self, message: str = MISSING_MESSAGE) -> None:
        super().__init__(message)


def import_dynamo() -> SimpleNamespace:
    """The Dynamo names this package uses; :class:`DynamoMissing` when Dynamo is absent."""
    try:
        from dynamo.llm import HttpError, ModelInput, ModelType, WorkerType, register_model
        from dynamo.llm.exceptions import Cancelled
        from dynamo.runtime import Context, DistributedRuntime
    except ImportError as exc:
        try:
            spec = importlib.util.find_spec("dynamo")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise DynamoMissing() from exc
        where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "?"
        detail = " ".join(str(exc).split())
        raise DynamoMissing(
            f"worker_sdk.dynamo cannot import NVIDIA Dynamo (the 'dynamo' at {where}: "
            f"{detail}); reinstall: pip install 'vramtui[dynamo]'"
        ) from exc
    return SimpleNamespace(
        Cancelled=Cancelled,
        Context=Context,
        DistributedRuntime=DistributedRuntime,
        HttpError=HttpError,
        ModelInput=ModelInput,
        ModelType=ModelType,
        WorkerType=WorkerType,
        register_model=register_model,
    )


def apply_discovery_dir(directory: str) -> None:
    """Point Dynamo (this process) at file discovery in ``directory``, TCP, ZMQ: no etcd/NATS."""
    os.makedirs(directory, exist_ok=True)
    os.environ["DYN_DISCOVERY_BACKEND"] = "file"
    os.environ["DYN_FILE_KV"] = os.path.abspath(directory)
    os.environ.setdefault("DYN_REQUEST_PLANE", "tcp")
    os.environ.setdefault("DYN_EVENT_PLANE", "zmq")


def split_endpoint(path: str) -> tuple[str, str, str]:
    """``"ns.component.endpoint"`` (or ``dyn://...``) -> its three parts; ValueError if not."""
    bare = path.removeprefix("dyn://")
    parts = bare.split(".")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"endpoint must be NAMESPACE.COMPONENT.ENDPOINT, got {path!r}")
    return parts[0], parts[1], parts[2]


@dataclass
class DynamoWorkerConfig:
    """How to serve a worker on Dynamo (AITune's ``DynamoWorkerConfig``, for our workers).

    ``endpoint`` is ``NAMESPACE.COMPONENT.ENDPOINT`` (AITune's namespace, component and
    endpoint in one string).  ``type`` is ``raw`` (our bytes protocol, no model registration)
    or ``image``, ``video``, ``embedding`` (OpenAI-style shapes; registered with
    ``register_model``).  ``model_name`` is the name a frontend serves (default: ``model_path``,
    else the component); ``model_path`` is what the model card records (default: the name).
    ``mapping`` (like AITune's) turns a Dynamo request into ``predict``'s payload (bytes, str
    or a JSON-able object) instead of the default conversion.  ``concurrency`` is the number of
    predict threads (1: one request at a time, on one thread).  ``progress`` streams
    ``ctx.progress`` calls as items on ``raw`` and ``video`` endpoints.  ``drain_timeout`` is
    how long a shutdown waits for requests in flight before cancelling them.
    ``discovery_dir`` selects file discovery in that directory (see
    :func:`apply_discovery_dir`).
    """

    endpoint: str = "vramtui.worker.generate"
    type: str = "raw"
    model_name: str | None = None
    model_path: str | None = None
    mapping: Callable[[Any], Any] | None = None
    concurrency: int = 1
    progress: bool = False
    drain_timeout: float = 30.0
    discovery_dir: str | None = None
    handle_signals: bool = True
    _parts: tuple[str, str, str] = field(default=("", "", ""), init=False, repr=False)

    def __post_init__(self) -> None:
        self._parts = split_endpoint(self.endpoint)
        if self.type not in KINDS:
            raise ValueError(f"type must be one of {', '.join(KINDS)}, got {self.type!r}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0, got {self.drain_timeout}")

    @property
    def registers(self) -> bool:
        """Whether the model is advertised with ``register_model`` (every type but raw)."""
        return self.type in TYPED_KINDS

    @property
    def served_model_name(self) -> str:
        return self.model_name or self.model_path or self._parts[1]

    @property
    def registered_model_path(self) -> str:
        return self.model_path or self.served_model_name


def _registry_for(predict: Callable[..., Any] | Registry | None) -> Registry:
    """The registry to serve: the decorated one, or it with ``predict`` swapped in."""
    if predict is None or predict is REGISTRY.predict:
        return REGISTRY
    if isinstance(predict, Registry):
        return predict
    if not callable(predict):
        raise TypeError(f"dynamo_worker() serves a callable or a Registry, got {predict!r}")
    from ..registry import takes_context

    return Registry(
        initializers=list(REGISTRY.initializers),
        predict=predict,
        predict_takes_context=takes_context(predict),
        hardware_health=REGISTRY.hardware_health,
        unload=list(REGISTRY.unload),
    )


async def serve_async(
    runtime: Any,
    config: DynamoWorkerConfig,
    predict: Callable[..., Any] | Registry | None = None,
    *,
    script: str = "worker script",
) -> int:
    """Serve on an existing ``DistributedRuntime`` (inside Dynamo's own ``@dynamo_worker``).

    Returns when the runtime shuts down; the exit code (0, or 3 when an @initialize failed,
    4 when Dynamo failed).  Signal handlers are installed only when ``config.handle_signals``.
    """
    from .server import DynamoServer

    dyn = import_dynamo()
    server = DynamoServer(_registry_for(predict), config, dyn, script=script)
    return int(await server.run(runtime, handle_signals=config.handle_signals))


def dynamo_worker(
    predict: Callable[..., Any] | Registry | None = None,
    config: DynamoWorkerConfig | None = None,
    *,
    script: str = "worker script",
) -> int:
    """Serve ``predict`` (default: the decorated functions) as a Dynamo endpoint; blocks.

    ``predict`` may be None (serve the ``@worker_sdk`` decorated functions), a function (served
    as the predict, with the decorated initialize / health / unload functions), or a
    :class:`~worker_sdk.registry.Registry`.  Returns the exit code once SIGTERM or SIGINT has
    shut the endpoint down (0), or 3 if an ``@initialize`` function raised, 4 if Dynamo failed
    (no discovery backend, ...).  Raises :class:`DynamoMissing` without Dynamo and
    ``WorkerScriptError`` when there is no predict.
    """
    config = config or DynamoWorkerConfig()
    registry = _registry_for(predict)
    registry.require_predict(script)
    if config.discovery_dir:
        apply_discovery_dir(config.discovery_dir)
    dyn = import_dynamo()

    async def main() -> int:
        from .server import DynamoServer

        loop = asyncio.get_running_loop()
        backend = os.environ.get("DYN_DISCOVERY_BACKEND", "etcd")
        try:
            runtime = dyn.DistributedRuntime(
                loop, backend, os.environ.get("DYN_REQUEST_PLANE", "tcp")
            )
        except Exception as exc:  # noqa: BLE001 - e.g. etcd unreachable
            log.error("cannot start the Dynamo runtime (discovery %s): %s", backend, exc)
            return 4
        server = DynamoServer(registry, config, dyn, script=script)
        try:
            return int(await server.run(runtime, handle_signals=config.handle_signals))
        finally:
            runtime.shutdown()

    try:
        import uvloop
    except ImportError:  # a dependency of ai-dynamo-runtime, but not required
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())
