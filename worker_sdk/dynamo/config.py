"""``DynamoWorkerConfig``: AITune's configuration, field for field, and our extras after it.

AITune's fields keep their order and defaults, so ``DynamoWorkerConfig("embedding",
"org/model")`` and ``DynamoWorkerConfig(type="image", model_path=..., namespace=...,
component=...)`` mean what they mean to ``aitune.dynamo.worker``.  Ours come after them and are
keyword-only.  ``endpoint`` also takes the combined ``NAMESPACE.COMPONENT.ENDPOINT`` path (or
``dyn://NAMESPACE.COMPONENT.ENDPOINT``), which then sets ``namespace`` and ``component`` too.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import Any

from .shapes import KINDS, TYPED_KINDS

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_DEFAULT_NAMESPACE = "aitune"
_DEFAULT_COMPONENT = "backend"


def split_endpoint(path: str) -> tuple[str, str, str]:
    """``"ns.component.endpoint"`` (or ``dyn://...``) -> its three parts; ValueError if not."""
    bare = path.removeprefix("dyn://")
    parts = bare.split(".")
    if len(parts) != 3 or not all(_NAME.match(p) for p in parts):
        raise ValueError(f"endpoint must be NAMESPACE.COMPONENT.ENDPOINT (letters, digits, _ -), "
                         f"got {path!r}")
    return parts[0], parts[1], parts[2]


@dataclass
class DynamoWorkerConfig:
    """How to serve a model or function on Dynamo (NVIDIA AITune's ``DynamoWorkerConfig``).

    AITune's fields:

    ``type``
        ``"image"``, ``"video"`` or ``"embedding"`` (the OpenAI-style shapes of a Dynamo
        frontend; the model is registered with ``register_model``), or our ``"raw"`` (any
        JSON-like request, no registration).
    ``model_path``
        The Hugging Face id or local path the model card records (no download happens).
    ``mapping``
        ``fn(request) -> dict``: ``request`` is the modality's typed request
        (:mod:`worker_sdk.dynamo.requests`: ``.input``, ``.prompt``, ...), the dict is unpacked
        as ``**kwargs`` into the served function.  Without it, a plain function gets the typed
        request as its one argument; a ``torch.nn.Module`` needs one.
    ``namespace``, ``component``, ``endpoint``
        Where to serve (``aitune.backend.generate`` by default); ``endpoint`` may instead be
        the whole ``NAMESPACE.COMPONENT.ENDPOINT`` path.
    ``enable_nats``
        Use NATS for Dynamo's event plane (``DYN_EVENT_PLANE=nats``): a NATS server at
        ``NATS_SERVER`` (default ``nats://localhost:4222``) is then needed, and Dynamo 1.6.1
        waits ``NATS_STARTUP_CONNECT_TIMEOUT_SECONDS`` (120) for it before failing.
    ``model_name``
        The name a frontend serves (default: ``model_path``, else the component).

    Ours, keyword-only: ``concurrency`` (predict threads; 1: one request at a time, on the
    thread that ran the ``@initialize`` functions), ``progress`` (stream ``ctx.progress``
    calls on ``raw`` and ``video`` endpoints), ``drain_timeout`` (how long a shutdown waits for
    requests in flight before cancelling them), ``discovery_dir`` (file discovery in that
    directory: no etcd, no NATS), ``handle_signals`` (SIGTERM/SIGINT shut the endpoint down).
    """

    type: str
    model_path: str | None
    mapping: Callable[[Any], dict[str, Any]] | None = None
    namespace: str = _DEFAULT_NAMESPACE
    component: str = _DEFAULT_COMPONENT
    endpoint: str = "generate"
    enable_nats: bool = False
    model_name: str | None = None
    _: KW_ONLY
    concurrency: int = 1
    progress: bool = False
    drain_timeout: float = 30.0
    discovery_dir: str | None = None
    handle_signals: bool = True

    def __post_init__(self) -> None:
        if self.type not in KINDS:
            raise ValueError(f"type must be one of {', '.join(KINDS)}, got {self.type!r}")
        if self.model_path is not None and not isinstance(self.model_path, str):
            raise ValueError(f"model_path must be a string, got {type(self.model_path).__name__}")
        if self.mapping is not None and not callable(self.mapping):
            raise ValueError("mapping must be a function fn(request) -> dict, or None")
        if "." in self.endpoint or self.endpoint.startswith("dyn://"):
            namespace, component, endpoint = split_endpoint(self.endpoint)
            for field, given, named in (("namespace", self.namespace, namespace),
                                        ("component", self.component, component)):
                default = _DEFAULT_NAMESPACE if field == "namespace" else _DEFAULT_COMPONENT
                if given not in (default, named):
                    raise ValueError(f"endpoint {self.endpoint!r} names {field} {named!r}, but "
                                     f"{field}={given!r} was given; give one or the other")
            self.namespace, self.component, self.endpoint = namespace, component, endpoint
        for field in ("namespace", "component", "endpoint"):
            value = getattr(self, field)
            if not isinstance(value, str) or not _NAME.match(value):
                raise ValueError(f"{field} must be letters, digits, _ or -, got {value!r}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0, got {self.drain_timeout}")

    @property
    def path(self) -> str:
        """``NAMESPACE.COMPONENT.ENDPOINT``, as ``runtime.endpoint()`` takes it."""
        return f"{self.namespace}.{self.component}.{self.endpoint}"

    @property
    def registers(self) -> bool:
        """Whether the model is advertised with ``register_model`` (every type but raw)."""
        return self.type in TYPED_KINDS

    @property
    def served_model_name(self) -> str:
        return self.model_name or self.model_path or self.component

    @property
    def registered_model_path(self) -> str:
        return self.model_path or self.served_model_name
