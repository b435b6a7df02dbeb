"""``Expect: 100-continue``, answered after the checks that need no body, on every path.

A client that sends ``Expect: 100-continue`` waits for a go before it sends its body.  aiohttp
answers the header before any middleware runs: a route's ``expect_handler``, else its own,
which says ``100 Continue`` to anyone.  A client without the token, a page of another site, or
a request for a path that does not exist was asked for its body before it was refused.

So the header is taken off a request as the request is made (:func:`defer`, on the server
that every gated site serves: :func:`.gate.serve`), where aiohttp never sees it, whatever the
route: the door's, the dashboard's sub-app, a path no route matches, ``vramtui web``.  The
innermost middleware, :func:`middleware`, answers it once every middleware before it (the
guard, the limits: a declared length over ``max_body``) let the request through: ``100
Continue`` before the route reads the body; nothing for a path no route matches (its 404 or
405 comes at once, its body never asked for); ``417`` for any other expectation.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from multidict import CIMultiDict, CIMultiDictProxy

from .errors import HttpError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: The ``Expect`` a request came with (taken off its headers by :func:`defer`).
EXPECTED = web.RequestKey("expected", str)
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def defer(server: web.Server) -> None:
    """Make ``server``'s requests without their ``Expect`` header (kept as
    ``request[EXPECTED]``), for :func:`middleware` to answer.  Before any connection is made
    (each takes the server's request factory when it opens)."""
    make = server.request_factory
    if getattr(make, "defers_expect", False):
        return

    def deferring(message: Any, *args: Any, **kwargs: Any) -> web.BaseRequest:
        expect = message.headers.get(hdrs.EXPECT)
        if expect is None:
            return make(message, *args, **kwargs)
        headers = CIMultiDict(message.headers)
        del headers[hdrs.EXPECT]
        message = message._replace(  # (aiohttp's RawRequestMessage: a named tuple)
            headers=CIMultiDictProxy(headers),
            raw_headers=tuple((k, v) for k, v in message.raw_headers
                              if k.lower() != b"expect"))
        request = make(message, *args, **kwargs)
        request[EXPECTED] = expect
        return request

    deferring.defers_expect = True  # type: ignore[attr-defined]
    server.request_factory = deferring


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Innermost: the request passed every check that needs no body; answer its ``Expect``."""
    expect = request.get(EXPECTED)
    if expect is not None and request.match_info.http_exception is None:
        if expect.lower() != "100-continue":
            return HttpError(417, f"Expect: {expect[:80]!r} is not understood (only "
                             "100-continue is)", "invalid_request_error",
                             "expectation_failed").response_for(request)
        if request.version == HttpVersion11:  # (HTTP/1.0 has no 100: the body simply comes)
            await request.writer.write(CONTINUE)
            request.writer.output_size = 0  # (the answer's own size counts from here)
    return await handler(request)
