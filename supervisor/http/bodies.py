"""A request's body: read, decoded and parsed once, here, whatever route reads it, and what
each step may cost bounded before it is paid.

- :func:`read_body`: its bytes.  A ``Content-Encoding: gzip`` body is unzipped here (the
  door's connections leave aiohttp's decoding off, :mod:`.gate`: aiohttp never checked that a
  gzip body ended, so one cut short went on as if it were whole): one that does not unzip
  whole is a 400, one that unzips past ``max_body`` a 413.
- :func:`read_json`: its JSON, parsed once per request (the OpenAI door's look at its model
  and its route share the one parse), at most :data:`MAX_JSON_DEPTH` deep and
  :data:`MAX_JSON_ITEMS` values and keys.  Those are counted on the bytes before anything is
  parsed: a body of empty objects at the size limit became 1.5 GB of objects and twenty
  seconds of the engine's loop (which serves every client) a parse.
- :func:`read_form`: a ``multipart/form-data`` body's parts, split on its boundary by
  searching its bytes (the email package took a millisecond of the loop a part, and longer a
  line of a file), at most :data:`MAX_FORM_PARTS` parts with :data:`MAX_PART_HEAD` bytes of
  headers each.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.message
import email.parser
import email.policy
import gc
import json
import operator
import quopri
import re
import zlib
from itertools import accumulate, chain
from typing import Any

from aiohttp import web

from ..errors import brief
from .errors import HttpError, bad_request

MAX_JSON_DEPTH = 100  # a request body; a job's input and metadata have tighter limits
MAX_JSON_ITEMS = 1_000_000  # values and keys in one JSON body (~70 MB of objects at most)
MAX_FORM_PARTS = 100  # a form's fields and files (a transcription's are a dozen)
MAX_PART_HEAD = 16 * 1024  # the headers of one part of a form
UNZIP_OFF_LOOP = 256 * 1024  # a gzip body this large (compressed) unzips in a thread
MAX_GZIP_MEMBERS = 1000  # gzip streams one after another in one body (a writer's is one)
GZIP_SLICE = 64 * 1024  # of a gzip body, fed to zlib at a time

_BODY = web.RequestKey("body", bytes)
_JSON = web.RequestKey("json", object)
_FORM = web.RequestKey("form", list)
_NOT_MARKS = bytes(b for b in range(256) if b not in b'",:[]{}')
_ONE_BRACKET = bytes.maketrans(b"{}", b"[]")
_CLOSING = re.compile(rb"\]+")
FEW_TURNS = 100_000  # of a body's brackets, from closing to opening: counted one by one
_BLANK = re.compile(rb"\r?\n\r?\n")  # the end of a part's headers


# -- bytes ------------------------------------------------------------------------------------
async def read_body(request: web.Request) -> bytes:
    """The request's body, gzip undone (400: it does not unzip whole; 413: past the limit)."""
    body = request.get(_BODY)
    if body is None:
        raw = await request.read()  # (413 past client_max_size: the door's max_body)
        body = raw
        if raw and request.headers.get("Content-Encoding", "").strip().lower() == "gzip":
            limit = request.client_max_size
            if len(raw) > UNZIP_OFF_LOOP:  # (zlib lets go of the GIL: the loop goes on)
                loop = asyncio.get_running_loop()
                body = await loop.run_in_executor(None, gunzip, raw, limit)
            else:
                body = gunzip(raw, limit)
        request[_BODY] = body
    return body


def gunzip(raw: bytes, limit: int) -> bytes:
    """``raw`` unzipped: every gzip member in it, each to its end (its size and CRC checked),
    at most ``limit`` bytes out and :data:`MAX_GZIP_MEMBERS` members; zeros after the last
    are padding, as ``gzip.decompress`` reads them.  The body is fed to zlib a slice at a
    time: what a member left over (``unused_data``) was the whole rest of the body, copied
    once a member (160,000 empty members, 3 MB, held a thread 30 s)."""
    out = bytearray()
    view = memoryview(raw)
    at = members = 0
    while at < len(raw):
        if members == MAX_GZIP_MEMBERS:
            raise _unreadable(f"it holds more than {MAX_GZIP_MEMBERS} gzip members")
        if members and raw[at] == 0 and raw.count(0, at) == len(raw) - at:  # (padding: no member)
            break
        members += 1
        unzip = zlib.decompressobj(wbits=31)  # gzip's header and trailer, checked
        while not unzip.eof and at < len(raw):
            piece = view[at:at + GZIP_SLICE]
            at += len(piece)
            try:
                out += unzip.decompress(piece, limit + 1 - len(out))
            except zlib.error as exc:
                raise _unreadable(f"it is not gzip as its Content-Encoding says ({exc})") \
                    from None
            if len(out) > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(out))
        if not unzip.eof:
            raise _unreadable("its gzip data ends before the gzip stream does (cut short?)")
        at -= len(unzip.unused_data)  # (the next member's start, in the last slice)
    return bytes(out)


def _unreadable(why: str) -> HttpError:
    return HttpError(400, f"the request body cannot be read: {why}; send it whole",
                     "invalid_request_error", "unreadable_body")


# -- JSON -------------------------------------------------------------------------------------
async def read_json(request: web.Request) -> Any:
    """The request's JSON body, parsed once (400 when it is not JSON or nests deeper than
    :data:`MAX_JSON_DEPTH`; 413 past the size limit or :data:`MAX_JSON_ITEMS`)."""
    if _JSON in request:
        return request[_JSON]
    raw = await read_body(request)
    body = parse_json(raw)
    request[_JSON] = body
    return body


def parse_json(raw: bytes) -> Any:
    """JSON text ``raw`` parsed, its cost bounded first (see :func:`read_json`)."""
    if not raw:
        raise bad_request("the request has no body; send JSON")
    try:
        encoding = json.detect_encoding(raw)
        if encoding not in ("utf-8", "utf-8-sig"):  # (JSON's parser reads UTF-16 and -32 too)
            raw = raw.decode(encoding).encode()
    except UnicodeError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    shape = structure(raw, MAX_JSON_ITEMS)
    if shape is None:
        raise HttpError(413, f"the JSON body holds more than {MAX_JSON_ITEMS:,} values and "
                        "keys; send fewer in one request (a job's bulk data can go as "
                        "input_b64)", "invalid_request_error", "too_many_json_items")
    collecting = gc.isenabled()
    gc.disable()  # a parse makes no cycles: collections in it took three quarters of its time
    deep = False  # (a null body is None too: a text's bytes never told them apart, its BOM)
    try:
        body = json.loads(raw)
    except RecursionError:
        body, deep = None, True
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    finally:
        if collecting:
            gc.enable()
    if deep or depth(shape) > MAX_JSON_DEPTH:
        raise bad_request(f"the body nests more than {MAX_JSON_DEPTH} levels deep; flatten it")
    return body


def structure(raw: bytes, limit: int) -> bytes | None:
    """UTF-8 JSON text ``raw``'s structure: its ``,`` ``:`` ``[`` ``]`` ``{`` ``}`` outside its
    strings, in order, found by searching its bytes, never by parsing them (None: it holds more
    than ``limit`` values and keys).  Each value or key is the text's first, or comes after a
    ``,`` ``:`` ``[`` or ``{``, less each empty ``[]`` or ``{}`` (none comes after its
    bracket): for valid JSON, their count exactly."""
    if b"\\" in raw:  # escaped backslashes, then escaped quotes: none of them ends a string
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = raw.translate(None, _NOT_MARKS)  # its quotes and marks only, in one pass
    quotes = marks.count(b'"')
    if quotes > 2 * limit:  # each string is a value or a key
        return None
    # Text holds commas, colons and brackets too (prose): every other run is in a string.  A
    # quote stands where each string was (its place: [""] is not an empty list), and all is
    # counted on the one joined text (a count a run took a second for a million strings).
    outside = b'"'.join(marks.split(b'"')[::2]) if quotes else marks
    empty = outside.count(b"[]") + outside.count(b"{}")
    shape = outside.translate(None, b'"') if quotes else marks
    if len(shape) - shape.count(b"]") - shape.count(b"}") - empty + 1 > limit:
        return None
    return shape


def depth(shape: bytes) -> int:
    """How deep a valid JSON text of :func:`structure` ``shape`` nests (a scalar 0, ``[]``
    1): the most brackets open at once, found at C's speed (a walk of the parsed objects took
    a second of the loop for half a million of them).  While its brackets turn often (a wide
    body: many siblings), a pass takes its innermost level away; then the runs of closing
    brackets are counted (few, so little to count)."""
    brackets = shape.translate(_ONE_BRACKET, b",:")
    levels = 0
    while brackets.count(b"][") > FEW_TURNS:
        brackets = brackets.replace(b"[]", b"")
        levels += 1
    opened = accumulate(map(len, _CLOSING.split(brackets)))  # before each run of closings
    closed = chain((0,), accumulate(map(len, _CLOSING.findall(brackets))))
    return levels + max(map(operator.sub, opened, closed))


# -- forms ------------------------------------------------------------------------------------
FormPart = tuple[str, str | None, str, bytes]  # name, filename, content type, bytes


async def read_form(request: web.Request) -> list[FormPart]:
    """The parts of the request's ``multipart/form-data`` body, parsed once (400 when it is
    not one; 413 past :data:`MAX_FORM_PARTS`)."""
    parts = request.get(_FORM)
    if parts is None:
        raw = await read_body(request)
        parts = form_parts(raw, request.headers.get("Content-Type", ""))
        if parts is None:
            raise bad_request("malformed form: not multipart/form-data with a boundary")
        request[_FORM] = parts
    return parts


def form_parts(raw: bytes, content_type: str) -> list[FormPart] | None:
    """The parts of a multipart body (None: ``content_type`` is not multipart with a
    boundary); a part without a name is left out."""
    header = email.message.Message()
    header["Content-Type"] = content_type
    boundary = header.get_boundary() if header.get_content_maintype() == "multipart" else None
    if not boundary:
        return None
    parts: list[FormPart] = []
    for chunk in _split(raw, boundary.encode("latin-1", "replace")):
        part = _part(chunk)
        if part is not None:
            parts.append(part)
    return parts


def _split(raw: bytes, boundary: bytes) -> list[bytes]:
    """The bodies between a multipart body's boundary lines (RFC 2046: ``--boundary`` at a
    line's start, then ``--`` after the last, then only padding on its line; a body without
    that last one runs to its end).  A search for the delimiter at a line's start finds them
    at C's speed: the delimiter mid-line in a file (``--boundary--boundary``) was a step in
    Python each, 11 s of the loop for a 52 MiB file."""
    delimiter = b"--" + boundary
    # RFC 2046: no part holds its delimiter; each one in the body a step here, so counted first.
    if raw.count(b"\n" + delimiter) + raw.startswith(delimiter) > MAX_FORM_PARTS + 1:
        raise HttpError(413, f"the form has more than {MAX_FORM_PARTS} parts; send fewer "
                        "fields in one request", "invalid_request_error", "too_many_parts")
    # After it, ``--`` (the last), padding, the line's end (its \n left for the next line).
    ending = rb"(--)?[ \t]*\r?(?=\n|\Z)"
    first = re.compile(re.escape(delimiter) + ending).match(raw)  # (no line before it)
    later = re.compile(rb"\n" + re.escape(delimiter) + ending).finditer(
        raw, first.end() if first else 0)
    chunks: list[bytes] = []
    start: int | None = None  # where the current part begins
    for found in chain([first] if first else [], later):
        if start is not None:  # the line break before a boundary is the boundary's
            end = found.start()
            if end > start and raw[end - 1] == 0x0D:
                end -= 1
            chunks.append(raw[start:max(start, end)])
        if found.group(1):  # the last
            return chunks
        start = found.end() + 1
    if start is not None:
        chunks.append(raw[start:])
    return chunks


def _part(chunk: bytes) -> FormPart | None:
    """One part: its headers (at most :data:`MAX_PART_HEAD` bytes) and its bytes."""
    if chunk.startswith((b"\r\n", b"\n")):  # no headers
        return None  # (nor a name)
    blank = _BLANK.search(chunk, 0, MAX_PART_HEAD + 4)
    if blank is None and len(chunk) > MAX_PART_HEAD:
        raise bad_request(f"a part of the form has more than {MAX_PART_HEAD} bytes of "
                          "headers, or none ended by a blank line")
    head, data = (chunk[:blank.start()], chunk[blank.end():]) if blank else (chunk, b"")
    headers = email.parser.BytesHeaderParser(policy=email.policy.HTTP).parsebytes(
        head + b"\r\n\r\n")
    name = headers.get_param("name", header="content-disposition")
    if not isinstance(name, str):
        return None
    encoding = str(headers.get("Content-Transfer-Encoding", "")).strip().lower()
    try:
        if encoding == "base64":
            data = base64.b64decode(b"".join(data.split()))
        elif encoding == "quoted-printable":
            data = quopri.decodestring(data)
    except (binascii.Error, ValueError):
        raise bad_request(f"the form's part {brief(name)} is not the {encoding} its "
                          "Content-Transfer-Encoding says") from None
    return name, headers.get_filename(), headers.get_content_type(), data

