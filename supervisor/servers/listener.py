"""Who listens on a model server's port, by the kernel's table of TCP sockets.

A server's command line, ``${PORT}`` included, is readable by every local user, and a server
binds its port when it is ready to (ComfyUI or koboldcpp after loading their model): another
user can listen there first and answer the health checks, and would then be sent the
requests and the server's ``${API_KEY}``. :func:`listeners_of` asks the kernel
(:func:`supervisor.tcp_table.listening`: what every user may read) for the sockets listening
where a connection to the server's URL would go, and their owners' uids. The server handle
sends no secret there before the server's own listener is seen (once it holds the port,
nobody else can take it), and stops the server if one that is not :func:`trusted_uids`'
listens. Where none is listed (not bound yet, or a container's port forwarded by a NAT rule,
its listener in another network namespace), the health check goes without the server's key,
and the table is read again before the server counts as ready.

``localhost`` is two addresses, 127.0.0.1 and ::1, and a server binds one of them: the other,
on the same port, stays free for any user, and a connection to ``localhost`` may try it first
(where it resolves to ::1 first, as on Fedora). So a ``localhost`` URL is sent to as
:func:`pinned` says: to the address the server's own listener holds, which nobody else can
take, never by name.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from yarl import URL

from ..tcp_table import listening

#: What a name in a server's URL may stand for here, by family (loopback names only).
LOOPBACK_NAMES = {"localhost": ("127.0.0.1", "::1")}


def listener_uids(host: str, port: int) -> set[int] | None:
    """The uids of the sockets listening on ``port`` that a connection to ``host`` (an IP
    address) reaches: bound to it, or to its family's wildcard (and for IPv4, IPv6's ``::``,
    which may take IPv4 too); None when the kernel's tables cannot be read here."""
    ip = ipaddress.ip_address(host)
    families = [socket.AF_INET, socket.AF_INET6] if ip.version == 4 else [socket.AF_INET6]
    uids: set[int] = set()
    read = False
    for family in families:
        try:
            rows = listening(family, port)
        except OSError:  # (no IPv6 here, or a /proc that hides them)
            continue
        read = True
        for row in rows:
            bound = row.local[0]
            if bound == ip or bound.is_unspecified or (
                    ip.version == 4 and getattr(bound, "ipv4_mapped", None) == ip):
                uids.add(row.uid)
    return uids if read else None


def _on_this_host(url: str) -> tuple[tuple[str, ...], int, bool] | None:
    """The loopback addresses ``url`` may reach, its port, and whether its host is a name
    (``localhost``) rather than one address; None for another host or no port."""
    parsed = URL(url)
    host = (parsed.host or "").strip("[]").lower()
    if parsed.port is None:
        return None
    addresses = LOOPBACK_NAMES.get(host, (host,))
    try:
        if not all(ipaddress.ip_address(a).is_loopback for a in addresses):
            return None
    except ValueError:
        return None
    return addresses, parsed.port, host in LOOPBACK_NAMES


def listeners_of(url: str) -> set[int] | None:
    """The uids of the sockets listening where a request to ``url`` would go, for a server
    on this host (a loopback address or ``localhost``); None for any other host, whose
    sockets this table does not show, or when the table cannot be read."""
    here = _on_this_host(url)
    if here is None:
        return None
    addresses, port, _named = here
    found = [listener_uids(address, port) for address in addresses]
    if all(uids is None for uids in found):
        return None
    return {uid for uids in found if uids is not None for uid in uids}


def pinned(url: str) -> str:
    """``url`` as the engine sends to it: for a ``localhost`` URL, the same URL on the one of
    localhost's addresses that a :func:`trusted_uids` listener holds (the server's own,
    directly or by a wildcard); any other URL, or one whose listener is not seen (yet), as it
    is."""
    here = _on_this_host(url)
    if here is None or not here[2]:
        return url
    addresses, port, _named = here
    trusted = trusted_uids()
    for address in addresses:
        uids = listener_uids(address, port)
        if uids and uids <= trusted:
            return str(URL(url).with_host(address))
    return url


def trusted_uids() -> frozenset[int]:
    """Whose listener may be the server: the engine's user, and root (who can read all of
    ours anyway: a container's port forwarder, docker-proxy, runs as root)."""
    return frozenset({0, os.getuid()})
