"""The kernel's table of TCP sockets: the one reader of it, for who holds a socket — a
connection's client (:mod:`supervisor.http.peer`), a port's listeners
(:mod:`supervisor.servers.listener`).

Two ways to read it, both open to every user: ``sock_diag`` netlink (:func:`ask_diag`, as
``ss`` asks: one exact socket, or a dump of the sockets in some states), and
``/proc/net/tcp`` and ``/proc/net/tcp6`` (:func:`read_rows`), where netlink is not offered.
The /proc files list every socket of the host, TIME_WAIT ones included: on a busy host, tens
of thousands of lines that the kernel prints and we parse (3,400 took 30 ms here), on the
engine's loop. So :func:`listening` asks netlink for the listening sockets alone (a dump of
them: a tenth of a millisecond), and reads /proc only where netlink does not answer, or
answers nothing where /proc lists listeners (a sandbox that fakes it: /proc is read beside
it until one of the two names a listener; :data:`diag_state`). Linux only; elsewhere neither
can be read (OSError).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

TABLES = {socket.AF_INET: Path("/proc/net/tcp"), socket.AF_INET6: Path("/proc/net/tcp6")}
ESTABLISHED = 0x01  # the ``st`` column, and sock_diag's state
LISTEN = 0x0A
#: Whether :func:`listening` may ask netlink (False: /proc only).
use_diag = True

# sock_diag (linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 0x1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_NLMSG_HDR = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_DIAG_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_DIAG_MSG_HEAD = struct.Struct("=BBBB")  # family, state, timer, retrans
_SOCKID = struct.Struct("!HH16s16s")  # source port, destination port, source, destination
_SOCKID_LEN = 48  # (then the interface and the cookie)
_DIAG_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_NO_COOKIE = 0xFFFFFFFF
#: The most answers a dump is read for (a host listening on more is read from /proc).
_DUMP_MOST = 65536


@dataclass(frozen=True, slots=True)
class Row:
    """One socket: its local and remote ends, TCP state, owner and inode."""

    local: tuple[Address, int]
    remote: tuple[Address, int]
    state: int
    uid: int
    inode: int


class DiagUnavailable(OSError):
    """This kernel (or sandbox) does not answer sock_diag: read /proc instead."""


def endpoint(raw: str) -> tuple[Address, int]:
    """``0100007F:1F90`` -> (127.0.0.1, 8080): the kernel prints each 32-bit word of the
    address as the number the machine reads (its own byte order), the port in hex."""
    hex_ip, _, hex_port = raw.partition(":")
    packed = b"".join(int(hex_ip[i:i + 8], 16).to_bytes(4, sys.byteorder)
                      for i in range(0, len(hex_ip), 8))
    return ipaddress.ip_address(packed), int(hex_port, 16)


def read_rows(table: str | Path, *, state: int | None = None,
              local_port: int | None = None) -> list[Row]:
    """The sockets of one table (its malformed lines left out), those in ``state`` and on
    ``local_port`` only when given (the others are not parsed); OSError when it cannot be
    read."""
    with open(table, encoding="ascii") as f:
        lines = f.read().splitlines()[1:]
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 10:
            continue
        try:
            if state is not None and int(parts[3], 16) != state:
                continue
            if local_port is not None and int(parts[1].rpartition(":")[2], 16) != local_port:
                continue
            out.append(Row(endpoint(parts[1]), endpoint(parts[2]), int(parts[3], 16),
                           int(parts[7]), int(parts[9])))
        except ValueError:
            continue
    return out


@dataclass
class DiagState:
    """What this process has learned of netlink: the families it refused (each then read
    from /proc alone, by the peer check and the listener check), and whether its answers
    are true (None: not known yet; False: a sandbox's empty answers, where /proc listed
    listeners)."""

    refused: set[int] = field(default_factory=set)
    truthful: bool | None = None


diag_state = DiagState()


def sockid(local: tuple[bytes, int], remote: tuple[bytes, int]) -> bytes:
    """sock_diag's ``inet_diag_sockid`` of one connection (packed addresses, ports)."""
    return (_SOCKID.pack(local[1], remote[1], local[0].ljust(16, b"\0"),
                         remote[0].ljust(16, b"\0"))
            + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))


def ask_diag(family: int, *, states: int = 0xFFFFFFFF, exact: bytes | None = None
             ) -> list[Row]:
    """Ask sock_diag for the TCP sockets of ``family``: the one whose ``sockid`` is
    ``exact`` (none when it is gone), or a dump of those in ``states`` (a bit per state).
    :class:`DiagUnavailable` when the kernel does not answer it, and from then on for that
    family without asking (``diag_state.refused``)."""
    if family in diag_state.refused:
        raise DiagUnavailable("sock_diag refused before")
    try:
        return _ask_diag(family, states, exact)
    except DiagUnavailable:
        diag_state.refused.add(family)
        raise


def _ask_diag(family: int, states: int, exact: bytes | None) -> list[Row]:
    flags = _NLM_F_REQUEST if exact is not None else _NLM_F_REQUEST | _NLM_F_DUMP
    body = _DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, states) + (
        exact if exact is not None else bytes(_SOCKID_LEN))
    message = _NLMSG_HDR.pack(_NLMSG_HDR.size + len(body), _SOCK_DIAG_BY_FAMILY, flags, 1,
                              0) + body
    try:
        nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
    except (OSError, AttributeError) as exc:
        raise DiagUnavailable(str(exc)) from None
    rows: list[Row] = []
    try:
        nl.settimeout(1.0)
        nl.send(message)
        while True:
            data = nl.recv(65536)
            if not data:
                raise DiagUnavailable("netlink closed")
            if _read_answers(data, family, rows) or exact is not None:
                return rows
            if len(rows) > _DUMP_MOST:
                raise DiagUnavailable(f"more than {_DUMP_MOST} sockets")
    except DiagUnavailable:
        raise
    except OSError as exc:
        raise DiagUnavailable(str(exc)) from None
    finally:
        nl.close()


def _read_answers(data: bytes, family: int, rows: list[Row]) -> bool:
    """Add the sockets of one netlink datagram to ``rows``; True once the answer is done."""
    offset = 0
    while offset + _NLMSG_HDR.size <= len(data):
        length, kind = _NLMSG_HDR.unpack_from(data, offset)[:2]
        if length < _NLMSG_HDR.size or offset + length > len(data):
            raise DiagUnavailable("malformed netlink answer")
        start = offset + _NLMSG_HDR.size
        if kind == _NLMSG_DONE:
            return True
        if kind == _NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, start)
            if code == 0 or -code == errno.ENOENT:  # (ENOENT: no such socket: it is gone)
                return True
            raise DiagUnavailable(f"sock_diag error {-code}")
        if kind != _SOCK_DIAG_BY_FAMILY:
            raise DiagUnavailable(f"unexpected netlink message {kind}")
        tail = start + _DIAG_MSG_HEAD.size + _SOCKID_LEN
        if tail + _DIAG_MSG_TAIL.size > offset + length:
            raise DiagUnavailable("short sock_diag message")
        state = _DIAG_MSG_HEAD.unpack_from(data, start)[1]
        lport, rport, local, remote = _SOCKID.unpack_from(data, start + _DIAG_MSG_HEAD.size)
        uid, inode = _DIAG_MSG_TAIL.unpack_from(data, tail)[3:]
        size = 4 if family == socket.AF_INET else 16
        rows.append(Row((ipaddress.ip_address(local[:size]), lport),
                        (ipaddress.ip_address(remote[:size]), rport), state, uid, inode))
        offset += (length + 3) & ~3
    return False


def listening(family: int, port: int) -> list[Row]:
    """The sockets of ``family`` listening on ``port``: asked of netlink (a dump of the
    listeners) where it answers truly, else read from /proc; OSError when neither can be."""
    state = diag_state
    if use_diag and state.truthful is not False:
        try:
            rows = ask_diag(family, states=1 << LISTEN)
        except DiagUnavailable:
            pass
        else:
            if state.truthful is None:  # until one of the two names a listener: /proc too
                try:
                    listed = read_rows(TABLES[family], state=LISTEN)
                except OSError:
                    listed = []
                if not rows and not listed:
                    return []  # (the same answer: nothing told of netlink yet)
                state.truthful = bool(rows)
            if state.truthful:
                return [r for r in rows if r.local[1] == port]
    return read_rows(TABLES[family], state=LISTEN, local_port=port)
