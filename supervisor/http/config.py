"""The front door's settings: where it listens, its token, its limits — from flags and config.

Off unless asked: ``--http ADDR`` on the command line, or an ``http:`` section in
``config.yaml`` of the config directory::

    http:
      listen: 127.0.0.1:8080        # host:port, [v6]:port, a bare port (loopback), or
                                    # unix:/path/to.sock (a path with a / is a socket too)
      token_file: ~/.config/vramtui/http.token   # or VRAMTUI_HTTP_TOKEN in the environment
      max_body: 64MiB               # the largest request body (413 past it)
      heartbeat: 15s                # an SSE comment this often on a quiet stream
      allowed_hosts: [gpu-box.lan]  # Host header names accepted besides loopback's and the
                                    # bind address (DNS-rebinding guard)
      ui: true                      # the dashboard in a browser at /ui (needs textual-serve)
      ui_sessions: 4                # browsers at once (each runs a TUI process)

A flag beats the file.  Binding anything but loopback needs a token (refused otherwise), and
the token file must be yours and private (``chmod 600``), as ssh wants of its keys;
``config.yaml`` itself must be yours (or root's), writable by nobody else, nor its directory
(:func:`~supervisor.paths.read_own`, the descriptors' rule).
Everything here is pure but reading the two files; errors are :class:`HttpConfigError` with
one line that says what to change.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..control import messages as m
from ..errors import VramtuiError
from ..paths import Untrusted, read_own, user_name
from ..units import digits, parse_duration, parse_size

TOKEN_ENV = "VRAMTUI_HTTP_TOKEN"


@dataclass(frozen=True)
class GateLimits:
    """The connection gate's bounds (:mod:`.gate`); here, with the rest of the settings, so
    that reading the settings needs no aiohttp (the TUI reads config.yaml without it)."""

    # Connections open at once, everyone together.
    max_open: int = 1024
    # Of those, the last ones only the engine's own user may take.
    owner_reserve: int = 64
    # Connections one other peer (a local uid, a remote address) may hold open.
    max_per_peer: int = 64
    # Connections one other peer may hold before their request headers arrived.
    max_pending_per_peer: int = 16
    # Seconds a request's headers may take to arrive whole.
    header_timeout_s: float = 10.0
    # Seconds a request's body may go without a byte before it is whole.
    body_idle_s: float = 30.0
    # Bytes a second a body must average past its first body_idle_s (one that dribbles a
    # byte now and then held its connection for good): Apache's mod_reqtimeout MinRate.
    body_min_rate: float = 500.0
DEFAULT_LISTEN = "127.0.0.1:8080"
HTTP_KEYS = frozenset({"enabled", "listen", "token_file", "max_body", "heartbeat",
                       "allowed_hosts", "ui", "ui_sessions", "max_streams"})
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE = 64 * 1024  # a token file is read this far: its first line is the token
MAX_CONFIG_BYTES = 1 << 20  # config.yaml holds settings, not data: larger is the wrong file


# What whoever writes config.yaml gets (a file another user could have written is not read).
SETTINGS_STAKES = ("sets the engine's settings (where the HTTP door listens, which hosts it "
                   "answers)")


class HttpConfigError(VramtuiError):
    """The front door's settings cannot be used as given."""


@dataclass(frozen=True)
class Listen:
    """A TCP host and port, or a Unix socket path."""

    host: str | None = None
    port: int | None = None
    path: Path | None = None

    @property
    def loopback(self) -> bool:
        """Only this machine can connect (a Unix socket counts)."""
        if self.path is not None:
            return True
        return is_loopback(self.host or "")

    def url(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = self.host or ""
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"


@dataclass(frozen=True)
class HttpConfig:
    listen: Listen
    token: str | None = field(default=None, repr=False)
    token_source: str = ""
    max_body: int = m.DEFAULT_MAX_REQUEST
    max_connections: int = m.DEFAULT_MAX_CONNECTIONS  # requests in flight at once
    max_streams: int = 256  # SSE streams and log follows at once
    subscriber_buffer: int = 256 * 1024  # an SSE stream's unsent bytes before it lags
    heartbeat_s: float = 15.0
    allowed_hosts: tuple[str, ...] = ()
    ui: bool = True
    ui_sessions: int = 4
    connections: GateLimits = field(default_factory=GateLimits)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen(text: str) -> Listen:
    """``127.0.0.1:8080``, ``[::1]:8080``, ``8080`` (loopback), ``unix:/p`` or ``/p``."""
    text = str(text).strip()
    if not text:
        raise HttpConfigError("an empty listen address; give HOST:PORT or unix:/PATH")
    if text.startswith("unix:") or "/" in text:
        raw = text.removeprefix("unix:")
        if not raw:
            raise HttpConfigError("unix: needs a socket path, e.g. unix:/run/user/1000/vt.sock")
        path = Path(os.path.abspath(os.path.expanduser(raw)))
        if len(os.fsencode(path)) > 107:
            raise HttpConfigError(f"socket path {path} is over the 107-byte limit of Unix "
                                  "sockets; choose a shorter one")
        return Listen(path=path)
    if digits(text):
        host, port_text = "127.0.0.1", text
    elif text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1:close + 2] != ":":
            raise HttpConfigError(f"bad listen address {text!r}: write an IPv6 one as "
                                  "[::1]:8080")
        host, port_text = text[1:close], text[close + 2:]
    else:
        host, _, port_text = text.rpartition(":")
        if not host:
            raise HttpConfigError(f"bad listen address {text!r}: give the host too, "
                                  "127.0.0.1:PORT (this machine only) or 0.0.0.0:PORT (every "
                                  "interface; needs a token)")
    if not digits(port_text) or not 0 <= int(port_text) <= 65535:
        raise HttpConfigError(f"bad port in {text!r}: a number from 0 to 65535 (0: any free "
                              "port)")
    return Listen(host=host, port=int(port_text))


def read_token(path: Path) -> str:
    """The token in ``path`` (its first line), in a regular file of yours that only you can
    read.  A file another user owns holds a token that user knows (and may change), whatever
    its mode: refused, as ssh refuses such keys.  The owner and mode are those of the file
    opened and read, not of its name looked up again (a link swapped between the two would
    pass a private file's mode and read another's token)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise HttpConfigError(f"cannot read the token file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HttpConfigError(f"the token file {path} is not a regular file")
        if st.st_uid != os.geteuid():
            raise HttpConfigError(
                f"the token file {path} belongs to {user_name(st.st_uid)}, not to you: its "
                "owner knows the token; write your own (chmod 600)")
        if stat.S_IMODE(st.st_mode) & 0o077:
            raise HttpConfigError(f"the token file {path} can be read by others (mode "
                                  f"{stat.S_IMODE(st.st_mode):o}); make it private: "
                                  f"chmod 600 {path}")
        try:
            data = file.read(MAX_TOKEN_FILE).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise HttpConfigError(f"cannot read the token file {path}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
    token = data.strip().splitlines()[0].strip() if data.strip() else ""
    return _check_token(token, str(path))


def _check_token(token: str, source: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise HttpConfigError(f"the token in {source} is too short ({len(token)} characters; "
                              f"at least {MIN_TOKEN_CHARS}); make one with: "
                              "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise HttpConfigError(f"the token in {source} has spaces or control characters")
    return token


#: The sections of ``config.yaml``: any other is a mistake said at the engine's start.
SECTIONS = ("engine", "http")


def read_section(config_file: Path, name: str = "http",
                 example: str = "listen: 127.0.0.1:8080") -> Mapping[str, Any] | None:
    """The ``name:`` mapping of ``config_file`` (None: no file or no section).  Read only when
    no other user could have written it (:func:`~supervisor.paths.read_own`, as descriptors
    are): it says where the HTTP door listens and which hosts it answers.  A section that
    is none of ``SECTIONS`` (``engin:``) is refused, as an unknown key inside one is."""
    try:
        raw = read_own(config_file, SETTINGS_STAKES, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    except Untrusted as exc:
        raise HttpConfigError(f"{config_file} is not read: {exc}") from None
    except OSError as exc:
        raise HttpConfigError(f"cannot read {config_file}: {exc.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise HttpConfigError(f"{config_file} is over {MAX_CONFIG_BYTES:,} bytes: is it the "
                              "right file?")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HttpConfigError(f"{config_file}: not UTF-8 text") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise HttpConfigError(f"{config_file}{where}: not valid YAML") from None
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise HttpConfigError(f"{config_file}: expected a mapping with sections (http: …)")
    unknown = sorted(str(k) for k in doc if k not in SECTIONS)
    if unknown:
        raise HttpConfigError(f"{config_file}: unknown section {unknown[0]!r:.60} (known: "
                              f"{', '.join(SECTIONS)})")
    section = doc.get(name)
    if section is None:
        return None
    if section is True:
        return {}
    if not isinstance(section, Mapping):
        raise HttpConfigError(f"{config_file}: {name}: must be a mapping ({example} …)")
    return section


def load_http_config(*, listen: str | None = None, token_file: str | None = None,
                     config_file: Path | None = None,
                     environ: Mapping[str, str] = os.environ) -> HttpConfig | None:
    """The settings from flags (``listen``, ``token_file``) over ``config_file``'s section;
    None when neither asks for the front door."""
    section = read_section(config_file) if config_file is not None else None
    where = f"{config_file}: http." if config_file is not None else "http."
    if listen is None and (section is None or section.get("enabled") is False):
        return None
    section = dict(section or {})
    for key in section:
        if key not in HTTP_KEYS:
            raise HttpConfigError(f"{where}{key}: unknown setting; known: "
                                  f"{', '.join(sorted(HTTP_KEYS))}")
    address = parse_listen(listen if listen is not None else
                           str(section.get("listen") or DEFAULT_LISTEN))
    token, source = None, ""
    file_name = token_file or section.get("token_file")
    if environ.get(TOKEN_ENV):
        token, source = _check_token(environ[TOKEN_ENV].strip(), TOKEN_ENV), TOKEN_ENV
    elif file_name:
        path = Path(os.path.expanduser(str(file_name)))
        token, source = read_token(path), str(path)
    if not address.loopback and token is None:
        raise HttpConfigError(f"listening on {address.url()} lets other machines in: set a "
                              f"token first ({TOKEN_ENV}, --http-token-file or "
                              "http.token_file), or listen on 127.0.0.1")
    values: dict[str, Any] = {}
    key = ""
    try:
        if section.get(key := "max_body") is not None:
            values["max_body"] = parse_size(section["max_body"]) * 1024 * 1024
            if values["max_body"] <= 0:
                raise ValueError("must be more than 0")
        if section.get(key := "heartbeat") is not None:
            values["heartbeat_s"] = parse_duration(section["heartbeat"], allow_infinite=True)
            if not 0.05 <= values["heartbeat_s"] <= 3600:
                raise ValueError("must be between 0.05 s and 1 h")
        for key in ("ui_sessions", "max_streams"):
            if section.get(key) is not None:
                value = section[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError("must be a whole number, 0 or more")
                values[key] = value
    except ValueError as exc:
        raise HttpConfigError(f"{where}{key}: {exc}") from None
    hosts = section.get("allowed_hosts") or ()
    if isinstance(hosts, str):
        hosts = [hosts]
    if not isinstance(hosts, list | tuple) or not all(isinstance(h, str) for h in hosts):
        raise HttpConfigError(f"{where}allowed_hosts: a list of host names")
    ui = section.get("ui", True)
    if not isinstance(ui, bool):
        raise HttpConfigError(f"{where}ui: true or false")
    return HttpConfig(listen=address, token=token, token_source=source,
                      allowed_hosts=tuple(h.lower() for h in hosts), ui=ui, **values)


#: What ``localhost`` names, by family: a browser (Chrome, Firefox) and curl try both.
LOCALHOST = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}
#: Ports tried for ``:0`` until one is free on both of localhost's addresses.
TWIN_TRIES = 20


def bind_sockets(listen: Listen) -> list[socket.socket]:
    """The listening, non-blocking sockets for ``listen`` (OSError with the reason).

    A TCP address that ``localhost`` reaches (127.0.0.1, ::1, or a wildcard that covers one
    of them) is held on localhost's other address too, on the same port: ``localhost:PORT``
    is both, and a client tries one then the other.  Left free, another user could listen
    there: a client that asks localhost would send it its token, and a browser would load
    that user's page as this server's very origin (its requests, once that user lets go,
    reach us over the other address from the owner's browser).  So the other address is
    ours too, or the start fails saying who holds it (for port 0, another port is drawn)."""
    if listen.path is not None:
        return [_bind_unix(listen.path)]
    assert listen.host is not None and listen.port is not None
    for _ in range(TWIN_TRIES if listen.port == 0 else 1):
        first = _bind_tcp(listen.host, listen.port)
        port = first.getsockname()[1]
        twin_family = _twin_family(first)
        if twin_family is None:
            return [first]
        try:
            twin = socket.socket(twin_family, socket.SOCK_STREAM)
            return [first, _bind(twin, (LOCALHOST[twin_family], port))]
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                return [first]  # no such address on this machine: nobody can hold it
            first.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            if listen.port != 0:
                twin = LOCALHOST[twin_family]
                shown = f"[{twin}]" if ":" in twin else twin
                raise OSError(errno.EADDRINUSE, (
                    f"{shown}:{port}, the other address of localhost:{port}, is held by "
                    "another program, which would get what is sent to localhost (a token "
                    "too) and could serve pages as this server; free it or choose another "
                    "port")) from None
    raise OSError(errno.EADDRINUSE, f"no port was free on both of localhost's addresses in "
                  f"{TWIN_TRIES} tries")


def _twin_family(sock: socket.socket) -> int | None:
    """The family of localhost's other address when ``sock`` holds one of localhost's
    (itself, or a wildcard that covers it); None when localhost does not reach it."""
    try:
        ip = ipaddress.ip_address(str(sock.getsockname()[0]).split("%", 1)[0])
    except ValueError:
        return None
    if not (ip.is_unspecified or ip == ipaddress.ip_address(LOCALHOST[sock.family])):
        return None
    return socket.AF_INET6 if sock.family == socket.AF_INET else socket.AF_INET


def _bind_tcp(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _type, proto, _name, addr = infos[0]
    return _bind(socket.socket(family, socket.SOCK_STREAM, proto), addr)


def _bind(sock: socket.socket, addr: Any) -> socket.socket:
    """``sock`` (TCP) bound to ``addr`` and listening; closed if it cannot be."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return _listening(sock)


def _bind_unix(where: Path) -> socket.socket:
    path = str(where)
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stale socket: nobody answers on it
            else:
                raise OSError(errno.EADDRINUSE, f"something already answers on {path}")
            finally:
                probe.close()
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
    except BaseException:
        sock.close()
        raise
    return _listening(sock)


def _listening(sock: socket.socket) -> socket.socket:
    try:
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
