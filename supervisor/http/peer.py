"""Who is at the other end of an HTTP connection: another machine, or which local user.

Loopback is not a boundary on a machine with several users: any of them can connect to
127.0.0.1.  So a loopback peer is identified like a control-socket peer, by uid, and it is
identified once, when the connection is accepted, before a byte of it is read
(:func:`identify_socket`, called by :mod:`.gate`).  The truth is the kernel's socket table:
the client's socket is the one whose local address is the connection's remote end and whose
remote address is ours.  It is asked through ``sock_diag`` netlink (one exact lookup, as
``ss`` does), or read from ``/proc/net/tcp`` and ``tcp6`` where netlink is not offered.

Only a row that is ESTABLISHED and carries a socket inode names a user: a client that has
already closed leaves an orphaned or TIME_WAIT row whose uid reads 0 (root), and that must
never count as root.  Such a peer is unknown, and refused.  A Unix socket peer's uid comes
from SO_PEERCRED, which the kernel gives whatever the client does.  Linux only; elsewhere the
uid is unknown.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

from ..control.peer import peer_cred
from ..tcp_table import ESTABLISHED, TABLES, DiagUnavailable, ask_diag, read_rows, sockid

_TABLES = tuple(str(path) for path in TABLES.values())

@dataclass(frozen=True, slots=True)
class Peer:
    """``local``: this machine (loopback or a Unix socket); ``uid``: who, when known;
    ``vouched``: the kernel gave the uid for the socket itself (SO_PEERCRED)."""

    local: bool
    uid: int | None
    address: str
    vouched: bool = False

    def describe(self) -> str:
        who = f"uid {self.uid}" if self.uid is not None else "an unknown user"
        return f"{self.address} ({who})" if self.local else self.address

    def is_user(self, uid: int) -> bool:
        """This machine's user ``uid``, as the kernel says; root counts as every user only
        where the kernel vouches for the socket itself (SO_PEERCRED), never over TCP."""
        if not self.local or self.uid is None:
            return False
        return self.uid == uid or (self.uid == 0 and self.vouched)

    @property
    def key(self) -> str:
        """What the connection limits count by: a local user, or a remote address."""
        if self.local:
            return f"uid {self.uid}" if self.uid is not None else "unknown local"
        return f"host {self.address}"


@dataclass(frozen=True, slots=True)
class SocketRow:
    """The kernel's view of the client's socket: its TCP state, owner and inode."""

    state: int
    uid: int
    inode: int

    @property
    def names_a_user(self) -> bool:
        return self.state == ESTABLISHED and self.inode != 0


def _packed(host: str) -> bytes:
    return ipaddress.ip_address(host.split("%", 1)[0]).packed


def _variants(packed: bytes) -> set[bytes]:
    """An address as the kernel may list it: v4, and v4 mapped into v6 (and back)."""
    out = {packed}
    if len(packed) == 4:
        out.add(b"\0" * 10 + b"\xff\xff" + packed)
    elif packed[:12] == b"\0" * 10 + b"\xff\xff":
        out.add(packed[12:])
    return out


def table_row(client: tuple[str, int], server: tuple[str, int],
              tables: tuple[str, ...] = _TABLES) -> SocketRow | None:
    """The client's row in ``/proc/net/tcp*`` for the connection ``client`` -> ``server``."""
    try:
        client_ips, server_ips = _variants(_packed(client[0])), _variants(_packed(server[0]))
    except ValueError:
        return None
    for table in tables:
        try:
            rows = read_rows(table, local_port=client[1])
        except OSError:
            continue
        for row in rows:
            if row.local[1] == client[1] and row.remote[1] == server[1] \
                    and row.local[0].packed in client_ips and row.remote[0].packed in server_ips:
                return SocketRow(row.state, row.uid, row.inode)
    return None


def diag_row(client: tuple[str, int], server: tuple[str, int]) -> SocketRow | None:
    """The client's socket by its exact four-tuple, asked of the kernel through sock_diag."""
    try:
        src, dst = _packed(client[0]), _packed(server[0])
    except ValueError:
        return None
    family = socket.AF_INET if len(src) == 4 else socket.AF_INET6
    if len(dst) != len(src):
        if family == socket.AF_INET6 and src[:12] == b"\0" * 10 + b"\xff\xff":
            src, family = src[12:], socket.AF_INET
        else:
            return None
    rows = ask_diag(family, exact=sockid((src, client[1]), (dst, server[1])))
    return SocketRow(rows[0].state, rows[0].uid, rows[0].inode) if rows else None


def client_row(client: tuple[str, int], server: tuple[str, int]) -> SocketRow | None:
    """The client's socket row: sock_diag where the kernel answers it, else /proc."""
    try:
        return diag_row(client, server)
    except DiagUnavailable:
        return table_row(client, server)


def loopback_uid(client: tuple[str, int], server: tuple[str, int],
                 tables: tuple[str, ...] | None = None) -> int | None:
    """The uid owning the client's end of the TCP connection ``client`` -> ``server``, or
    None when the kernel does not name one (no row, not established, no inode)."""
    row = client_row(client, server) if tables is None else table_row(client, server, tables)
    return row.uid if row is not None and row.names_a_user else None


def _is_loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address)
                              and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def identify_socket(sock: Any) -> Peer:
    """The peer of an accepted socket (TCP or Unix), asked of the kernel now."""
    family = getattr(sock, "family", None)
    if family == socket.AF_UNIX:
        try:
            cred = peer_cred(sock)
        except (OSError, AttributeError):
            return Peer(True, None, "unix socket")
        return Peer(True, cred.uid, f"unix socket pid {cred.pid}", vouched=True)
    try:
        peername, sockname = sock.getpeername(), sock.getsockname()
    except (OSError, AttributeError):
        return Peer(False, None, "unknown")
    return _identify_tcp(peername, sockname)


def identify(transport: Any) -> Peer:
    """The peer of an asyncio transport; :func:`identify_socket` of its socket."""
    sock = transport.get_extra_info("socket")
    if getattr(sock, "family", None) in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6):
        return identify_socket(sock)
    peername = transport.get_extra_info("peername")
    sockname = transport.get_extra_info("sockname")
    if not peername or not sockname:
        return Peer(False, None, "unknown")
    return _identify_tcp(peername, sockname)


def _identify_tcp(peername: Any, sockname: Any) -> Peer:
    host = str(peername[0])
    if not _is_loopback(host):
        return Peer(False, None, host)
    uid = loopback_uid((host, int(peername[1])), (str(sockname[0]), int(sockname[1])))
    return Peer(True, uid, f"{host}:{peername[1]}")
