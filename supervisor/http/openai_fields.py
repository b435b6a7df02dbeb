"""The fields of an OpenAI-shaped request that a worker reads: each one's check, in one place.

A worker backend (``examples/openai``, or one of the user's) gets the request's JSON as it
came, and a field of the wrong type failed inside it: a 502 carrying its Python exception
(``max_tokens: NaN``, ``messages: [1, 2]``, ``dimensions: -1``).  Each field the workers read
has its check here (:data:`CHECKS`); :func:`problem` runs them on a request for a worker (the
OpenAI door's ``submit``, which the Ollama door's requests go through too), and the Ollama
door checks the ``options`` that become these fields with :func:`check` (:mod:`.ollama_shapes`),
so a bad value is a 400 that names the field the client sent.  A model server's requests are
not checked: the server judges its own API.  ``null`` is any field's default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

#: What a value must be (None: it is fine).
Check = Callable[[Any], str | None]


#: The most ``dimensions`` an embedding may ask for: the largest models' vectors are a few
#: thousand floats, and a worker builds what it is asked (10**30 kept one busy until killed).
MAX_DIMENSIONS = 65536


def _whole(minimum: int | None, maximum: int | None = None) -> Check:
    said = "a whole number" + ("" if minimum is None else f", {minimum} or more"
                               if maximum is None else f", {minimum} to {maximum}")

    def check(value: Any) -> str | None:
        fine = isinstance(value, int) and not isinstance(value, bool) and (
            minimum is None or value >= minimum) and (maximum is None or value <= maximum)
        return None if fine else said
    return check


def _number(value: Any) -> str | None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "a finite number"
    try:
        fine = math.isfinite(value)
    except OverflowError:  # an integer past a float's range (JSON may send 10**400): a 500
        fine = False
    return None if fine else "a finite number"


def _stop(value: Any) -> str | None:
    fine = isinstance(value, str) or (
        isinstance(value, list) and all(isinstance(v, str) for v in value))
    return None if fine else "a text, or a list of texts"


def _messages(value: Any) -> str | None:
    fine = isinstance(value, list) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value)
    return None if fine else "a list of {role, content}"


def _tokens(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def _texts(value: Any) -> str | None:
    """An embedding's or a completion's input: a text, a list of texts, token ids, or lists
    of token ids."""
    fine = isinstance(value, str) or _tokens(value) or (isinstance(value, list) and all(
        isinstance(v, str) or _tokens(v) for v in value))
    return None if fine else "a text, a list of texts, or token ids"


CHECKS: dict[str, Check] = {
    "messages": _messages,
    "max_tokens": _whole(0), "max_completion_tokens": _whole(0),
    "max_output_tokens": _whole(0), "n": _whole(1), "seed": _whole(None),
    "top_k": _whole(0), "dimensions": _whole(1, MAX_DIMENSIONS),
    "temperature": _number, "top_p": _number, "min_p": _number, "repeat_penalty": _number,
    "frequency_penalty": _number, "presence_penalty": _number,
    "stop": _stop,
}
#: The fields one API reads in its own way: embeddings' and completions' input.
KIND_CHECKS: dict[str, dict[str, Check]] = {
    "embeddings": {"input": _texts}, "completions": {"prompt": _texts}}


def check(name: str, value: Any, kind: str | None = None) -> str | None:
    """What field ``name`` must be, when ``value`` is not that (None: it is fine)."""
    if value is None:
        return None
    checker = KIND_CHECKS.get(kind or "", {}).get(name) or CHECKS.get(name)
    return None if checker is None else checker(value)


def problem(kind: str, body: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first field of a request of OpenAI's ``kind`` for a worker that is not what it must
    be, and what it must be (None: every field is fine)."""
    if kind == "chat" and not (isinstance(body.get("messages"), list) and body["messages"]):
        return "messages", "a non-empty list of {role, content} is required"
    for name, value in body.items():
        what = check(name, value, kind)
        if what is not None:
            return name, what
    return None
