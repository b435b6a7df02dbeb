"""A streamed answer's head and its first chunk, when both are at hand, leave in one send.

The client of a model server is woken once for both (a head sent alone wakes it for nothing:
on a busy two-core machine that is a context switch on the time to the first token); a head
that came alone still goes out at once (``web.StreamResponse``), before the first chunk.
"""

from __future__ import annotations

import asyncio
from unittest import mock

from aiohttp import web
from aiohttp.http_writer import StreamWriter
from aiohttp.test_utils import make_mocked_request

from supervisor.http.forward import HeadWithFirstChunk


def _request(loop: asyncio.AbstractEventLoop) -> tuple[web.Request, list[bytes]]:
    sent: list[bytes] = []
    transport = mock.Mock()
    transport.is_closing.return_value = False
    transport.write.side_effect = lambda data: sent.append(bytes(data))
    transport.writelines.side_effect = lambda chunks: sent.append(b"".join(chunks))
    protocol = mock.Mock(transport=transport)
    writer = StreamWriter(protocol, loop)
    return make_mocked_request("POST", "/v1/chat/completions", writer=writer,
                               transport=transport, protocol=protocol, loop=loop), sent


def _answer(kind: type[web.StreamResponse]) -> list[bytes]:
    async def run() -> list[bytes]:
        request, sent = _request(asyncio.get_running_loop())
        response = kind(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        before = len(sent)
        await response.write(b"data: {}\n\n")
        return [b"%d" % before, *sent]

    return asyncio.run(run())


def test_the_head_waits_for_the_first_chunk_and_both_go_in_one_send() -> None:
    before, *sent = _answer(HeadWithFirstChunk)
    assert before == b"0"  # nothing went at prepare
    assert len(sent) == 1
    assert sent[0].startswith(b"HTTP/1.1 200 OK\r\n") and b"data: {}\n\n" in sent[0]


def test_a_head_that_came_alone_goes_at_once() -> None:
    before, *sent = _answer(web.StreamResponse)
    assert before == b"1"
    assert len(sent) == 2 and sent[0].startswith(b"HTTP/1.1 200 OK\r\n")
