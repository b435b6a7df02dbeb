"""Which fixtures start processes: declared with :func:`spawns`, read by ``process_marker``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_spawning: set[tuple[str, str]] = set()  # (module, fixture name)


def spawns(fixture: F) -> F:
    """Declare that a fixture starts processes (put it under ``@pytest.fixture``)."""
    _spawning.add((fixture.__module__.rsplit(".", 1)[-1], fixture.__name__))
    return fixture


def declared(module: str, name: str) -> bool:
    """Whether a test of ``module`` that uses fixture ``name`` starts processes through it
    (the module's own fixtures, and conftest's)."""
    return (module, name) in _spawning or ("conftest", name) in _spawning
