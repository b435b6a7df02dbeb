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
import struct
from dataclasses import dataclass
from typing import Any

from ..control.peer import peer_cred
from ..tcp_table import ESTABLISHED, TABLES, read_rows

_TABLES = tuple(str(path) for path in TABLES.values())

# sock_diag (linux/sock_diag.h, linux/inet_diag.h)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NLMSG_HDR = struct.Struct("=IHHII")
_DIAG_REQ = struct.Struct("=BBBBI")
_DIAG_MSG_HEAD = struct.Struct("=BBBB")
_DIAG_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_SOCKID_LEN = 48
_NO_COOKIE = 0xFFFFFFFF


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


class DiagUnavailable(OSError):
    """This kernel (or sandbox) does not answer sock_diag: read /proc instead."""


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
            rows = read_rows(table)
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
    sockid = (struct.pack("!HH", client[1], server[1]) + src.ljust(16, b"\0")
              + dst.ljust(16, b"\0") + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))
    body = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    message = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), _SOCK_DIAG_BY_FAMILY,
                              _NLM_F_REQUEST, 1, 0) + body
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError) as exc:
        raise DiagUnavailable(str(exc)) from None
    try:
        nl.settimeout(1.0)
        nl.send(message)
        data = nl.recv(8192)
    except OSError as exc:
        raise DiagUnavailable(str(exc)) from None
    finally:
        nl.close()
    if len(data) < _NLMSG_HDR.size:
        raise DiagUnavailable("short netlink answer")
    _length, kind = _NLMSG_HDR.unpack_from(data)[:2]
    if kind == _NLMSG_ERROR:
        (errno_,) = struct.unpack_from("=i", data, _NLMSG_HDR.size)
        if -errno_ == 2:  # ENOENT: no such socket (it is gone)
            return None
        raise DiagUnavailable(f"sock_diag error {-errno_}")
    if kind != _SOCK_DIAG_BY_FAMILY:
        raise DiagUnavailable(f"unexpected netlink message {kind}")
    offset = _NLMSG_HDR.size
    state = _DIAG_MSG_HEAD.unpack_from(data, offset)[1]
    _exp, _rq, _wq, uid, inode = _DIAG_MSG_TAIL.unpack_from(
        data, offset + _DIAG_MSG_HEAD.size + _SOCKID_LEN)
    return SocketRow(state, uid, inode)


_diag_works = True


def client_row(client: tuple[str, int], server: tuple[str, int]) -> SocketRow | None:
    """The client's socket row: sock_diag where the kernel answers it, else /proc."""
    global _diag_works
    if _diag_works:
        try:
            return diag_row(client, server)
        except DiagUnavailable:
            _diag_works = False
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
