"""Plain data from users (metadata, JSON inputs), walked without recursion.

A caller can send data nested as deep as a parser allows; anything that recursed over it
(a view, an encoder) would fail far from where the data came in.  So the engine bounds the
nesting at the edge (:func:`nesting`, used by :mod:`.validate`), and the views copy user data
with :func:`rebuild`, which keeps its own stack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CONTAINERS = (dict, list, tuple)


def nesting(value: Any, limit: int) -> int:
    """How many containers deep ``value`` goes (a scalar is 0; ``{}`` is 1), counted up to
    ``limit + 1`` at most: the walk stops as soon as the limit is passed."""
    if not isinstance(value, CONTAINERS):
        return 0
    deepest = 1
    stack: list[tuple[Any, int]] = [(value, 1)]  # (containers only: a leaf costs a test)
    while stack:
        item, level = stack.pop()
        if level > deepest:
            deepest = level
            if deepest > limit:
                return deepest
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, CONTAINERS):
                stack.append((child, level + 1))
    return deepest


def rebuild(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """A copy of ``value`` with dicts (their keys as text) and lists (tuples too) rebuilt,
    and every other value passed through ``leaf``."""
    if not isinstance(value, CONTAINERS):
        return leaf(value)
    root: list[Any] = [None]
    # (source container, the list or dict to fill, the key it goes under in its parent)
    stack: list[tuple[Any, Any]] = [(value, (root, 0))]
    while stack:
        item, (parent, key) = stack.pop()
        if isinstance(item, dict):
            out: Any = {}
            pairs = ((str(k), v) for k, v in item.items())
        elif isinstance(item, CONTAINERS):
            out = [None] * len(item)
            pairs = enumerate(item)  # type: ignore[assignment]
        else:
            parent[key] = leaf(item)
            continue
        parent[key] = out
        for k, v in pairs:
            if isinstance(v, CONTAINERS):
                if isinstance(out, dict):
                    out[k] = None  # keep the key order of the source
                stack.append((v, (out, k)))
            else:
                out[k] = leaf(v)
    return root[0]
