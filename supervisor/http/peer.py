"""Who is at the other end of an HTTP connection: another machine, or which local user.

Loopback is not a boundary on a machine with several users: any of them can connect to
127.0.0.1.  So a loopback peer is identified like a control-socket peer — by uid — read from
the kernel's socket table (``/proc/net/tcp`` and ``tcp6``: the client's socket is the row whose
local address is the connection's remote end and whose remote address is ours).  A Unix
socket peer's uid comes from SO_PEERCRED.  Linux only; elsewhere the uid is unknown.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

from ..control.peer import peer_cred

_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


@dataclass(frozen=True, slots=True)
class Peer:
    """``local``: this machine (loopback or a Unix socket); ``uid``: who, when known."""

    local: bool
    uid: int | None
    address: str

    def describe(self) -> str:
        who = f"uid {self.uid}" if self.uid is not None else "an unknown user"
        return f"{self.address} ({who})" if self.local else self.address


def _hex_address(raw: str) -> tuple[bytes, int]:
    """``0100007F:1F90`` -> (b'\\x7f\\x00\\x00\\x01', 8080); the kernel prints each 32-bit word
    of the address in host (little-endian) order."""
    addr, _, port = raw.partition(":")
    data = bytes.fromhex(addr)
    words = b"".join(data[i:i + 4][::-1] for i in range(0, len(data), 4))
    return words, int(port, 16)


def _packed(host: str) -> bytes:
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    return ip.packed


def _variants(packed: bytes) -> set[bytes]:
    """An address as the kernel may list it: v4, and v4 mapped into v6 (and back)."""
    out = {packed}
    if len(packed) == 4:
        out.add(b"\0" * 10 + b"\xff\xff" + packed)
    elif packed[:12] == b"\0" * 10 + b"\xff\xff":
        out.add(packed[12:])
    return out


def loopback_uid(client: tuple[str, int], server: tuple[str, int],
                 tables: tuple[str, ...] = _TABLES) -> int | None:
    """The uid owning the client's end of the TCP connection ``client`` -> ``server``."""
    try:
        client_ips, server_ips = _variants(_packed(client[0])), _variants(_packed(server[0]))
    except ValueError:
        return None
    for table in tables:
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) < 8:
                        continue
                    try:
                        local, remote = _hex_address(parts[1]), _hex_address(parts[2])
                    except ValueError:
                        continue
                    if (local[1] == client[1] and remote[1] == server[1]
                            and local[0] in client_ips and remote[0] in server_ips):
                        return int(parts[7])
        except OSError:
            continue
    return None


def identify(transport: Any) -> Peer:
    """The peer of an asyncio transport (TCP or Unix)."""
    sock = transport.get_extra_info("socket")
    family = getattr(sock, "family", None)
    if family == socket.AF_UNIX:
        try:
            cred = peer_cred(sock)
        except (OSError, AttributeError):
            return Peer(True, None, "unix socket")
        return Peer(True, cred.uid, f"unix socket pid {cred.pid}")
    peername = transport.get_extra_info("peername")
    sockname = transport.get_extra_info("sockname")
    if not peername or not sockname:
        return Peer(False, None, "unknown")
    host = str(peername[0])
    try:
        loop = ipaddress.ip_address(host.split("%", 1)[0])
        is_local = loop.is_loopback or (
            isinstance(loop, ipaddress.IPv6Address) and loop.ipv4_mapped is not None
            and loop.ipv4_mapped.is_loopback)
    except ValueError:
        is_local = False
    if not is_local:
        return Peer(False, None, host)
    uid = loopback_uid((host, int(peername[1])), (str(sockname[0]), int(sockname[1])))
    return Peer(True, uid, f"{host}:{peername[1]}")
