"""Sizes (normalised to whole MiB) and durations (seconds) as written in descriptors.

Sizes: an int is MiB; a string is a number and a unit — ``KiB MiB GiB TiB`` (powers of 1024) or
``KB MB GB TB`` (powers of 1000), case-insensitive, space optional — or digits alone (MiB).
Fractions of a MiB round up: a VRAM figure is better slightly high than slightly low.

Durations: a number is seconds; a string is one or more ``<number><unit>`` parts with units
``ms s m h d`` (``1h30m``), or ``never``/``forever``/``inf`` where an infinite duration is allowed.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .errors import brief

MIB = 1024 * 1024

_SIZE_UNITS: dict[str, int] = {
    "kib": 1024,
    "mib": MIB,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE_RE = re.compile(r"^\s*([+-]?)(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_SIZE_HELP = "(use e.g. 12GiB or 12288)"

_DURATION_UNITS: dict[str, Fraction] = {
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "sec": Fraction(1),
    "m": Fraction(60),
    "min": Fraction(60),
    "h": Fraction(3600),
    "hr": Fraction(3600),
    "d": Fraction(86400),
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|sec|min|hr|s|m|h|d)", re.IGNORECASE)
_INFINITE_WORDS = frozenset({"never", "forever", "inf", "infinity"})
_DURATION_HELP = "(use e.g. 30s, 5m, 1h30m or a number of seconds)"


def parse_size(value: object) -> int:
    """Return a size in whole MiB, or raise ``ValueError`` with a message for the user."""
    if isinstance(value, bool):
        raise ValueError(f"{brief(value)} is not a size {_SIZE_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{brief(value)} is negative; a size must be 0 or more")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"{brief(value)} is not a whole number of MiB {_SIZE_HELP}")
        if value < 0:
            raise ValueError(f"{brief(value)} is negative; a size must be 0 or more")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"{brief(value)} is not a size {_SIZE_HELP}")
    match = _SIZE_RE.match(value)
    if match is None:
        raise ValueError(f"{brief(value)} is not a size {_SIZE_HELP}")
    sign, number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower()) if unit else MIB
    if factor is None:
        raise ValueError(f"{brief(value)} has an unknown unit {unit!r} {_SIZE_HELP}")
    if sign == "-" and Fraction(number) != 0:
        raise ValueError(f"{brief(value)} is negative; a size must be 0 or more")
    return math.ceil(Fraction(number) * factor / MIB)


def format_size(mib: int) -> str:
    """The shortest exact descriptor form: ``8GiB`` or ``1536MiB``; ``parse_size`` reads it back."""
    if mib < 0:
        raise ValueError("a size must be 0 or more")
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib}MiB"


def parse_duration(value: object, *, allow_infinite: bool = False) -> float:
    """Return seconds (``math.inf`` for ``never`` when allowed), or raise ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"{brief(value)} is not a duration {_DURATION_HELP}")
    if isinstance(value, int | float):
        seconds = float(value)
        if math.isnan(seconds):
            raise ValueError(f"{brief(value)} is not a duration {_DURATION_HELP}")
    elif isinstance(value, str):
        seconds = _parse_duration_text(value)
    else:
        raise ValueError(f"{brief(value)} is not a duration {_DURATION_HELP}")
    if seconds < 0:
        raise ValueError(f"{brief(value)} is negative; a duration must be 0 or more")
    if math.isinf(seconds) and not allow_infinite:
        raise ValueError(f"{brief(value)}: this duration must be finite {_DURATION_HELP}")
    return seconds


def _parse_duration_text(text: str) -> float:
    stripped = text.strip()
    if stripped.lower() in _INFINITE_WORDS:
        return math.inf
    try:
        return float(Fraction(stripped))  # a plain number of seconds, e.g. "300" or "1.5"
    except (ValueError, ZeroDivisionError):
        pass
    total = Fraction(0)
    position = 0
    compact = stripped.replace(" ", "")
    for match in _DURATION_PART.finditer(compact):
        if match.start() != position:
            break
        total += Fraction(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]
        position = match.end()
    if position == 0 or position != len(compact):
        raise ValueError(f"{text!r} is not a duration {_DURATION_HELP}")
    return float(total)


def format_duration(seconds: float) -> str:
    """A short descriptor form (``5m``, ``1h30m``, ``2.5s``, ``never``) that parses back."""
    if math.isinf(seconds) and seconds > 0:
        return "never"
    if seconds < 0 or math.isnan(seconds):
        raise ValueError("a duration must be 0 or more")
    if not float(seconds).is_integer():
        text = repr(float(seconds))
        return text if "e" in text else text + "s"  # "1e-05" is read back as plain seconds
    whole = int(seconds)
    if whole == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)
