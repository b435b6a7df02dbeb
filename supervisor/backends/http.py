"""A backend that is an HTTP model server (``http:`` in its descriptor), and its macros.

Owns the ``http:`` section's keys, their validation (``parse_http``: one ``FieldError`` each),
and the macros a server's ``command``, ``env``, ``url`` and ``stop`` may use, which only the
engine knows when it starts the server: ``${PORT}`` (a free port it picked), ``${GPU}`` (the
placed GPU's index), ``${MODEL}`` (the backend's name), ``${VRAM_MIB}`` and
``${VRAM_FRACTION}`` (the budget it was admitted with, in MiB and as a fraction of its GPU),
``${API_KEY}`` (a secret drawn at each start, which the engine then sends the server as
``Authorization: Bearer``: its port on loopback is open to every local user, the door's
checks are not; give it in ``env``, as ``LLAMA_API_KEY`` or ``VLLM_API_KEY``, since a command
line is readable by every user).
The loader keeps them as written (``keep_macros``); ``fill`` puts the values in at spawn.

``http.sleep`` and ``http.wake`` are the requests that put a server to sleep and wake it
(vLLM's ``POST /sleep?level=1`` and ``POST /wake_up``): an :class:`HttpCall` each, written
as a method and a path (a path alone is a POST), given both or neither.
"""

from __future__ import annotations

import re
import shlex
import socket
from collections import ChainMap
from collections.abc import Mapping
from dataclasses import dataclass

from yarl import URL

from ..errors import brief
from ..units import parse_duration
from .errors import FieldError, unknown_key_message

MACROS = ("PORT", "GPU", "MODEL", "VRAM_MIB", "VRAM_FRACTION", "API_KEY")
HTTP_KEYS = frozenset({"health", "url", "model_name", "stop", "ready_timeout", "sleep",
                       "wake"})
CALL_METHODS = ("POST", "PUT", "PATCH", "GET", "DELETE")
DEFAULT_HEALTH = "/health"
DEFAULT_URL = "http://127.0.0.1:${PORT}"
_MACRO_RE = re.compile(r"\$\{(" + "|".join(MACROS) + r")\}")
_SAMPLE = {"PORT": "5800", "GPU": "0", "MODEL": "m", "VRAM_MIB": "1024", "VRAM_FRACTION": "0.5",
           "API_KEY": "k"}


@dataclass(frozen=True)
class HttpCall:
    """One request the engine makes of a server on its own (a sleep, a wake)."""

    method: str
    path: str  # with its query, e.g. /sleep?level=1

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class HttpSpec:
    """How to reach, check and stop a backend's HTTP server (macros not yet filled in).

    ``health``: the path polled with GET (200: ready; anything else, or no answer: not yet),
    ``None`` (``health: none``): ready once its port takes a connection. ``model_name``: the
    ``model`` the server is sent (None: the client's, unchanged). ``stop``: a command that
    stops it (None: SIGTERM to its process group, then SIGKILL after ``timeouts.stop_grace``).
    ``ready_timeout_s``: None: ``timeouts.start``. ``sleep`` and ``wake`` (both or
    neither): the requests that put it to sleep (its GPU memory given back, its process kept)
    and wake it; a 2xx answer is a success.
    """

    health: str | None = DEFAULT_HEALTH
    url: str = DEFAULT_URL
    model_name: str | None = None
    stop: tuple[str, ...] | None = None
    ready_timeout_s: float | None = None
    sleep: HttpCall | None = None
    wake: HttpCall | None = None

    @property
    def can_sleep(self) -> bool:
        return self.sleep is not None and self.wake is not None


def free_port(host: str) -> int:
    """What ``${PORT}`` is: a TCP port nobody listens on now at ``host`` (an address of this
    host, IPv4 or IPv6, or a name of one: its first address), the kernel's choice. Raises
    ``OSError`` for a name that does not resolve or an address that is not this host's."""
    family, kind, proto, _name, address = socket.getaddrinfo(
        host, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as sock:
        sock.bind(address)
        return int(sock.getsockname()[1])


LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::"})


def fixed_address(url: str) -> str | None:
    """The address a server of ``url`` listens on when it is the same at every start
    (``host:port``; every name of this host is ``localhost``, whose ports are one space),
    None when a macro picks it (``${PORT}``): two servers of one fixed address cannot run at
    once, as two of llama-swap's models on one ``proxy`` port take turns."""
    if "${" in url:
        return None
    try:
        parsed = URL(url)
        port = parsed.port
    except ValueError:
        return None
    host = (parsed.host or "").lower()
    if port is None or not host:
        return None
    return f"{'localhost' if host in LOCAL_HOSTS else host}:{port}"


def keep_macros(environ: Mapping[str, str]) -> Mapping[str, str]:
    """``environ`` in which ``${PORT}`` and the other macros expand to themselves."""
    return ChainMap({name: "${" + name + "}" for name in MACROS}, dict(environ))


def fill(text: str, values: Mapping[str, str]) -> str:
    """``text`` with each macro replaced by its value (those not in ``values`` stay)."""
    return _MACRO_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def uses_port(words: object) -> bool:
    """Whether a command (a list of words or a line) or an env mapping mentions ``${PORT}``."""
    if isinstance(words, Mapping):
        words = list(words.values())
    if isinstance(words, str):
        return "${PORT}" in words
    if isinstance(words, list | tuple):
        return any(isinstance(w, str) and "${PORT}" in w for w in words)
    return False


def _path(value: object, key: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or any(c.isspace() for c in value):
        raise FieldError(key, f"{brief(value)} is not a path of the server (e.g. /health)")
    return value


def _url(value: object) -> str:
    if not isinstance(value, str):
        raise FieldError("http.url", f"{brief(value)} is not a URL (e.g. "
                         "http://127.0.0.1:${PORT})")
    try:
        filled = fill(value, _SAMPLE)
        url = URL(filled)
    except (ValueError, TypeError) as exc:
        raise FieldError("http.url", f"{brief(value)} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise FieldError("http.url", f"{brief(value)} is not an http:// URL with a host (e.g. "
                         "http://127.0.0.1:${PORT})")
    if "?" in filled or "#" in filled:
        raise FieldError("http.url", f"{brief(value)} has a query or a fragment: it is the "
                         "base that each request's path goes after, so give it without "
                         "(e.g. http://127.0.0.1:${PORT}, or with a base path: "
                         "http://127.0.0.1:${PORT}/api)")
    if "${PORT}" in value:  # the engine picks a port free there: an address of this host
        try:
            free_port(url.host)
        except OSError as exc:
            raise FieldError("http.url", f"{brief(value)}: the engine picks ${{PORT}} free "
                             f"on this host, and cannot at {url.host} "
                             f"({exc.strerror or exc}); name an address of this host, e.g. "
                             "http://127.0.0.1:${PORT} or http://[::1]:${PORT}") from None
    return value.rstrip("/")


def _stop(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            words: list[object] = list(shlex.split(value))
        except ValueError as exc:
            raise FieldError("http.stop", f"{brief(value)} cannot be split into words: "
                             f"{exc}") from None
    elif isinstance(value, list | tuple):
        words = list(value)
    else:
        raise FieldError("http.stop", f"{brief(value)} is not a command (a list of words or a "
                         "line)")
    if not words or not all(isinstance(w, str | int | float) and not isinstance(w, bool)
                            for w in words):
        raise FieldError("http.stop", f"{brief(value)} is not a command (a list of words)")
    return tuple(str(w) for w in words)


def _call(value: object, key: str, example: str) -> HttpCall:
    """``POST /sleep?level=1``, or a path alone (a POST)."""
    if not isinstance(value, str) or not value.strip():
        raise FieldError(key, f"{brief(value)} is not a request: a method and a path, e.g. "
                         f"{example}")
    words = value.split()
    if len(words) == 1:
        method, path = "POST", words[0]
    elif len(words) == 2:
        method, path = words[0].upper(), words[1]
    else:
        raise FieldError(key, f"{brief(value)} is not a request: a method and a path, e.g. "
                         f"{example}")
    if method not in CALL_METHODS:
        raise FieldError(key, f"{brief(words[0])} is not an HTTP method (one of "
                         f"{', '.join(CALL_METHODS)}), e.g. {example}")
    if not path.startswith("/"):
        raise FieldError(key, f"{brief(path)} is not a path of the server (it starts with /), "
                         f"e.g. {example}")
    return HttpCall(method, path)


def parse_http(value: object, command: object, env: object) -> HttpSpec:
    """The ``http:`` section (``true`` or ``{}``: every default); raises ``FieldError``."""
    if value is True:
        value = {}
    if not isinstance(value, Mapping):
        raise FieldError("http", f"{brief(value)} is not a mapping of server settings "
                         f"({', '.join(sorted(HTTP_KEYS))}), or true")
    for key in value:
        if key not in HTTP_KEYS:
            raise FieldError(f"http.{key}", unknown_key_message(key, HTTP_KEYS))
    out: dict[str, object] = {}
    health = value.get("health")
    if isinstance(health, str) and health.lower() == "none" or health is False:
        out["health"] = None
    elif health is not None:
        out["health"] = _path(health, "http.health")
    if value.get("url") is not None:
        out["url"] = _url(value["url"])
    name = value.get("model_name")
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise FieldError("http.model_name", f"{brief(name)} is not a model name")
        out["model_name"] = name
    if value.get("stop") is not None:
        out["stop"] = _stop(value["stop"])
    timeout = value.get("ready_timeout")
    if timeout is not None:
        try:
            seconds = parse_duration(timeout)
        except ValueError as exc:
            raise FieldError("http.ready_timeout", str(exc)) from None
        if seconds <= 0:
            raise FieldError("http.ready_timeout", f"{brief(timeout)} must be more than 0")
        out["ready_timeout_s"] = seconds
    for key, example in (("sleep", "POST /sleep?level=1"), ("wake", "POST /wake_up")):
        if value.get(key) is not None:
            out[key] = _call(value[key], f"http.{key}", example)
    if ("sleep" in out) != ("wake" in out):
        given, missing = ("sleep", "wake") if "sleep" in out else ("wake", "sleep")
        raise FieldError(f"http.{given}", f"http.{missing} is missing: a server put to sleep "
                         f"must be woken, so give both (vLLM: sleep: POST /sleep?level=1, "
                         f"wake: POST /wake_up)")
    spec = HttpSpec(**out)  # type: ignore[arg-type]
    if "${PORT}" in spec.url and command is not None and not (uses_port(command)
                                                             or uses_port(env or {})):
        raise FieldError("http", "the server is reached on ${PORT} but its command never "
                         "gets it: pass it (e.g. --port '${PORT}'), or give http.url")
    return spec
