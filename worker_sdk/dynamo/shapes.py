"""Modality shaping: Dynamo requests into predict payloads, predict replies into Dynamo responses.

A decorated ``predict`` takes bytes and returns bytes, a :class:`~worker_sdk.Response`, or a
(async) generator of chunks, exactly as under ``python -m worker_sdk``.  This module turns a
Dynamo request (a JSON-like object) into those bytes and each reply or streamed chunk into one
JSON-like Dynamo response item, per type.  A function served through the Python API
(``dynamo_worker(fn, config)``) gets the typed request instead (:mod:`.requests`), and its
results are shaped by the same rules:

``raw`` (the default; no ``register_model``)
    Request: ``bytes`` as they are (Dynamo's msgpack request plane carries Python bytes); a
    ``str`` as UTF-8; ``{"b64": "<base64>"}`` (that one key) decoded; ``None`` as ``b""``; any
    other JSON-able object as its compact JSON text (so ``{"stream": 3}`` reaches the worker as
    ``b'{"stream":3}'``).
    Reply: one item ``{"data": str, "encoding": "utf-8" | "base64", "headers": {...},
    "status_code": int}`` (headers and status from a ``Response``; ``{}`` and 200 otherwise).
    ``data`` is the text itself when the bytes are valid UTF-8, else their base64.  A status of
    400 or more is passed through, not raised: the caller reads ``status_code``.
    Stream: one ``{"data", "encoding"}`` item per chunk, in order; :func:`raw_bytes` turns any
    of these items back into bytes.  With ``progress=True`` (``--progress``) a
    ``ctx.progress(f, m)`` call streams ``{"progress": f, "message": m}`` (f may be null)
    between the chunks.  A ``dict`` returned through the Python API is taken as the item.

``image`` (``ModelType.Images``), ``video`` (``ModelType.Videos``), ``embedding``
(``ModelType.Embedding``): the OpenAI-style shapes a Dynamo frontend exchanges.
    Request: a JSON object (``/v1/images/generations``: ``prompt`` required;
    ``/v1/videos``: ``prompt`` required; ``/v1/embeddings``: ``input`` required), validated by
    its request class (:mod:`.requests`; a mismatch is a 400 naming the field) and handed to
    ``predict`` as its compact JSON text.
    Reply: ``image``: image bytes -> ``{"created", "data": [{"b64_json"}]}``;
    ``video``: video bytes -> ``{"id", "object": "video", "model", "status": "completed",
    "progress": 100, "created", "data": [{"b64_json", "output_format"}], "inference_time_s"}``;
    ``embedding``: JSON (bytes or a JSON ``Response``) of one vector ``[0.1, ...]`` or of a
    list of vectors -> ``{"object": "list", "model", "data": [{"object": "embedding",
    "embedding", "index"}], "usage"}``.  A ``Response`` whose Content-Type is JSON and whose
    body is an object is taken as already shaped and passed through; so is a ``dict`` (and, for
    ``embedding``, a list or anything with ``tolist()``, e.g. a numpy array) returned through
    the Python API.  A ``Response`` with status 400 or more becomes an HTTP error.
    Stream: each chunk is one complete item (one image, one video, one vector or a batch of
    vectors); the frontend's aggregator appends their ``data`` lists (embedding indices keep
    counting across chunks).  With ``progress=True``, a ``video`` endpoint streams each
    ``ctx.progress(f)`` call as ``{"status": "in_progress", "progress": percent, "data": []}``
    for streaming clients; it is off by default because the 1.6.1 frontend folds a
    non-streamed reply keeping the first item's ``status`` and ``progress``.

Images and videos are always returned as ``b64_json`` (a worker has no place to host URLs).
Nothing here imports Dynamo (typed requests import pydantic, when validated).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable
from typing import Any, Literal

from ..response import Response

Kind = Literal["raw", "image", "video", "embedding"]
KINDS: tuple[str, ...] = ("raw", "image", "video", "embedding")
TYPED_KINDS: frozenset[str] = frozenset({"image", "video", "embedding"})


class ShapeError(ValueError):
    """The request does not have the shape its endpoint type needs (an HTTP 400)."""


class ReplyError(TypeError):
    """``predict`` returned something that cannot be shaped for the endpoint type (a 500)."""


class ReplyStatus(Exception):
    """A typed endpoint's ``Response`` carried an error status; becomes that HTTP error."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"HTTP {status_code}: {message}")
        self.status_code = status_code
        self.message = message


# -- requests ---------------------------------------------------------------------------------
def _json_bytes(obj: Any) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"request is not JSON-serialisable: {exc}") from None


def raw_payload(request: Any) -> bytes:
    """The bytes a ``raw`` request stands for (see the module docstring)."""
    if request is None:
        return b""
    if isinstance(request, bytes | bytearray | memoryview):
        return bytes(request)
    if isinstance(request, str):
        return request.encode("utf-8")
    if isinstance(request, dict) and len(request) == 1 and "b64" in request:
        encoded = request["b64"]
        if not isinstance(encoded, str):
            raise ShapeError('{"b64": ...} must hold a base64 string')
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ShapeError(f'{{"b64": ...}} is not valid base64: {exc}') from None
    return _json_bytes(request)


def request_payload(kind: str, request: Any) -> bytes:
    """Validate ``request`` for ``kind`` and return the bytes a decorated ``predict`` receives.

    Typed requests are validated by their request class (:mod:`worker_sdk.dynamo.requests`)
    and handed on as the compact JSON text of the object as it came (unknown fields kept).
    """
    if kind in TYPED_KINDS:
        from .requests import parse_request

        parse_request(kind, request)
        if not isinstance(request, dict):  # a typed request object, from the Python API
            return _json_bytes(request.model_dump(exclude_none=True))
        return _json_bytes(request)
    if kind != "raw":
        raise ValueError(f"unknown endpoint type {kind!r}; one of {', '.join(KINDS)}")
    return raw_payload(request)


# -- replies ----------------------------------------------------------------------------------
def _bytes_of(data: Any, what: str) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return data.encode("utf-8")
    raise ReplyError(f"{what} must be bytes, got {type(data).__name__}")


def encode_data(data: bytes) -> dict[str, str]:
    """``{"data": text, "encoding": "utf-8"}`` when ``data`` is UTF-8, else base64."""
    try:
        return {"data": data.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"data": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


def raw_bytes(item: dict[str, Any]) -> bytes:
    """The bytes of one ``raw`` response item (a reply or a stream chunk)."""
    data = item["data"]
    if item.get("encoding") == "base64":
        return base64.b64decode(data)
    return str(data).encode("utf-8")


def _is_json(headers: dict[str, str]) -> bool:
    for key, value in headers.items():
        if key.lower() == "content-type":
            media = value.split(";", 1)[0].strip().lower()
            return media == "application/json" or media.endswith("+json")
    return False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _number_list(row: Any) -> list[float]:
    if not isinstance(row, list | tuple) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in row
    ):
        raise ReplyError("an embedding is a list of numbers")
    return [float(x) for x in row]


def _field(request: Any, name: str) -> Any:
    """A field of a request: a JSON object, or a typed request from the Python API."""
    if isinstance(request, dict):
        return request.get(name)
    return getattr(request, name, None)


class Shaper:
    """Shapes one request's replies, stream chunks and progress for its endpoint type.

    Built per request (it keeps the embedding index and the video id across a stream).
    """

    def __init__(
        self,
        kind: str,
        *,
        model: str,
        request: Any = None,
        request_id: str = "",
        stream_progress: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown endpoint type {kind!r}; one of {', '.join(KINDS)}")
        self.kind = kind
        self.model = model
        self.stream_progress = stream_progress
        self._clock = clock
        self._started = clock()
        self._index = 0
        self._progress_pct = 0
        self._video_id = f"video-{request_id}" if request_id else f"video-{int(self._started)}"
        self._output_format = "mp4"
        model, output_format = _field(request, "model"), _field(request, "output_format")
        if isinstance(model, str) and model:
            self.model = model
        if isinstance(output_format, str) and output_format:
            self._output_format = output_format

    # -- public -------------------------------------------------------------------------------
    def reply(self, value: Any) -> dict[str, Any]:
        """The single response item for a non-streamed ``predict`` result."""
        if self.kind == "raw":
            return self._raw(value, chunk=False)
        return self._typed(value)

    def chunk(self, value: Any) -> dict[str, Any]:
        """The response item for one streamed chunk."""
        if self.kind == "raw":
            return self._raw(value, chunk=True)
        return self._typed(value)

    def progress(self, fraction: float | None, message: str) -> dict[str, Any] | None:
        """The item a ``ctx.progress`` call streams, or None (off, or no place in the type)."""
        if not self.stream_progress:
            return None
        if self.kind == "raw":
            return {"progress": fraction, "message": message}
        if self.kind == "video" and fraction is not None:
            self._progress_pct = int(round(fraction * 100))
            return self._video([], status="in_progress")
        return None

    # -- raw ----------------------------------------------------------------------------------
    def _raw(self, value: Any, *, chunk: bool) -> dict[str, Any]:
        if isinstance(value, dict):  # the Python API: an item shaped by the function itself
            return value
        if isinstance(value, Response):
            item: dict[str, Any] = encode_data(_bytes_of(value.data, "Response.data"))
            if not chunk:
                item["headers"] = dict(value.headers)
                item["status_code"] = int(value.status_code)
            return item
        if chunk:
            if not isinstance(value, bytes | bytearray | memoryview):
                value = str(value).encode("utf-8")  # as worker.py does with stream chunks
            return encode_data(bytes(value))
        if not isinstance(value, bytes | bytearray | memoryview):
            raise ReplyError(
                "predict() must return bytes, worker_sdk.Response or a generator of bytes, "
                f"got {type(value).__name__}"
            )
        item = encode_data(bytes(value))
        item["headers"] = {}
        item["status_code"] = 200
        return item

    # -- typed --------------------------------------------------------------------------------
    def _typed(self, value: Any) -> dict[str, Any]:
        if isinstance(value, Response):
            if value.status_code >= 400:
                text = _bytes_of(value.data, "Response.data").decode("utf-8", "replace")
                raise ReplyStatus(int(value.status_code), text or "error")
            if _is_json(value.headers):
                parsed = self._parse_json(_bytes_of(value.data, "Response.data"))
                if isinstance(parsed, dict):
                    return parsed
                value = parsed
            else:
                value = value.data
        if isinstance(value, dict):
            return value
        if self.kind == "embedding":
            if isinstance(value, bytes | bytearray | memoryview | str):
                value = self._parse_json(_bytes_of(value, "an embedding reply"))
                if isinstance(value, dict):
                    return value
            return self._embedding(value)
        data = _bytes_of(value, f"a {self.kind} reply")
        if self.kind == "image":
            return {"created": int(self._clock()), "data": [{"b64_json": _b64(data)}]}
        entry = {"b64_json": _b64(data), "output_format": self._output_format}
        return self._video([entry], status="completed")

    def _parse_json(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError:
            raise ReplyError(
                f"a {self.kind} reply with JSON content is not valid JSON"
                if self.kind != "embedding"
                else "an embedding reply is JSON: a vector, a list of vectors, or an "
                "OpenAI embedding response object"
            ) from None

    def _embedding(self, value: Any) -> dict[str, Any]:
        tolist = getattr(value, "tolist", None)
        if callable(tolist):
            value = tolist()
        if not isinstance(value, list | tuple):
            raise ReplyError(
                f"an embedding reply is a vector or a list of vectors, got {type(value).__name__}"
            )
        if not value:
            rows: list[Any] | tuple[Any, ...] = []
        elif isinstance(value[0], list | tuple):
            rows = value
        else:
            rows = [value]
        data = []
        for row in rows:
            vector = _number_list(row)
            data.append({"object": "embedding", "embedding": vector, "index": self._index})
            self._index += 1
        return {
            "object": "list",
            "model": self.model,
            "data": data,
            "usage": {"prompt_tokens": 0, "total_tokens": 0},
        }

    def _video(self, data: list[dict[str, Any]], *, status: str) -> dict[str, Any]:
        if status == "completed":
            self._progress_pct = 100
        item: dict[str, Any] = {
            "id": self._video_id,
            "object": "video",
            "model": self.model,
            "status": status,
            "progress": self._progress_pct,
            "created": int(self._started),
            "data": data,
        }
        if status == "completed":
            item["inference_time_s"] = round(self._clock() - self._started, 6)
        return item
