"""Who may use the control socket: the engine's own user, root, and optionally one group.

The kernel tells us who connected (SO_PEERCRED: pid, uid, gid at connect time); the decision is
a pure function of those numbers so it can be tested without a second user.  Group membership
counts the peer's primary group and its supplementary groups from the group database.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
from dataclasses import dataclass

from worker_sdk.connection import peer_credentials

from ..units import digits


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket) -> PeerCred:
    """The credentials of the process at the other end of a Unix socket."""
    return PeerCred(*peer_credentials(sock))


def resolve_group(name: str) -> int:
    """The gid of group ``name`` (a name or a number); ValueError with a one-line message."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        pass
    if digits(name):
        return int(name)
    raise ValueError(f"no group named {name!r} on this machine (see `getent group`)")


def user_groups(uid: int, primary_gid: int) -> frozenset[int]:
    """Every group ``uid`` belongs to (primary and supplementary); just the primary if unknown."""
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        return frozenset({primary_gid})
    try:
        return frozenset(os.getgrouplist(user, primary_gid))
    except OSError:
        return frozenset({primary_gid})


def is_allowed(peer: PeerCred, *, owner_uid: int, group_gid: int | None = None) -> bool:
    """True for the owner, root, and (when ``group_gid`` is set) members of that group."""
    if peer.uid == owner_uid or peer.uid == 0:
        return True
    if group_gid is None:
        return False
    return peer.gid == group_gid or group_gid in user_groups(peer.uid, peer.gid)


def refusal(peer: PeerCred, group_gid: int | None) -> str:
    """The one-line reason sent to (and logged about) a refused peer."""
    who = f"uid {peer.uid} (pid {peer.pid})"
    if group_gid is None:
        return (f"permission denied: {who} is not the engine's user; only uid {os.geteuid()} "
                "and root may use this engine (see --allow-group)")
    return (f"permission denied: {who} is neither the engine's user nor in group "
            f"{group_gid}")
