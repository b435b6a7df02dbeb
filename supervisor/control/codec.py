"""The engine's immutable views as msgpack-able dicts, and back to the same dataclasses.

Encoding is a dict of each dataclass's fields (tuples and enums go through msgpack as arrays
and strings).  Decoding is driven by the dataclasses' own type hints, compiled once per class:
lists become tuples again, ``state`` a :class:`JobState`, nested dicts the nested views.
Unknown keys are ignored and missing keys fall back to the field's default, so a client and an
engine one field apart still understand each other.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from ..events import EngineEvent
from ..jobs import JobView
from ..snapshot import EngineSnapshot

T = TypeVar("T")
Convert = Callable[[Any], Any]


class DecodeError(ValueError):
    """A reply that does not have the shape of the view it should carry."""


# -- encoding -----------------------------------------------------------------------------------

_JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobView))


def job_to_wire(view: JobView, data_limit: int | None = None) -> dict[str, Any]:
    """A JobView as a dict; with ``data_limit``, data and chunks larger than it are left out."""
    out = {name: getattr(view, name) for name in _JOB_FIELDS}
    if data_limit is not None:
        if view.data is not None and len(view.data) > data_limit:
            out["data"] = None
        if view.chunks and sum(len(c) for c in view.chunks) > data_limit:
            out["chunks"] = ()
    return out


def to_wire(value: Any, data_limit: int | None = None) -> Any:
    """Any engine view (or tuple/list/dict of them) as plain msgpack-able values."""
    if isinstance(value, JobView):
        return job_to_wire(value, data_limit)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name), data_limit)
                for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        if value and _has_views(value[0]):
            return [to_wire(v, data_limit) for v in value]
        return value
    return value


def _has_views(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def snapshot_to_wire(snap: EngineSnapshot, data_limit: int | None = None) -> dict[str, Any]:
    return to_wire(snap, data_limit)  # type: ignore[no-any-return]


def event_to_wire(event: EngineEvent) -> dict[str, Any]:
    out = {"kind": event.kind, "t": event.t, "job": None, "job_id": event.job_id,
           "backend": event.backend, "state": event.state, "message": event.message,
           "level": event.level, "data": event.data, "seconds": event.seconds}
    if event.job is not None:
        out["job"] = job_to_wire(event.job)
    return out


# -- decoding -----------------------------------------------------------------------------------

# Converters, compiled once and shared by every thread (a client's event pump decodes while
# its caller decodes answers): only a finished one is published in _cache; one being
# compiled is known to the compiling thread alone (under _lock), so another thread never
# takes a recursive type's stand-in (identity) for the converter, as it did: an event
# decoded while JobView's was being compiled kept its job a dict for good.
_cache: dict[Any, Convert | None] = {}
_compiling: set[Any] = set()
_lock = threading.RLock()
_MISSING = object()


def _identity(value: Any) -> Any:
    return value


def _converter(hint: Any) -> Convert | None:
    """A function that rebuilds a value of type ``hint`` from its wire form (None: as is)."""
    conv = _cache.get(hint, _MISSING)
    if conv is not _MISSING:
        return conv  # type: ignore[return-value]
    with _lock:
        if hint in _cache:
            return _cache[hint]
        if hint in _compiling:
            return _identity  # a recursive type resolves to identity while being compiled
        _compiling.add(hint)
        try:
            built = _build(hint)
        finally:
            _compiling.discard(hint)
        _cache[hint] = built
        return built


def _build(hint: Any) -> Convert | None:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _dataclass_converter(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = _converter(args[0])
            if inner is None:
                return tuple
            return lambda v, inner=inner: tuple(map(inner, v))
        convs = [_converter(a) for a in args]
        if all(c is None for c in convs):
            return tuple
        parts = [c or _identity for c in convs]
        return lambda v, parts=parts: tuple(p(x) for p, x in zip(parts, v, strict=False))
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            inner = _converter(options[0])
            if inner is None:
                return None
            return lambda v, inner=inner: None if v is None else inner(v)
        return None
    return None


def _dataclass_converter(cls: type[T]) -> Convert:
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, _converter(hints[f.name]), required))
    name = cls.__name__

    def convert(value: Any) -> Any:
        if not isinstance(value, dict):
            raise DecodeError(f"expected a {name} as a map, got {type(value).__name__}")
        kwargs = {}
        for key, conv, required in fields:
            if key in value:
                item = value[key]
                kwargs[key] = item if conv is None or item is None else conv(item)
            elif required:
                raise DecodeError(f"{name} is missing its field {key!r}")
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise DecodeError(f"malformed {name}: {exc}") from None

    return convert


def decoder(hint: Any) -> Convert:
    """A function that rebuilds a value of type ``hint`` (a view dataclass, a tuple of them,
    or a plain type) from its wire form; raises DecodeError when it is malformed."""
    conv = _converter(hint)
    if conv is None:
        return _identity

    def decode(value: Any) -> Any:
        if value is None:
            return None
        try:
            return conv(value)
        except DecodeError:
            raise
        except (TypeError, ValueError, KeyError) as exc:
            raise DecodeError(f"malformed {getattr(hint, '__name__', hint)}: {exc}") from None

    return decode


def from_wire(cls: type[T], value: Any) -> T:
    """Rebuild a ``cls`` (a view dataclass) from its wire form; raises DecodeError."""
    conv = _converter(cls)
    assert conv is not None
    try:
        return conv(value)  # type: ignore[no-any-return]
    except DecodeError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise DecodeError(f"malformed {cls.__name__}: {exc}") from None


def job_from_wire(value: Any) -> JobView:
    return from_wire(JobView, value)


def snapshot_from_wire(value: Any) -> EngineSnapshot:
    return from_wire(EngineSnapshot, value)


def event_from_wire(value: Any) -> EngineEvent:
    return from_wire(EngineEvent, value)
