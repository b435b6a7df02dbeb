"""How deep user data nests, as the engine's edge counts it (``supervisor.plain.nesting``):
against a recursive count of the same data, on random shapes, and cut short past the limit
on data deeper than any recursion could walk."""

from __future__ import annotations

import random
from typing import Any

from supervisor.plain import nesting


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list | tuple):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _shape(rng: random.Random, budget: int) -> Any:
    roll = rng.random()
    if budget <= 0 or roll < 0.3:
        return rng.choice([1, "x", None, 2.5, b"b", True])
    children = [_shape(rng, budget - 1) for _ in range(rng.randint(0, 4))]
    if roll < 0.6:
        return {f"k{i}": c for i, c in enumerate(children)}
    return children if roll < 0.85 else tuple(children)


def test_nesting_counts_containers_as_a_recursive_walk_does() -> None:
    rng = random.Random(7)
    for _ in range(500):
        value = _shape(rng, 7)
        assert nesting(value, 100) == _depth(value), value


def test_nesting_stops_just_past_the_limit_on_data_no_recursion_could_walk() -> None:
    deep: list[Any] = []
    cur = deep
    for _ in range(100_000):
        cur.append([])
        cur = cur[0]
    assert nesting(deep, 8) == 9
    assert nesting({"a": [1, 2, {"b": deep}]}, 8) == 9
    assert nesting([1] * 1_000_000, 8) == 1  # (a long flat list: one level)
