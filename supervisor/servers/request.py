"""The HTTP request one job of a server backend makes, and the headers that never travel.

A job from the OpenAI routes carries, in its metadata under ``"http"``, the method, path,
query and the few headers of the client's request that describe its body; its payload is
the client's body, byte for byte. A job from anywhere else (the CLI, Python, a calibration)
has no such metadata: it is POSTed to the route of the backend's first ``api`` (an empty
payload: a short request of that kind, so a calibration measures one). With
``http.model_name``, the body's ``model`` is replaced by it (the only change ever made).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from yarl import URL

from ..backends.schema import BackendSpec

#: Connection-level headers (RFC 9110 §7.6.1): they describe one hop, never forwarded.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding",
                        "upgrade"})
#: Never sent to a server, whoever gave them (a client, a job's metadata): its framing and
#: its Host are the relay's own, ``Expect`` was answered by the door, the door's token and
#: cookies are no server's, and who the client is is not the client's to say.
NEVER_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect", "authorization", "cookie",
                                "origin", "referer", "forwarded", "x-real-ip"}
#: The client's headers that describe its body or what it accepts: the ones a job keeps.
BODY_HEADERS = ("content-type", "accept", "content-encoding", "accept-encoding")
API_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "images": "/v1/images/generations",
    "speech": "/v1/audio/speech",
    "transcriptions": "/v1/audio/transcriptions",
    "responses": "/v1/responses",
    "rerank": "/v1/rerank",
}
_SHORT = {
    "chat": {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8},
    "completions": {"prompt": "Hello", "max_tokens": 8},
    "embeddings": {"input": "hello"},
    "responses": {"input": "Say hello.", "max_output_tokens": 8},
    "rerank": {"query": "hello", "documents": ["hello", "world"]},
    "images": {"prompt": "a red square", "n": 1},
    "speech": {"input": "hello", "voice": "alloy"},
}


@dataclass(frozen=True)
class Upstream:
    method: str
    path: str  # with its query, e.g. "/v1/chat/completions" or "/slots?id=1"
    headers: dict[str, str]
    body: bytes


def end_to_end(headers: Iterable[tuple[str, str]], also: Iterable[str] = ()) -> list[
        tuple[str, str]]:
    """``headers`` without the hop-by-hop ones (and those ``Connection`` names, and ``also``)."""
    drop = HOP_BY_HOP | {h.lower() for h in also}
    return [(k, v) for k, v, _low in _kept(headers, drop)]


def combined(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """One value a name (case aside; the name as first written): the values of a repeated
    header joined with ``", "`` in their order, as RFC 9110 §5.3 says they mean (two
    ``Cache-Control`` lines, or two of an ``X-`` list); ``Set-Cookie``, the one that cannot
    be joined, keeps its last (no door forwards it)."""
    out: dict[str, str] = {}
    names: dict[str, str] = {}  # lowercased -> as first written
    for key, value in headers:
        low = key.lower()
        name = names.setdefault(low, key)
        if name in out and low != "set-cookie":
            out[name] = f"{out[name]}, {value}"
        else:
            out[name] = value
    return out


def _kept(headers: Iterable[tuple[str, str]], drop: frozenset[str]) -> list[
        tuple[str, str, str]]:
    """``headers`` (name, value, lowercased name: each name lowered once) but those named in
    ``drop`` (lowercase) and those a ``Connection`` header names."""
    items = [(k, v, k.lower()) for k, v in headers]
    for _k, value, low in items:
        if low == "connection":
            drop = drop | {v.strip().lower() for v in value.split(",")}
    return [item for item in items if item[2] not in drop]


_SENDABLE = re.compile(r"^/[!-~]*$")  # printable ASCII, no space: a request target as is


def target_url(base: str, path: str) -> URL:
    """``base`` + ``path`` as the server is sent it: a path that is already a valid request
    target goes exactly as written (``%2F`` stays ``%2F``, ``%2e%2e`` is not a ``..``: it is
    never decoded a second time, nor re-read as a query); anything else is quoted."""
    if _SENDABLE.match(path):
        return URL(base + path, encoded=True)
    return URL(base + path)


def forwardable(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``headers`` without those a server is never sent (:data:`NEVER_FORWARDED`,
    ``X-Forwarded-*``, and those ``Connection`` names)."""
    return {k: v for k, v, low in _kept(headers, NEVER_FORWARDED)
            if not low.startswith("x-forwarded-")}


#: The ``Content-Encoding`` values whose bodies the door (aiohttp) has decoded already.
DECODED_BY_DOOR = frozenset({"gzip", "deflate", "br", "zstd"})


def job_metadata(method: str, path: str, headers: Mapping[str, str], *,
                 every_header: bool = False) -> dict[str, Any]:
    """What a door puts in a job's metadata so the server gets the client's request: the
    headers that describe its body (``every_header``: all those given), less a
    ``Content-Encoding`` the door decoded (the body it forwards is the decoded one)."""
    kept: dict[str, str] = {}
    for key, value in headers.items():
        low = key.lower()
        if (every_header or low in BODY_HEADERS) and not (
                low == "content-encoding" and value.lower() in DECODED_BY_DOOR):
            kept[low] = value
    return {"http": {"method": method, "path": path, "headers": kept}}


def default_body(spec: BackendSpec) -> bytes:
    """A short request of the backend's first API (what a calibration sends by default)."""
    kind = spec.api[0] if spec.api else "chat"
    body = {"model": spec.http.model_name if spec.http and spec.http.model_name else spec.name,
            **_SHORT.get(kind, {})}
    return json.dumps(body).encode()


def upstream_of(spec: BackendSpec, payload: bytes, metadata: Mapping[str, Any] | None) -> Upstream:
    """The request a job of ``spec`` makes of its server."""
    described = (metadata or {}).get("http")
    if isinstance(described, Mapping):
        method = str(described.get("method") or "POST").upper()
        path = str(described.get("path") or "/")
        raw = described.get("headers")
        headers = forwardable((str(k), str(v)) for k, v in raw.items()) \
            if isinstance(raw, Mapping) else {}
    else:
        method = "POST"
        path = API_PATHS[spec.api[0]] if spec.api else "/v1/chat/completions"
        headers = {"content-type": "application/json"}
        if not payload.strip():
            payload = default_body(spec)
    if not path.startswith("/"):
        path = "/" + path
    http = spec.http
    raw_pass = (metadata or {}).get("api") == "upstream"  # /upstream: exactly as it came
    if http is not None and http.model_name and looks_like_object(payload) and not raw_pass:
        payload = _renamed(payload, http.model_name)
    return Upstream(method, path, headers, payload)


def looks_like_object(payload: bytes) -> bool:
    """Whether ``payload`` may be a JSON object: ``{`` first, after any blanks and a UTF-8
    BOM (which JSON's parser of bytes takes too: a pretty-printed file sent with
    ``curl -d @file.json`` begins with a newline)."""
    return payload.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")[:1] == b"{"


def _renamed(payload: bytes, name: str) -> bytes:
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        return payload  # not JSON: the server says what it makes of it
    if not isinstance(body, dict) or body.get("model") == name:
        return payload
    body["model"] = name
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
