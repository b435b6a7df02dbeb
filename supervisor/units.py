"""Sizes and durations, read and written: the one module that owns how they are spelled.

Every size or duration that a person writes (a descriptor, ``config.yaml``, the environment)
is parsed here, and every one that a person reads (the CLI's tables, the TUI, the HTTP and
control-socket errors, the descriptors vramtui writes) is formatted here.  Where two places
show the same quantity differently, each style is one named function below, so that a caller
picks a style by name and never re-implements one.

Reading (the descriptor grammar):

- :func:`parse_size` — ``12GiB``, ``1536 MiB``, ``12GB``, ``512`` (MiB) → whole MiB, rounded up
- :func:`parse_duration` — ``30s``, ``5m``, ``1h30m``, ``300``, ``never`` → seconds (at most
  10 years)
- :func:`mib_from_gib` — a number of GiB (vramd's calibrated figures) → whole MiB, rounded up
- :func:`digits` — whether text is a whole number written in ASCII digits (``int`` reads it)

Writing what the parsers read back (descriptors, overlays, ``backends describe``):

- :func:`format_size` — the shortest exact form: ``8GiB``, ``1536MiB``
- :func:`format_size_mib` — always in MiB: ``8192MiB`` (a measured figure, to the MiB)
- :func:`format_duration` — ``5m``, ``1h30m``, ``2.5s``, ``never``
- :func:`format_seconds` — always in seconds: ``90s``, ``2.5s``

Writing for people, a size given in MiB:

- :func:`mib_text` — ``1.5 GiB``, ``700 MiB``, ``–`` (the CLI: one decimal of GiB)
- :func:`mib_short` — ``1.5 GiB``, ``123 GiB``, ``n/a``; compact ``1.5G``, ``700M``, ``–``
  (the TUI: whole GiB from 100 GiB up)
- :func:`mib_exact` — ``24 GiB``, ``1.5 GiB``, ``700 MiB`` (a device's size: as many
  decimals as it takes)
- :func:`mib_whole` — ``13056 MiB``, ``–`` (a calibration's figures, never rounded)
- :func:`mib_rounded_up` — ``700 MiB``, ``10.3 GiB``; compact ``10.3G`` (a size to declare:
  never below the figure)

a size given in bytes:

- :func:`bytes_text` — ``64 MiB``, ``1.5 KiB``, ``100 bytes``; with ``always_tenths``
  ``64.0 MiB`` (messages)

and a duration given in seconds:

- :func:`seconds_text` — ``250 ms``, ``1.5 s``, ``3 min``, ``1.5 h``, ``–`` (the CLI)
- :func:`seconds_short` — ``0.4s``, ``12s``, ``3m05s``, ``1h02m``, ``2d03h``, ``–`` (the TUI)
- :func:`seconds_ago` — ``just now``, ``20s ago``, ``3m ago``, ``1h02m ago``, ``2d03h ago``,
  ``never``

Nothing here reads a clock or imports more than the standard library; :mod:`fractions` (for
exact parsing) is imported on first parse, so that printing a table stays cheap to start.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from .errors import brief

MIB = 1024 * 1024  # bytes

# -- reading ---------------------------------------------------------------------------------

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
#: The largest size anyone means: 1 PiB.  Beyond it a figure is a typo, and unbounded it
#: overflowed the control socket's 64-bit integers (every `status` and `backends` failed).
MAX_SIZE_MIB = 1024**3

_DURATION_UNITS: dict[str, tuple[int, int]] = {  # seconds, as a ratio
    "ms": (1, 1000),
    "s": (1, 1),
    "sec": (1, 1),
    "m": (60, 1),
    "min": (60, 1),
    "h": (3600, 1),
    "hr": (3600, 1),
    "d": (86400, 1),
}
_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
MAX_DURATION_TEXT = 100  # characters: longer is no duration anyone means
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|sec|min|hr|s|m|h|d)", re.IGNORECASE)
_INFINITE_WORDS = frozenset({"never", "forever", "inf", "infinity"})
_DURATION_HELP = "(use e.g. 30s, 5m, 1h30m or a number of seconds)"
#: The longest finite duration anyone means: 10 years.  Beyond it a figure is a typo, and
#: unbounded it reached waits that overflow (``99999999999999d`` is 8.64e18 s: a thread's
#: wait of it, or ``time.sleep``, raises OverflowError past about 292 years).
MAX_DURATION_S = 3650 * 86400.0


def digits(text: str) -> bool:
    """Whether ``text`` is ASCII digits only: what a count, port or id given as text must be
    (``str.isdigit`` also takes ``²`` and other scripts' digits, some of which ``int``
    refuses with a ValueError)."""
    return text.isascii() and text.isdigit()


def parse_size(value: object) -> int:
    """A size in whole MiB, or ``ValueError`` with a message for the user.

    An int is MiB; a string is a number and a unit — ``KiB MiB GiB TiB`` (powers of 1024) or
    ``KB MB GB TB`` (powers of 1000), case-insensitive, space optional — or digits alone
    (MiB).  Fractions of a MiB round up: a VRAM figure is better slightly high than low.
    More than :data:`MAX_SIZE_MIB` (1 PiB) is an error.
    """
    from fractions import Fraction

    if isinstance(value, bool):
        raise ValueError(f"{brief(value)} is not a size {_SIZE_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{brief(value)} is negative; a size must be 0 or more")
        return _at_most_max(value, value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"{brief(value)} is not a whole number of MiB {_SIZE_HELP}")
        if value < 0:
            raise ValueError(f"{brief(value)} is negative; a size must be 0 or more")
        return _at_most_max(int(value), value)
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
    return _at_most_max(math.ceil(Fraction(number) * factor / MIB), value)


def _at_most_max(mib: int, value: object) -> int:
    if mib > MAX_SIZE_MIB:
        raise ValueError(f"{brief(value)} is more than 1 PiB, more than any device holds "
                         f"{_SIZE_HELP}")
    return mib


def parse_duration(value: object, *, allow_infinite: bool = False) -> float:
    """Seconds (``math.inf`` for ``never`` when allowed), or ``ValueError`` for the user.

    A number is seconds; a string is one or more ``<number><unit>`` parts with units
    ``ms s m h d`` (``1h30m``), or ``never``/``forever``/``inf`` where infinity is allowed.
    More than :data:`MAX_DURATION_S` (10 years) is ``never`` where infinity is allowed, else
    an error: so a caller with a narrower range of its own parses with ``allow_infinite``
    and its range check refuses infinity in its own words.
    """
    if isinstance(value, bool):
        raise ValueError(f"{brief(value)} is not a duration {_DURATION_HELP}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int past a float's range: more than 10 years, below
            seconds = math.inf if value > 0 else -math.inf
        if math.isnan(seconds):
            raise ValueError(f"{brief(value)} is not a duration {_DURATION_HELP}")
    elif isinstance(value, str):
        seconds = _parse_duration_text(value)
    else:
        raise ValueError(f"{brief(value)} is not a duration {_DURATION_HELP}")
    if seconds < 0:
        raise ValueError(f"{brief(value)} is negative; a duration must be 0 or more")
    # Infinite as written (never, inf, a float's infinity); a number too large for a float
    # ("1e400", 10**400) is one more than 10 years.
    written = isinstance(value, float) or isinstance(value, str) and \
        value.strip().lower() in _INFINITE_WORDS
    if math.isinf(seconds) and written and not allow_infinite:
        raise ValueError(f"{brief(value)}: this duration must be finite {_DURATION_HELP}")
    if seconds > MAX_DURATION_S:
        if allow_infinite:
            return math.inf
        raise ValueError(f"{brief(value)} is more than 10 years, longer than anything here "
                         "waits: write at most 3650d")
    return seconds


def _parse_duration_text(text: str) -> float:
    from fractions import Fraction

    stripped = text.strip()
    if len(stripped) > MAX_DURATION_TEXT:
        raise ValueError(f"{brief(text)} is too long to be a duration {_DURATION_HELP}")
    if stripped.lower() in _INFINITE_WORDS:
        return math.inf
    if _PLAIN_NUMBER.match(stripped):
        # a plain number of seconds, e.g. "300", "1.5" or "1e3" (read as a float: "1e9999999"
        # is infinity at once, where an exact fraction would first build a 10-million-digit
        # integer)
        return float(stripped)
    total = Fraction(0)
    position = 0
    compact = stripped.replace(" ", "")
    for match in _DURATION_PART.finditer(compact):
        if match.start() != position:
            break
        total += Fraction(match.group(1)) * Fraction(*_DURATION_UNITS[match.group(2).lower()])
        position = match.end()
    if position == 0 or position != len(compact):
        raise ValueError(f"{text!r} is not a duration {_DURATION_HELP}")
    try:
        return float(total)
    except OverflowError:
        return math.inf


def mib_from_gib(gib: float) -> int:
    """A number of GiB (as vramd's calibration writes them) in whole MiB, rounded up (the
    safe side; a float's last bit of noise does not add a MiB)."""
    return max(0, math.ceil(float(gib) * 1024 - 1e-6))


# -- writing what the parsers read back ------------------------------------------------------


def format_size(mib: int) -> str:
    """The shortest exact descriptor form: ``8GiB`` or ``1536MiB``; ``parse_size`` reads it back."""
    if mib < 0:
        raise ValueError("a size must be 0 or more")
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib}MiB"


def format_size_mib(mib: int) -> str:
    """A descriptor size always in MiB (``8192MiB``): a measured figure, kept to the MiB."""
    return f"{mib}MiB"


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


def format_seconds(seconds: float) -> str:
    """A descriptor duration always in seconds, to six significant digits: ``90s``, ``2.5s``;
    from 1e6 s (11.6 days) up in whole seconds, ``2592000s``, and under 1e-4 s as a plain
    number, ``1e-05`` (``2.592e+06s`` and ``1e-05s`` did not parse back)."""
    text = f"{seconds:g}"
    if "e" not in text:
        return text + "s"
    return f"{seconds:.0f}s" if seconds >= 1 else text


# -- writing for people: sizes in MiB --------------------------------------------------------


def _gib_or_mib(n: int, gib: Callable[[float], str], *, compact: bool = False) -> str:
    """``n`` MiB in GiB from 1 GiB up (its number written by ``gib``), else in MiB."""
    if abs(n) >= 1024:
        return gib(n / 1024) + ("G" if compact else " GiB")
    return f"{n}M" if compact else f"{n} MiB"


def _tenths(gib: float) -> str:
    return f"{gib:.1f}"


def _tenths_under_100(gib: float) -> str:
    return f"{gib:.1f}" if gib < 100 else f"{gib:.0f}"


def _as_needed(gib: float) -> str:
    return f"{gib:g}"


def mib_text(n: int | None) -> str:
    """``1536`` → ``1.5 GiB``, ``700`` → ``700 MiB``, None → ``–``: the CLI's tables."""
    return "–" if n is None else _gib_or_mib(n, _tenths)


def mib_short(n: int | None, *, compact: bool = False) -> str:
    """The TUI's sizes: ``1.5 GiB`` (whole GiB from 100 GiB up: ``123 GiB``), ``700 MiB``,
    None → ``n/a``; ``compact`` for narrow cells: ``1.5G``, ``700M``, None → ``–``."""
    if n is None:
        return "–" if compact else "n/a"
    return _gib_or_mib(n, _tenths_under_100, compact=compact)


def mib_exact(n: int) -> str:
    """``8192`` → ``8 GiB``, ``1536`` → ``1.5 GiB``, ``700`` → ``700 MiB``: a device's size,
    with as many decimals as it takes."""
    return _gib_or_mib(n, _as_needed)


def mib_whole(n: int | None) -> str:
    """``13056`` → ``13056 MiB``, None → ``–``: a figure to the MiB (calibration reports)."""
    return "–" if n is None else f"{n} MiB"


def mib_rounded_up(n: int, *, compact: bool = False) -> str:
    """A size to declare, never below ``n``: whole MiB under 1 GiB, else GiB rounded *up* to
    a tenth (``10547`` → ``10.3 GiB``; ``compact``: ``10.3G``)."""
    return _gib_or_mib(n, lambda _gib: f"{math.ceil(n * 10 / 1024) / 10:.1f}", compact=compact)


# -- writing for people: sizes in bytes ------------------------------------------------------

_BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def bytes_text(n: int, *, always_tenths: bool = False) -> str:
    """``67108864`` → ``64 MiB``, ``1536`` → ``1.5 KiB``, ``100`` → ``100 bytes`` (messages);
    ``always_tenths``: ``64.0 MiB`` (the engine's request errors)."""
    for unit, size in _BYTE_UNITS:
        if n >= size:
            value = n / size
            if always_tenths or value != int(value):
                return f"{value:.1f} {unit}"
            return f"{value:.0f} {unit}"
    return f"{n} bytes"


# -- writing for people: durations in seconds ------------------------------------------------


def seconds_text(s: float | None) -> str:
    """``0.25`` → ``250 ms``, ``12.3`` → ``12.3 s``, ``300`` → ``5 min``, ``7200`` → ``2.0 h``,
    None → ``–``: the CLI's tables."""
    if s is None:
        return "–"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 90:
        return f"{s:.1f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def seconds_short(seconds: float | None) -> str:
    """The TUI's durations: ``0.4s``, ``12s``, ``3m05s``, ``1h02m``, ``2d03h``; None → ``–``
    (a negative one shows as ``0.0s``; one that is not a number, or infinite, as ``–``).
    From 10 s up whole seconds are cut, not rounded: ``59.6`` is ``59s``, as ``3599.9`` is
    ``59m59s``."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{int(s)}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def seconds_ago(seconds: float | None) -> str:
    """How long ago, in 10 s steps under a minute and in minutes after (calmer tables):
    ``just now``, ``20s ago``, ``3m ago``, ``1h02m ago``, ``14h ago``, ``2d03h ago``,
    ``41d ago``; None → ``never``.  At most 9 cells (the TUI's Last use column): ``25h00m
    ago`` was cut to ``25h00m a…`` there."""
    if seconds is None or not math.isfinite(seconds):
        return "never"
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{int(seconds) // 10 * 10}s ago"
    m = int(seconds // 60)
    h, d = m // 60, m // 1440
    if m < 60:
        return f"{m}m ago"
    if h < 10:
        return f"{h}h{m % 60:02d}m ago"
    if h < 24:
        return f"{h}h ago"
    return f"{d}d{h % 24:02d}h ago" if d < 10 else f"{d}d ago"


def wall_time_text(epoch: float) -> str:
    """An epoch time as people read it here: ``14:05:09`` today, else ``2026-12-03 14:05``."""
    import time

    local = time.localtime(epoch)
    if time.strftime("%Y-%m-%d", local) == time.strftime("%Y-%m-%d"):
        return time.strftime("%H:%M:%S", local)
    return time.strftime("%Y-%m-%d %H:%M", local)
