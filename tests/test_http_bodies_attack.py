"""Attacks on :mod:`supervisor.http.bodies`, each answered by a truth the door does not
compute: Python's own ``json.loads`` and ``gzip.decompress``, and the parts a real client
(``requests``) sends.  What a body may cost is checked with the door's own functions on
bodies at the scale that once stalled the engine's loop."""

from __future__ import annotations

import gzip
import http.client
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from http_support import Front, serve_http
from spawning import spawns

from supervisor.http.bodies import form_parts, gunzip, parse_json, structure
from supervisor.http.errors import HttpError

FORM = "multipart/form-data; boundary=XX"


# -- JSON -------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    b"[" + b",".join([b"[]"] * 600_000) + b"]",
    b'{"x":[' + b",".join([b"{}"] * 700_000) + b"]}",
], ids=["600k-lists", "700k-objects"])
def test_empty_containers_are_not_counted_as_values(raw: bytes) -> None:
    """A list of 600,000 empty lists holds 600,001 values: under MAX_JSON_ITEMS, so parsed,
    as json.loads parses it (each empty [] or {} was counted twice: a 413)."""
    assert parse_json(raw) == json.loads(raw)


def test_the_count_of_values_and_keys_is_exact() -> None:
    for body in ([], {}, [[], {}, [[]]], {"a": {}, "b": [{}, []], "c": ""}, [""], [["", ""]],
                 1, "s", {"k": [1, "x", None, {"": []}]}):
        raw = json.dumps(body).encode()
        values = _values(body)
        assert structure(raw, values) is not None, body
        assert structure(raw, values - 1) is None, body


def _values(body: object) -> int:
    if isinstance(body, dict):
        return 1 + len(body) + sum(map(_values, body.values()))
    if isinstance(body, list):
        return 1 + sum(map(_values, body))
    return 1


@pytest.mark.parametrize("raw", [b"\xef\xbb\xbfnull", b" null\n", "null".encode("utf-16")],
                         ids=["utf-8-bom", "spaces", "utf-16"])
def test_a_null_body_is_null_not_too_deep(raw: bytes) -> None:
    """json.loads reads null behind a byte order mark; it was refused as nesting too deep."""
    assert json.loads(raw) is None
    assert parse_json(raw) is None


# -- forms ------------------------------------------------------------------------------------
def test_text_like_the_boundary_inside_a_file_costs_nothing_per_occurrence() -> None:
    """A file of ``--XX`` repeated: each was looked at in Python (a 52 MiB body held the loop
    for 11 s, ~0.8 us an occurrence); only the boundary's own lines are (~50 ms here)."""
    data = b"--XX" * 12_000_000  # 48 MB: ~10 s before
    raw = (b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n' + data
           + b"\r\n--XX--\r\n")
    start = time.perf_counter()
    parts = form_parts(raw, FORM)
    assert time.perf_counter() - start < 2.0  # (generous: ~50 ms now, 5 s before here)
    assert parts == [("file", "a", "text/plain", data)]


def test_a_requests_form_arrives_whole() -> None:
    import requests
    for data in (b"abc\r", b"abc--", b"\r\n--", b"", bytes(range(256)) * 10):
        sent = requests.Request("POST", "http://x/", data={"model": "w", "p": "a\r\n--b"},
                                files={"file": ("é.wav", data, "audio/wav")}).prepare()
        assert form_parts(sent.body, sent.headers["Content-Type"]) == [
            ("model", None, "text/plain", b"w"), ("p", None, "text/plain", b"a\r\n--b"),
            ("file", "é.wav", "audio/wav", data)]


# -- gzip -------------------------------------------------------------------------------------
def test_many_gzip_members_unzip_in_linear_time() -> None:
    """Each member copied the rest of the body (zlib's unused_data): 160,000 empty members
    (3 MB) took 30 s of a thread.  A body of more than MAX_GZIP_MEMBERS is refused."""
    from supervisor.http.bodies import MAX_GZIP_MEMBERS
    few = gzip.compress(b"a") * MAX_GZIP_MEMBERS
    assert gunzip(few, 1 << 20) == gzip.decompress(few)
    raw = gzip.compress(b"") * 160_000
    start = time.perf_counter()
    with pytest.raises(HttpError) as refused:
        gunzip(raw, 64 << 20)
    assert time.perf_counter() - start < 5.0  # (30 s before; ~50 ms now)
    assert refused.value.status == 400 and "members" in str(refused.value)
    big = gzip.compress(b"x" * 3_000_000) + gzip.compress(b"y")
    assert gunzip(big, 4 << 20) == gzip.decompress(big)


def test_zero_padding_after_gzip_is_read_as_gzip_reads_it() -> None:
    raw = gzip.compress(b"abc") + b"\0" * 8
    assert gunzip(raw, 100) == gzip.decompress(raw) == b"abc"


# -- the door: a body's Content-Encoding ------------------------------------------------------
SERVER = Path(__file__).resolve().parent / "model_server.py"


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    llama = {"name": "llama", "command": [sys.executable, str(SERVER), "--port", "${PORT}",
                                          "--mib", "64", "--tokens", "3"],
             "http": {"health": "/health"}, "api": ["chat"],
             "vram": {"weights": "64MiB", "activation": "0MiB", "context": "256MiB"},
             "safety": "0MiB", "simulated": True, "concurrency": 4,
             "timeouts": {"start": "20s", "stop_grace": "3s"}}
    with serve_http([llama], gpus="sim:4GiB") as f:
        yield f


def _post(front: Front, path: str, body: bytes,
          headers: list[tuple[str, str]]) -> tuple[int, bytes]:
    """A POST with ``headers`` as given, repeated names kept (a dict would merge them)."""
    url = urlsplit(front.base)
    conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
    try:
        conn.putrequest("POST", path)
        for name, value in [*headers, ("Content-Length", str(len(body)))]:
            conn.putheader(name, value)
        conn.endheaders(body)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


@pytest.mark.process
def test_a_body_coded_twice_is_refused_not_forwarded_still_coded(front: Front) -> None:
    """``Content-Encoding: identity`` then ``Content-Encoding: gzip`` is a gzip body (RFC 9110:
    one list): the door read the first header only, and forwarded the gzip bytes to the model
    server as the body itself."""
    zipped = gzip.compress(b"hello")
    plain = [("Content-Type", "application/octet-stream")]
    for codings in (["identity", "gzip"], ["gzip", "gzip"], ["gzip", "identity"]):
        status, body = _post(front, "/upstream/llama/echo", zipped,
                             plain + [("Content-Encoding", c) for c in codings])
        assert status == 415, (codings, status, body[:200])
        assert json.loads(body)["error"]["code"] == "unsupported_content_encoding"
    # one header, as ever: unzipped; the body as it came when it says identity
    assert _post(front, "/upstream/llama/echo", zipped,
                 [*plain, ("Content-Encoding", "GZIP")]) == (201, b"hello")
    assert _post(front, "/upstream/llama/echo", b"hi",
                 [*plain, ("Content-Encoding", "identity")]) == (201, b"hi")
