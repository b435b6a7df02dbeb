"""vramtui's worker SDK: what a model author imports.

Decorate functions in a script and run it with ``python -m worker_sdk main.py --control-socket P
--data-socket P --name N`` (or call :func:`run`).  The names match verda-io 0.4.4, so porting a
verda-io worker means changing one import; the request context (:func:`current`), ``@unload``
the negotiated protocol extensions, and ``@sleep``/``@wake`` (a model that gives its GPU memory
back without exiting) are new.  Importing this package configures no logging
and loads nothing until a name is used, so a client that needs only ``worker_sdk.protocol``
does not pay for the worker runtime.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Cancelled, RequestContext, current
    from .registry import (
        WorkerScriptError,
        hardware_health,
        initialize,
        predict,
        sleep,
        unload,
        wake,
    )
    from .response import Response
    from .runner import run

__version__ = "0.1.0"
_EXPORTS = {
    "Cancelled": ".context",
    "RequestContext": ".context",
    "current": ".context",
    "WorkerScriptError": ".registry",
    "hardware_health": ".registry",
    "initialize": ".registry",
    "predict": ".registry",
    "unload": ".registry",
    "sleep": ".registry",
    "wake": ".registry",
    "Response": ".response",
    "run": ".runner",
}
__all__ = [
    "Cancelled",
    "RequestContext",
    "Response",
    "WorkerScriptError",
    "current",
    "hardware_health",
    "initialize",
    "predict",
    "run",
    "sleep",
    "unload",
    "wake",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'worker_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
