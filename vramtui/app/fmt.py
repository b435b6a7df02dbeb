"""Small formatting helpers shared by the widgets and screens: state colours, bars, previews.

Sizes and durations are :mod:`supervisor.units`' TUI styles, under the short names the
screens use: ``fmt.mib`` (``1.5 GiB``; compact ``1.5G``), ``fmt.dur`` (``3m05s``) and
``fmt.ago`` (``20s ago``).  Everything here is pure (no Textual, no clock reads) so it is
cheap and testable.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.text import Text

from supervisor import units
from supervisor.textsafe import visible

if TYPE_CHECKING:
    from supervisor.snapshot import EngineSnapshot

# supervisor.units' TUI styles, under the names the screens use.
mib = units.mib_short
dur = units.seconds_short
ago = units.seconds_ago

BLOCKS = " ▁▂▃▄▅▆▇█"
HBLOCKS = " ▏▎▍▌▋▊▉█"

# Colours of backend (worker) states and job states.
BACKEND_STATE_STYLE = {
    "cold": "dim",
    "starting": "yellow",
    "initializing": "yellow",
    "ready": "green",
    "busy": "bold cyan",
    "asleep": "#61afef",  # its memory given back, its process kept: a wake away
    "stopping": "#c678dd",
    "crashed": "bold red",
    "failed": "bold reverse red",
}
JOB_STATE_STYLE = {
    "queued": "yellow",
    "starting": "bold yellow",
    "running": "bold cyan",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "#c678dd",
    "timed_out": "bold red",
}
LEVEL_STYLE = {"debug": "dim", "info": "", "warning": "yellow", "error": "bold red"}

# The memory bar's segments (also used by the legend and the help screen).
SEG_OURS = "#8ae234"
SEG_RESERVED = "#2e7d32"
SEG_OVER = "bold #ff3b3b"
SEG_FOREIGN = "#c678dd"
SEG_FREE = "#4d4d4d"
SIM_BADGE = "bold yellow on #8b008b"
SIM_FIGURE = "#d7afff"  # memory figures measured on a simulated GPU


@dataclass(frozen=True)
class Clocks:
    """Where the app reads time: the engine's monotonic clock, wall time, and local time.

    The real app uses the system clocks (the engine runs on the same host, and
    ``CLOCK_MONOTONIC`` is system-wide); snapshot tests inject fixed ones.
    """

    mono: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    localtime: Callable[[float], time.struct_time] = field(default=time.localtime)

    def hms(self, t: float) -> str:
        return time.strftime("%H:%M:%S", self.localtime(t))


def engine_now(snap: EngineSnapshot | None, clocks: Clocks) -> float:
    """What an engine time (a job's, a backend's ``last_used``) is measured against: the
    instant its snapshot was taken, by the same clock (so a step of the system clock since
    the engine started moves no age); the system's wall clock only without a snapshot."""
    return snap.taken_at if snap is not None else clocks.wall()


def state_text(state: str, styles: dict[str, str]) -> Text:
    return Text(state, style=styles.get(state, ""))


def progress_bar(fraction: float | None, width: int = 10) -> Text:
    """A bar of block characters with eighths, then the percentage."""
    if fraction is None:
        return Text("·" * width + "   ?%", style="dim")
    f = min(1.0, max(0.0, fraction))
    eighths = round(f * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (HBLOCKS[part] if part and full < width else "")
    text = Text(bar.ljust(width, " "), style="#3fb7e8 on #303845")
    text.append(f" {f * 100:3.0f}%", style="bold")
    return text


def payload_preview(data: bytes | None, limit: int = 2000) -> str:
    """A job's result (or request) for a human: pretty JSON, text, or a size and hex head for
    binary.  Its bytes are anyone's (a worker's answer, a client's request): every control
    character is written out (line breaks kept), so none acts on the terminal."""
    if data is None:
        return "(none)"
    if not data:
        return "(empty)"
    try:
        text = data.decode()
    except UnicodeDecodeError:
        head = data[:32].hex(" ")
        return f"{len(data)} bytes of binary: {head}{' …' if len(data) > 32 else ''}"
    with contextlib.suppress(ValueError):
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    if len(text) > limit:
        text = text[:limit] + f"\n… ({len(data)} bytes in all)"
    return visible(text, lines=True)


def matches(query: str, *fields: object) -> bool:
    """Case-insensitive substring filter over the given fields (empty query matches all)."""
    if not query:
        return True
    q = query.lower()
    return any(q in str(f).lower() for f in fields if f is not None)


def short_path(path: str | os.PathLike[str] | None) -> str:
    """A path for a human: ``~/...`` under the home directory, else as given."""
    if not path:
        return "–"
    text = os.fspath(path)
    home = os.path.expanduser("~")
    if home not in ("", "/") and (text == home or text.startswith(home.rstrip("/") + "/")):
        return "~" + text[len(home.rstrip("/")):]
    return text
