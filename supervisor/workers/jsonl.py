"""vramd's worker protocol, sans I/O: one JSON object a line, commands in, events out.

The engine writes commands to the worker's stdin — ``load {kwargs}``, ``generate {request}``,
``unload``, ``abort``, ``ping``, ``shutdown`` — and reads events from its stdout: ``ready
{vram_mib}``, ``progress {pct, msg}``, ``done {result}``, ``unloaded``, ``pong``, ``error
{error, error_code}`` (vramd 0.3.9's ``vramd/worker/protocol.py``). Logs go to stderr, never
here. ``encode`` makes a command line; ``LineDecoder`` turns the bytes read into events, with a
limit on a line's length (a longer line is dropped whole and reported, never kept growing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..jsonline import dumps_line

CMD_LOAD = "load"
CMD_GENERATE = "generate"
CMD_UNLOAD = "unload"
CMD_ABORT = "abort"
CMD_PING = "ping"
CMD_SHUTDOWN = "shutdown"

EVENT_READY = "ready"
EVENT_PROGRESS = "progress"
EVENT_DONE = "done"
EVENT_UNLOADED = "unloaded"
EVENT_PONG = "pong"
EVENT_ERROR = "error"

ERR_CANCELLED = "CANCELLED"
DEFAULT_MAX_LINE = 64 * 1024 * 1024  # a done event carries the whole result


def encode(cmd: str, **fields: Any) -> bytes:
    """One command as a line of UTF-8 JSON (raises TypeError/ValueError if not JSON data)."""
    return dumps_line({"cmd": cmd, **fields}).encode("utf-8") + b"\n"


@dataclass(frozen=True, slots=True)
class Garbage:
    """A line that is not an event (not JSON, not an object, too long): what was wrong."""

    problem: str
    too_long: bool = False  # a whole line dropped: maybe the result a job waits for


class LineDecoder:
    """Bytes from the worker's stdout in, events (dicts with an ``event`` string) out."""

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        self._skipping = False  # inside a line that was over the limit

    def feed(self, data: bytes) -> list[dict[str, Any] | Garbage]:
        out: list[dict[str, Any] | Garbage] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                self._buffer += data[start:end]
                if len(self._buffer) > self.max_line:
                    out.append(self._too_long())
                elif self._buffer.strip():
                    out.append(self._parse(bytes(self._buffer)))
            self._buffer.clear()
            start = end + 1
        if not self._skipping:
            self._buffer += data[start:]
            if len(self._buffer) > self.max_line:
                out.append(self._too_long())
                self._buffer.clear()
                self._skipping = True
        return out

    def end(self) -> list[dict[str, Any] | Garbage]:
        """At EOF: a last line without its newline still counts (a worker that died after
        writing it)."""
        rest, self._buffer = bytes(self._buffer), bytearray()
        if self._skipping or not rest.strip():
            return []
        return [self._parse(rest)]

    def _too_long(self) -> Garbage:
        return Garbage(f"a line over {self.max_line} bytes (dropped)", too_long=True)

    @staticmethod
    def _parse(line: bytes) -> dict[str, Any] | Garbage:
        text = line.strip()
        try:
            message = json.loads(text)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            return Garbage(f"not JSON ({type(exc).__name__}: {exc}): {text[:80]!r}")
        if not isinstance(message, dict) or not isinstance(message.get("event"), str):
            return Garbage(f"not an event object: {text[:80]!r}")
        return message
