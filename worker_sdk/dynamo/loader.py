"""Where NVIDIA Dynamo is imported (lazily, here only) and where it looks for its peers.

Nothing in :mod:`worker_sdk.dynamo` imports Dynamo at module level: :func:`import_dynamo`
returns the names the package uses, or raises :class:`DynamoMissing` (an ``ImportError``, as
AITune's ``dynamo_worker`` raises when ``ai-dynamo-runtime`` is absent) with a one-line message.
"""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

MISSING_MESSAGE = ("worker_sdk.dynamo needs NVIDIA Dynamo (ai-dynamo-runtime): "
                   "pip install 'vramtui[dynamo]'")


class DynamoMissing(ImportError):
    """``ai-dynamo-runtime`` is not installed, or does not import; the message is one line."""

    def __init__(self, message: str = MISSING_MESSAGE) -> None:
        super().__init__(message)


def import_dynamo() -> SimpleNamespace:
    """The Dynamo names this package uses; :class:`DynamoMissing` when Dynamo is absent."""
    try:
        from dynamo.llm import HttpError, ModelInput, ModelType, WorkerType, register_model
        from dynamo.llm.exceptions import Cancelled, WorkerUnavailable
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
        WorkerUnavailable=WorkerUnavailable,
        register_model=register_model,
    )


def apply_discovery_dir(directory: str) -> None:
    """Point Dynamo (this process) at file discovery in ``directory``, TCP, ZMQ: no etcd/NATS."""
    os.makedirs(directory, exist_ok=True)
    os.environ["DYN_DISCOVERY_BACKEND"] = "file"
    os.environ["DYN_FILE_KV"] = os.path.abspath(directory)
    os.environ.setdefault("DYN_REQUEST_PLANE", "tcp")
    os.environ.setdefault("DYN_EVENT_PLANE", "zmq")


def apply_enable_nats() -> None:
    """AITune's ``enable_nats=True``: Dynamo 1.6.1 reads it from the event plane's setting."""
    os.environ["DYN_EVENT_PLANE"] = "nats"


def discovery_backend() -> str:
    return os.environ.get("DYN_DISCOVERY_BACKEND", "etcd")


def request_plane() -> str:
    return os.environ.get("DYN_REQUEST_PLANE", "tcp")
