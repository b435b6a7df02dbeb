"""The HTTP front door: the engine's API, OpenAI- and Ollama-compatible routes, SSE, metrics.

Needs the ``http`` extra (``pip install 'vramtui[http]'``: aiohttp, prometheus-client).  It
runs on the engine's own loop as a facade service (:class:`server.HttpServer`), like the
control server; :mod:`config` reads its settings, :mod:`auth` decides who may do what,
:mod:`routes` / :mod:`openai_routes` / :mod:`ollama_routes` are the routes, :mod:`sse` the
event streams, :mod:`metrics` the Prometheus page.
"""

from __future__ import annotations

MISSING = ("the HTTP front door needs aiohttp and prometheus-client: "
           "pip install 'vramtui[http]'")


def available() -> str | None:
    """None when the front door can run here, else what to install."""
    try:
        import aiohttp  # noqa: F401
        import prometheus_client  # noqa: F401
    except ImportError:
        return MISSING
    return None
