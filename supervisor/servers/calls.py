"""The requests the engine makes of a model server on its own: its sleep and its wake.

``call`` makes one :class:`~supervisor.backends.http.HttpCall` (``http.sleep``,
``http.wake``) of a server and says how it went, in one line: ``None`` when it answered 2xx,
else why not (its status and the start of what it said, the connection's error, or that it did
not answer in time). A call other than a GET carries an empty JSON object, which vLLM's routes
ignore and SGLang's (``/release_memory_occupation``) need.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..backends.http import HttpCall

SNIPPET = 200  # characters of a failed answer in the error


async def call(session: Any, base_url: str, what: HttpCall, timeout: float,
               auth: Mapping[str, str]) -> str | None:
    """Make ``what`` of the server at ``base_url`` (with ``auth``, its key's header); None
    when it answered 2xx, else why not."""
    import aiohttp

    body = None if what.method == "GET" else b"{}"
    headers = dict(auth) if body is None else {**auth, "Content-Type": "application/json"}
    try:
        async with session.request(what.method, base_url + what.path, data=body,
                                   headers=headers, allow_redirects=False,
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            said = await resp.content.read(SNIPPET * 4)
            status = int(resp.status)
    except TimeoutError:
        return f"{what} gave no answer within {timeout:g} s"
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        return f"{what} failed: {str(exc) or type(exc).__name__}"
    if 200 <= status < 300:
        return None
    text = " ".join(said.decode("utf-8", "replace").split())[:SNIPPET] or "(no body)"
    return f"{what} answered HTTP {status}: {text}"
