"""`Response`: what a predict function returns when it needs headers or a status code."""

from __future__ import annotations


class Response:
    """Response data with HTTP-style headers and status code (verda-io's ``Response``)."""

    __slots__ = ("data", "headers", "status_code")

    def __init__(
        self, data: bytes, headers: dict[str, str] | None = None, status_code: int = 200
    ) -> None:
        self.data = data
        self.headers = headers or {}
        self.status_code = status_code

    def __repr__(self) -> str:
        return f"Response({len(self.data)} bytes, status_code={self.status_code})"
