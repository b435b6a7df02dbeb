"""A frame reader for the control server that survives an oversized request.

:class:`worker_sdk.protocol.Decoder` treats a frame over its limit as fatal (it cannot know
where the next frame starts without reading the body).  A control client that sends too much
deserves an answer, not a broken pipe, so this reader takes over at that point: it reads the
frame's length from the 12-byte header itself, skips exactly that many bytes as they arrive
(into a small scratch buffer, never holding them), reports :class:`Oversized` with the
request's id when it can read it, and carries on with a fresh Decoder.

Sans-I/O, in the asyncio ``BufferedProtocol`` shape: ``get_buffer`` / ``buffer_updated``
(which returns what was decoded).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from worker_sdk.protocol import HEADER_SIZE, Decoder, FrameTooLarge, Message, ProtocolError

# A header announcing more than this is not a request at all: answer and hang up.
ABSURD_FRAME = 1 << 36
_SCRATCH = 256 * 1024
_PROBE = 24  # bytes of an oversized body kept to read its id


@dataclass(frozen=True, slots=True)
class Oversized:
    """A request frame over the limit, skipped; ``msg_id`` is 0 when it could not be read."""

    msg_id: int
    length: int
    limit: int
    fatal: bool = False


Item = Message | Oversized | ProtocolError


def _probe_id(body: bytes) -> int:
    """The id of a frame body encoded the usual way (a map whose first key is ``id``)."""
    if len(body) < 5 or not (0x80 <= body[0] <= 0x8F or body[0] in (0xDE, 0xDF)):
        return 0
    at = {0xDE: 3, 0xDF: 5}.get(body[0], 1)
    if body[at : at + 3] != b"\xa2id":
        return 0
    at += 3
    if at >= len(body):
        return 0
    tag = body[at]
    if tag < 0x80:
        return tag
    sizes = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
    n = sizes.get(tag)
    if n is None or at + 1 + n > len(body):
        return 0
    return int.from_bytes(body[at + 1 : at + 1 + n], "big")


class RequestReader:
    """Frames in, :class:`Message` / :class:`Oversized` / :class:`ProtocolError` out."""

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self.dead = False  # a fatal error: the connection must be closed
        self._decoder = Decoder(max_frame_size)
        self._view: memoryview | None = None
        self._tail = b""  # the last (< 12) undecoded bytes from earlier chunks
        self._skip = 0  # bytes of an oversized frame still to skip
        self._skip_frame: tuple[int, int] = (0, 0)  # (length, fatal)
        self._probe = b""
        self._scratch = bytearray(_SCRATCH)

    def get_buffer(self, sizehint: int = 64 * 1024) -> memoryview:
        if self._skip:
            self._view = memoryview(self._scratch)
        else:
            self._view = self._decoder.get_buffer(sizehint)
        return self._view[:]  # the caller may release its view; ours stays valid

    def buffer_updated(self, nbytes: int) -> list[Item]:
        view = self._view
        assert view is not None
        self._view = None
        if not self._skip:
            chunk = view[:nbytes]
            self._decoder.buffer_updated(nbytes)
            return self._drain(chunk)
        data = view[:nbytes]
        if len(self._probe) < _PROBE:
            self._probe += bytes(data[: _PROBE - len(self._probe)])
        if nbytes < self._skip:
            self._skip -= nbytes
            return []
        leftover = bytes(data[self._skip :])
        self._skip = 0
        out: list[Item] = [self._skipped()]
        if leftover:
            self._decoder.feed(leftover)
            out += self._drain(memoryview(leftover))
        return out

    def feed(self, data: bytes) -> list[Item]:
        """Everything in ``data`` (tests; the server uses get_buffer/buffer_updated)."""
        out: list[Item] = []
        view = memoryview(data)
        while view.nbytes:
            buf = self.get_buffer(view.nbytes)
            n = min(len(buf), view.nbytes)
            buf[:n] = view[:n]
            buf.release()
            out += self.buffer_updated(n)
            view = view[n:]
        return out

    def _skipped(self) -> Oversized:
        length, fatal = self._skip_frame
        return Oversized(_probe_id(self._probe), length, self.max_frame_size, bool(fatal))

    def _drain(self, chunk: memoryview) -> list[Item]:
        out: list[Item] = []
        while not self.dead:
            try:
                message = self._decoder.next()
            except FrameTooLarge as exc:
                unread = (self._tail + bytes(chunk))[-self._decoder.buffered :]
                return out + self._oversized(exc, unread)
            except ProtocolError as exc:
                out.append(exc)
                if exc.fatal:
                    self.dead = True
                continue
            if message is None:
                break
            out.append(message)
        pending = self._decoder.buffered
        if 0 < pending < HEADER_SIZE:
            self._tail = (self._tail + bytes(chunk[-HEADER_SIZE:]))[-pending:]
        else:
            self._tail = b""
        return out

    def _oversized(self, exc: FrameTooLarge, unread: bytes) -> list[Item]:
        (length,) = struct.unpack_from(">Q", unread)
        assert length == exc.length
        self._decoder = Decoder(self.max_frame_size)
        self._tail = b""
        fatal = length > ABSURD_FRAME
        self._skip_frame = (length, int(fatal))
        total = HEADER_SIZE + length
        self._probe = unread[HEADER_SIZE : HEADER_SIZE + _PROBE]
        if fatal:
            self.dead = True
            return [self._skipped()]
        if len(unread) < total:
            self._skip = total - len(unread)
            return []
        out: list[Item] = [self._skipped()]
        leftover = unread[total:]
        if leftover:
            self._decoder.feed(leftover)
            out += self._drain(memoryview(leftover))
        return out
