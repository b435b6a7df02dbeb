"""The edge checks of what a caller asks the engine to do: every value, one clear error each.

:meth:`supervisor.engine.Engine.submit` (and ``calibrate``) call these first, so the control
socket, the in-process facade and the HTTP door all refuse the same values with the same
one-line :class:`~supervisor.errors.InvalidRequest`, before anything is queued or journaled.
Nothing here reads engine state: the functions take values and limits, and return the
cleaned values.

The limits, and why:

- priority: an integer in ``[-1000000, 1000000]`` (the journal stores 64-bit integers, and the
  engine's own internal work ranks below every user priority);
- timeouts: a finite number of seconds, more than 0 and at most 30 days (NaN, infinities,
  negatives and zero would time a job out at once or never);
- payload: bytes, at most ``max_payload`` (``EngineConfig.max_payload_bytes``); all queued
  payloads together at most ``EngineConfig.max_queued_bytes`` (they are held in memory);
- result: at most ``EngineConfig.max_result_bytes`` (``$VRAMTUI_MAX_RESULT_MIB``, default 64
  MiB, at most 512 MiB): the data of a reply, or a stream's chunks in all; over it the worker's
  request is cancelled and the job fails with a reason that names the limit;
- metadata: a mapping of plain data (strings, numbers, lists, mappings, bytes), at most
  64 KiB once packed and nested at most 32 levels deep: it travels to the worker, into the
  journal and into every view of the job, none of which may fail on it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import InvalidRequest, QueueFull, brief
from .plain import nesting
from .units import bytes_text, digits

PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000
TIMEOUT_MAX_S = 30 * 86400.0
YIELD_MAX_S = 366 * 86400  # a yield's duration: at most a year (longer: no --for)
METADATA_MAX_BYTES = 64 * 1024
METADATA_MAX_DEPTH = 32
BACKEND_NAME_MAX = 200
REPEATS_MAX = 100
SETTLE_MAX_S = 600.0
MAX_RESULT_DEFAULT = 64 * 1024 * 1024
MAX_RESULT_CEILING = 512 * 1024 * 1024  # the journal (SQLite) stores at most ~1 GB per value
RESULT_VARIABLE = "VRAMTUI_MAX_RESULT_MIB"


def default_max_result_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """``EngineConfig.max_result_bytes``: ``$VRAMTUI_MAX_RESULT_MIB`` MiB, else 64 MiB (at most
    512 MiB); a value that is not a whole number of MiB is ignored, with a warning."""
    value = environ.get(RESULT_VARIABLE, "").strip()
    if not value:
        return MAX_RESULT_DEFAULT
    if not digits(value) or not 0 < int(value) * 1024 * 1024 <= MAX_RESULT_CEILING:
        logging.getLogger("supervisor").warning(
            "%s=%s ignored: give a whole number of MiB between 1 and %d; using %d MiB",
            RESULT_VARIABLE, value, MAX_RESULT_CEILING >> 20, MAX_RESULT_DEFAULT >> 20)
        return MAX_RESULT_DEFAULT
    return int(value) * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SubmitArgs:
    """A submit's values once checked (``priority``/``timeout`` None: the backend's default)."""

    backend: str
    payload: bytes
    priority: int | None
    timeout: float | None
    metadata: dict[str, Any]
    stream: bool


def _kind(value: object) -> str:
    return type(value).__name__


def check_backend_name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"backend must be a backend's name, not {value!r:.60}")
    if len(value) > BACKEND_NAME_MAX:
        raise InvalidRequest(f"backend name is {len(value)} characters long; names have at "
                             f"most {BACKEND_NAME_MAX}")
    return value


def check_priority(value: object, what: str = "priority") -> int | None:
    """None, or an integer within the priority range."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InvalidRequest(f"{what} must be a whole number between {PRIORITY_MIN} and "
                                 f"{PRIORITY_MAX}, not {_kind(value)} {value!r:.40}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise InvalidRequest(f"{what} {value} is out of range: use a whole number between "
                             f"{PRIORITY_MIN} and {PRIORITY_MAX}")
    return int(value)


def check_seconds(value: object, what: str, *, maximum: float = TIMEOUT_MAX_S,
                  allow_zero: bool = False) -> float | None:
    """None, or a finite number of seconds in ``(0, maximum]`` (``[0, …]`` with allow_zero)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{what} must be a number of seconds, not {_kind(value)} "
                             f"{value!r:.40}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidRequest(f"{what} must be a finite number of seconds, not {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidRequest(f"{what} must be more than 0 seconds, not {value!r:.40}")
    if value > maximum:
        raise InvalidRequest(f"{what} of {_seconds(value)} s is too long: at most "
                             f"{_seconds(maximum)} s ({maximum / 86400:g} days)")
    return float(value)


def _seconds(value: int | float) -> str:
    """A number of seconds for a message, in full up to 15 digits (``2592001``, ``1e+300``;
    6 digits said "2.592e+06 s is too long: at most 2.592e+06 s" of 2592001); an integer
    past a float's range (a JSON body may send one) cut short, where it raised OverflowError."""
    try:
        return f"{float(value):.15g}"
    except OverflowError:
        return brief(value)


def check_payload(value: object, max_payload: int, what: str = "payload") -> bytes:
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidRequest(f"{what} must be bytes, not {_kind(value)}")
    data = bytes(value)
    if len(data) > max_payload:
        size, limit = (bytes_text(n, always_tenths=True) for n in (len(data), max_payload))
        raise InvalidRequest(f"{what} is {size}, over the engine's limit of {limit} "
                             "(EngineConfig.max_payload_bytes)")
    return data


def check_metadata(value: object) -> dict[str, Any]:
    """Metadata travels to the worker and into the journal: plain data, and small."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"metadata must be a mapping, got {_kind(value)}")
    check_nesting(dict(value), METADATA_MAX_DEPTH, "metadata")
    try:
        packed = msgpack.packb(dict(value), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(f"metadata must be plain data (strings, numbers, lists, "
                             f"mappings, bytes): {exc}") from None
    if len(packed) > METADATA_MAX_BYTES:
        size, limit = (bytes_text(n, always_tenths=True)
                       for n in (len(packed), METADATA_MAX_BYTES))
        raise InvalidRequest(f"metadata is {size} once packed; at most {limit} (put large data "
                             "in the payload)")
    return dict(value)


def check_nesting(value: object, limit: int, what: str) -> None:
    """Raise :class:`InvalidRequest` when ``value`` nests more than ``limit`` levels deep."""
    if nesting(value, limit) > limit:
        raise InvalidRequest(f"{what} nests more than {limit} levels deep; flatten it "
                             f"(at most {limit} levels of lists and mappings)")


def check_submit(backend: object, payload: object, *, priority: object, timeout: object,
                 metadata: object, stream: object, max_payload: int) -> SubmitArgs:
    """Every value of a submit, checked; raises :class:`InvalidRequest` for the first bad one."""
    if not isinstance(stream, bool):
        raise InvalidRequest(f"stream must be true or false, not {_kind(stream)}")
    return SubmitArgs(
        backend=check_backend_name(backend),
        payload=check_payload(payload, max_payload),
        priority=check_priority(priority),
        timeout=check_seconds(timeout, "timeout"),
        metadata=check_metadata(metadata),
        stream=stream,
    )


def check_queue_room(held: int, adding: int, limit: int) -> None:
    """Raise :class:`QueueFull` when ``adding`` more payload bytes to the ``held`` ones of the
    queued jobs would pass ``limit``."""
    if held + adding > limit:
        sizes = [bytes_text(n, always_tenths=True) for n in (held, adding, limit)]
        raise QueueFull(f"queue full: the jobs waiting hold {sizes[0]} of payloads and this "
                        f"one {sizes[1]}, over the limit of {sizes[2]} "
                        "(EngineConfig.max_queued_bytes); try again later")


def check_calibrate(repeats: object, settle_s: object, request: object,
                    priority: object, max_payload: int) -> tuple[int, float, bytes | None,
                                                                 int | None]:
    """A calibration's values: repeats 1..100, settle 0..600 s, request bytes, priority."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or \
            not 1 <= repeats <= REPEATS_MAX:
        raise InvalidRequest(f"repeats must be a whole number between 1 and {REPEATS_MAX}, "
                             f"not {repeats!r:.40}")
    settle = check_seconds(settle_s, "settle", maximum=SETTLE_MAX_S, allow_zero=True)
    data = None if request is None else check_payload(request, max_payload, "request")
    return repeats, 1.0 if settle is None else settle, data, check_priority(priority)
