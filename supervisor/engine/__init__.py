"""The engine: its parts (see :mod:`.engine`), wired on one loop."""

from .config import EngineConfig
from .engine import Engine
from .runtime import BackendRuntime

__all__ = ["BackendRuntime", "Engine", "EngineConfig"]
