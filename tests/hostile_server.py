"""A hostile HTTP model server, for the red team's tests: it answers as an attacker would.

``python tests/hostile_server.py --port N``: raw sockets (no HTTP library smooths what it
sends), one request per connection.  What it answers depends on the request's path:

- ``/health``: 200;
- ``/raw…``: 200 ``text/plain``, the request exactly as it arrived (its head and body), so
  a test sees what the relay forwarded;
- ``/html``: 200 ``text/html`` with a script, and every header a server should never be able
  to set on the door's origin: ``Set-Cookie``, ``Location``, ``Refresh``, CORS, its own CSP;
- ``/status/NNN``: status ``NNN`` (any three characters), with a body;
- ``/redirect?to=URL``: a 302 to ``URL`` (a websocket's handshake too);
- ``/fail``: a 500 whose body holds escape sequences and a line break (as does stderr with
  ``--die-loudly``, which exits at once);
- ``/control``: a header whose value holds ``\\x01``;
- ``/endless-headers``: headers, forever;
- ``/huge-header``: one header of 1 MiB;
- ``/endless``: a chunked ``text/event-stream`` body, forever.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

HEAD_LIMIT = 1 << 20
# What a terminal would act on: set its title, clear it, write the clipboard; and a line break
# that would forge a line of the engine's log.
TERMINAL_ATTACK = ("\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x1b\\ boom\n"
                   "2026-01-01 [info] a forged line \u202e")


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        writer.close()
        return
    body = b""
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            with contextlib.suppress(ValueError, asyncio.IncompleteReadError):
                body = await reader.readexactly(int(line.split(b":", 1)[1]))
    path = head.split(b" ", 2)[1] if head.count(b" ") >= 2 else b"/"
    try:
        await answer(path, head + body, writer)
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


def plain(status: str, body: bytes, *headers: bytes) -> bytes:
    extra = b"".join(h + b"\r\n" for h in headers)
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Length: %d\r\n" % len(body) + extra
            + b"Connection: close\r\n\r\n" + body)


async def answer(path: bytes, seen: bytes, writer: asyncio.StreamWriter) -> None:
    if path.startswith(b"/health"):
        writer.write(plain("200 OK", b"ok", b"Content-Type: text/plain"))
    elif path.startswith(b"/raw"):
        writer.write(plain("200 OK", seen, b"Content-Type: text/plain"))
    elif path.startswith(b"/html"):
        writer.write(plain("200 OK", b"<html><script>fetch('/v1/backends/unload',"
                           b"{method:'POST'})</script></html>",
                           b"Content-Type: text/html", b"Set-Cookie: session=stolen; Path=/",
                           b"Location: https://evil.example/", b"Refresh: 0; url=https://evil",
                           b"Access-Control-Allow-Origin: *",
                           b"Access-Control-Allow-Credentials: true",
                           b"Content-Security-Policy: script-src *"))
    elif path.startswith(b"/status/"):
        code = path.split(b"/")[2][:3]
        writer.write(b"HTTP/1.1 " + code + b" Whatever\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: 5\r\nConnection: close\r\n\r\nbody!")
    elif path.startswith(b"/redirect?to="):
        writer.write(plain("302 Found", b"", b"Location: " + path.split(b"=", 1)[1]))
    elif path.startswith(b"/fail"):
        writer.write(plain("500 Oops", TERMINAL_ATTACK.encode(), b"Content-Type: text/plain"))
    elif path.startswith(b"/control"):
        writer.write(plain("200 OK", b"x", b"Content-Type: text/plain", b"X-Note: a\x01b"))
    elif path.startswith(b"/huge-header"):
        writer.write(plain("200 OK", b"x", b"X-Big: " + b"a" * HEAD_LIMIT))
    elif path.startswith(b"/endless-headers"):
        writer.write(b"HTTP/1.1 200 OK\r\n")
        n = 0
        while True:
            writer.write(b"X-More-%d: %s\r\n" % (n, b"b" * 100))
            n += 1
            await writer.drain()
    elif path.startswith(b"/endless"):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"data: " + b"z" * 4000 + b"\n\n"
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
    else:
        writer.write(plain("404 Not Found", b"no"))
    await writer.drain()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--die-loudly", action="store_true",
                    help="write escape sequences to stderr and exit at once")
    args = ap.parse_args()
    if args.die_loudly:
        sys.stderr.write(TERMINAL_ATTACK + "\n")
        sys.stderr.flush()
        raise SystemExit(3)
    server = await asyncio.start_server(handle, "127.0.0.1", args.port, limit=HEAD_LIMIT * 2)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
