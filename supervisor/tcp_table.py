"""The kernel's table of TCP sockets, as ``/proc/net/tcp`` and ``/proc/net/tcp6`` print it
(readable by every user): the one reader of it, for who holds a socket — a connection's
client (:mod:`supervisor.http.peer`), a port's listeners (:mod:`supervisor.servers.listener`).
Linux only; elsewhere the tables cannot be read (OSError).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

TABLES = {socket.AF_INET: Path("/proc/net/tcp"), socket.AF_INET6: Path("/proc/net/tcp6")}
ESTABLISHED = 0x01  # the ``st`` column
LISTEN = 0x0A


@dataclass(frozen=True, slots=True)
class Row:
    """One socket: its local and remote ends, TCP state, owner and inode."""

    local: tuple[Address, int]
    remote: tuple[Address, int]
    state: int
    uid: int
    inode: int


def endpoint(raw: str) -> tuple[Address, int]:
    """``0100007F:1F90`` -> (127.0.0.1, 8080): the kernel prints each 32-bit word of the
    address as the number the machine reads (its own byte order), the port in hex."""
    hex_ip, _, hex_port = raw.partition(":")
    packed = b"".join(int(hex_ip[i:i + 8], 16).to_bytes(4, sys.byteorder)
                      for i in range(0, len(hex_ip), 8))
    return ipaddress.ip_address(packed), int(hex_port, 16)


def read_rows(table: str | Path) -> list[Row]:
    """The sockets of one table (its malformed lines left out); OSError when it cannot be
    read."""
    with open(table, encoding="ascii") as f:
        lines = f.read().splitlines()[1:]
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) < 10:
            continue
        try:
            out.append(Row(endpoint(parts[1]), endpoint(parts[2]), int(parts[3], 16),
                           int(parts[7]), int(parts[9])))
        except ValueError:
            continue
    return out
