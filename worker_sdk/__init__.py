"""vramtui's worker SDK: what a model author imports.

Decorate functions in a script and run it with ``python -m worker_sdk main.py --control-socket P
--data-socket P --name N`` (or call :func:`run`).  The names match verda-io 0.4.4, so porting a
verda-io worker means changing one import; the request context (:func:`current`), ``@unload``
and the negotiated protocol extensions are new.  Importing this package configures no logging.
"""

from __future__ import annotations

from .context import Cancelled, RequestContext, current
from .registry import WorkerScriptError, hardware_health, initialize, predict, unload
from .response import Response
from .runner import run

__version__ = "0.1.0"
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
    "unload",
]
