"""A frame reader for the control server that decides about a frame before holding it.

:class:`worker_sdk.protocol.Decoder` grows its buffer to a frame's announced length as soon as
it has read the 12-byte header, so a client that announces 64 MiB and then sends nothing more
makes the engine hold 64 MiB.  This reader receives into a small scratch buffer of its own,
follows the frame boundaries itself, and hands the decoder only the frames it decided to take,
so it knows each frame's length before the decoder makes room for it.  Then:

- a frame over ``max_frame_size`` is skipped as it arrives (into a small scratch buffer, never
  held) and reported as :class:`Oversized` with the request's id when it can be read — the
  client deserves an answer, not a broken pipe; a length beyond any sense ends the connection;
- a frame over ``BIG_FRAME`` bytes is held only if ``admit(length)`` says so (the server's
  budget for request bytes being received, all connections together); refused, it is skipped
  the same way and reported as :class:`Busy`.  ``release(length)`` gives the bytes back when
  the frame is complete, skipped, or the reader is closed;
- after a big frame the decoder is replaced, so its grown buffer is not kept for the life of
  the connection.

``partial`` tells whether a frame is half received (for the server's per-frame deadline).
Sans-I/O, in the asyncio ``BufferedProtocol`` shape: ``get_buffer`` / ``buffer_updated``
(which returns what was decoded).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from worker_sdk.protocol import HEADER_SIZE, Decoder, Message, ProtocolError

# A header announcing more than this is not a request at all: answer and hang up.
ABSURD_FRAME = 1 << 36
BIG_FRAME = 64 * 1024  # frames larger than this need the server's budget
_SCRATCH = 64 * 1024
_PROBE = 24  # bytes of a skipped body kept to read its id
_LENGTH = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class Oversized:
    """A request frame over the limit, skipped; ``msg_id`` is 0 when it could not be read."""

    msg_id: int
    length: int
    limit: int
    fatal: bool = False


@dataclass(frozen=True, slots=True)
class Busy:
    """A big request frame skipped because the server's budget for them was spent."""

    msg_id: int
    length: int


Item = Message | Oversized | Busy | ProtocolError


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
    """Frames in, :class:`Message` / :class:`Oversized` / :class:`Busy` / errors out."""

    def __init__(self, max_frame_size: int, *, admit: Callable[[int], bool] | None = None,
                 release: Callable[[int], None] | None = None) -> None:
        self.max_frame_size = max_frame_size
        self.dead = False  # a fatal error: the connection must be closed
        self._admit = admit
        self._release = release
        self._decoder = Decoder(max_frame_size)
        self._scratch = bytearray(_SCRATCH)
        # The frame being received: its header bytes so far, then its body length and how
        # much of the body is still to come.
        self._hdr = bytearray()
        self._length = -1  # -1 while the header is incomplete
        self._left = 0
        self._probe = bytearray()
        self._held = 0  # budget bytes the current frame holds
        self._skipping: Oversized | Busy | None = None  # the frame being skipped
        self._big_done = False  # a big frame was decoded: replace the decoder when idle
        self.frames_begun = 0  # headers read so far (tells one partial frame from the next)

    @property
    def partial(self) -> bool:
        """A frame has begun and is not complete yet."""
        return bool(self._hdr) or self._length >= 0

    @property
    def held(self) -> int:
        """Bytes of the server's budget the frame being received holds."""
        return self._held

    # -- the BufferedProtocol shape -----------------------------------------------------------
    def get_buffer(self, sizehint: int = 64 * 1024) -> memoryview:
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> list[Item]:
        with memoryview(self._scratch) as whole:
            return self._consume(whole[:nbytes])

    def feed(self, data: bytes) -> list[Item]:
        """Everything in ``data`` (tests; the server uses get_buffer/buffer_updated)."""
        out: list[Item] = []
        view = memoryview(data)
        while view.nbytes and not self.dead:
            n = min(len(self._scratch), view.nbytes)
            self._scratch[:n] = view[:n]
            out += self.buffer_updated(n)
            view = view[n:]
        return out

    def close(self) -> None:
        """Give back any budget held (the connection is gone)."""
        self._give_back()
        self.dead = True

    # -- inside -------------------------------------------------------------------------------
    def _consume(self, chunk: memoryview) -> list[Item]:
        out: list[Item] = []
        n = chunk.nbytes
        at = 0
        span = 0  # start of the bytes of this chunk still to hand to the decoder
        while at < n and not self.dead:
            if self._length < 0:  # in a header
                started = at - len(self._hdr)  # < 0: it began in an earlier chunk
                take = min(HEADER_SIZE - len(self._hdr), n - at)
                self._hdr += chunk[at : at + take]
                at += take
                if len(self._hdr) < HEADER_SIZE:
                    break
                (length,) = _LENGTH.unpack_from(self._hdr)
                self.frames_begun += 1
                verdict = self._begin(length)
                if verdict is None:
                    if started < 0:  # its first bytes were held back: hand them over now
                        self._decoder.feed(self._hdr)
                        span = at
                else:
                    out += self._hand_over(chunk[span : max(span, started)])
                    if isinstance(verdict, Oversized) and verdict.fatal:
                        self.dead = True
                        return [*out, verdict]
                    self._skipping = verdict
                    self._probe.clear()
                self._length = self._left = length
            take = min(self._left, n - at)
            if self._skipping is not None and len(self._probe) < _PROBE:
                self._probe += chunk[at : at + min(take, _PROBE - len(self._probe))]
            self._left -= take
            at += take
            if self._left == 0:
                if self._skipping is not None:
                    out.append(self._skipped())
                    span = at
                else:
                    self._end_frame()
        if self._skipping is None and not self.dead:
            end = at - len(self._hdr) if self._length < 0 else at  # hold back a partial header
            out += self._hand_over(chunk[span : max(span, end)])
        if self._big_done and not self.partial and self._decoder.buffered == 0:
            self._decoder = Decoder(self.max_frame_size)  # let its grown buffer go
            self._big_done = False
        return out

    def _hand_over(self, data: memoryview) -> list[Item]:
        """Give ``data`` (whole frames, or the start of one) to the decoder; what it decoded."""
        if data.nbytes:
            self._decoder.feed(data)
        return self._drain()

    def _begin(self, length: int) -> Oversized | Busy | None:
        if length > self.max_frame_size:
            return Oversized(0, length, self.max_frame_size, fatal=length > ABSURD_FRAME)
        if length > BIG_FRAME and self._admit is not None:
            if not self._admit(length):
                return Busy(0, length)
            self._held = length
        return None

    def _end_frame(self) -> None:
        if self._length > BIG_FRAME:
            self._big_done = True
        self._give_back()
        self._hdr.clear()
        self._length = -1

    def _give_back(self) -> None:
        if self._held and self._release is not None:
            self._release(self._held)
        self._held = 0

    def _skipped(self) -> Oversized | Busy:
        """The frame being skipped is over: what to report about it."""
        what = self._skipping
        assert what is not None
        self._skipping = None
        self._hdr.clear()
        self._length = -1
        msg_id = _probe_id(bytes(self._probe))
        if isinstance(what, Oversized):
            return Oversized(msg_id, what.length, what.limit, what.fatal)
        return Busy(msg_id, what.length)

    def _drain(self) -> list[Item]:
        out: list[Item] = []
        while not self.dead:
            try:
                message = self._decoder.next()
            except ProtocolError as exc:
                out.append(exc)
                if exc.fatal:
                    self.dead = True
                continue
            if message is None:
                break
            out.append(message)
        return out
