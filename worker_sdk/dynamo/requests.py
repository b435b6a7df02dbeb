"""The typed requests of the ``embedding``, ``image`` and ``video`` endpoint types.

A Dynamo frontend (and any Dynamo client) sends a JSON object; :func:`parse_request` turns it
into the request class of the endpoint's type, as AITune's ``dynamo_worker`` does before it
calls ``mapping`` or the served function: :class:`EmbeddingRequest` (``/v1/embeddings``:
``.input``, ``.model``, ``.dimensions``, ...), :class:`ImageRequest` (``/v1/images/generations``:
``.prompt``, ``.size``, ``.n``, ...), :class:`VideoRequest` (``/v1/videos``: ``.prompt``,
``.seconds``, ``.size``, ...).  They are Pydantic models (the package ``ai-dynamo-runtime``
depends on), with the fields of the OpenAI requests and of Dynamo's ``NvCreateImageRequest`` /
``NvCreateVideoRequest`` (the names are aliases here).  Fields a request carries beyond these
are kept (``request.model_extra``).  They also read like the JSON object they came from:
``request["input"]``, ``request.get("dimensions", 8)``, ``"n" in request``.

A request that does not validate is a :class:`~worker_sdk.dynamo.shapes.ShapeError` (an HTTP
400 to the caller) whose message names the field.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .shapes import ShapeError

__all__ = [
    "EmbeddingRequest",
    "ImageRequest",
    "NvCreateImageRequest",
    "NvCreateVideoRequest",
    "VideoRequest",
    "parse_request",
    "request_class",
]


class _Request(BaseModel):
    """A typed request that still reads like its JSON object."""

    model_config = ConfigDict(extra="allow")

    def _has(self, key: str) -> bool:
        return key in type(self).model_fields or key in (self.model_extra or {})

    def __getitem__(self, key: str) -> Any:
        if not self._has(key):
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._has(key) and getattr(self, key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key) if self._has(key) else None
        return default if value is None else value


class EmbeddingRequest(_Request):
    """``/v1/embeddings``: ``input`` is a text, a list of texts, or token ids."""

    input: str | list[str] | list[int] | list[list[int]] | list[list[str]]
    model: str | None = None
    user: str | None = None
    dimensions: int | None = Field(default=None, ge=1)
    encoding_format: str | None = None

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("an empty list has nothing to embed")
        return value

    @property
    def texts(self) -> list[Any]:
        """``input`` as a list: one entry per embedding the reply should hold."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]  # one text as token ids
        return list(self.input)


class ImageRequest(_Request):
    """``/v1/images/generations`` (Dynamo's ``NvCreateImageRequest``)."""

    prompt: str
    model: str | None = None
    n: int | None = Field(default=None, ge=1, le=10)
    size: str | None = None
    quality: str | None = None
    response_format: str | None = None
    output_format: str | None = None
    output_compression: int | None = None
    stream: bool | None = None
    background: str | None = None
    style: str | None = None
    user: str | None = None
    input_reference: str | None = None
    nvext: dict[str, Any] | None = None
    extra_args: dict[str, Any] | None = None


class VideoRequest(_Request):
    """``/v1/videos`` (Dynamo's ``NvCreateVideoRequest``)."""

    prompt: str
    model: str | None = None
    seconds: int | float | None = None
    size: str | None = None
    input_reference: str | None = None
    response_format: str | None = None
    output_format: str | None = None
    stream: bool | None = None
    user: str | None = None
    nvext: dict[str, Any] | None = None


NvCreateImageRequest = ImageRequest
NvCreateVideoRequest = VideoRequest

_CLASSES: dict[str, type[_Request]] = {
    "embedding": EmbeddingRequest,
    "image": ImageRequest,
    "video": VideoRequest,
}


def request_class(kind: str) -> type[_Request] | None:
    """The request class of an endpoint type (None for ``raw``: requests stay as they came)."""
    return _CLASSES.get(kind)


def _article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def parse_request(kind: str, request: Any) -> Any:
    """``request`` (a JSON-like object from Dynamo) as ``kind``'s typed request; ShapeError."""
    cls = request_class(kind)
    if cls is None:
        return request
    if isinstance(request, cls):
        return request
    if not isinstance(request, dict):
        raise ShapeError(f"{_article(kind)} {kind} request is a JSON object, "
                         f"got {type(request).__name__}")
    try:
        return cls.model_validate(request)
    except ValidationError as exc:
        problems = []
        for error in exc.errors()[:4]:
            where = ".".join(str(p) for p in error.get("loc", ())) or "request"
            problems.append(f"{where!r}: {error.get('msg', 'invalid')}")
        raise ShapeError(f"{_article(kind)} {kind} request: {'; '.join(problems)}") from None
