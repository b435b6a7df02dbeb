"""Whom a client trusts to be the engine — checked before a single byte is sent.

``/tmp`` is shared, so the socket a client finds there may have been put there by another
user, who would then receive every request (payloads included) and answer with made-up job
ids.  Before connecting, a client checks the socket's directory (a real directory, not a link;
owned by a trusted user; writable by nobody else, unless sticky like ``/tmp`` itself) and the
socket file (not a link, owned by a trusted user).  After connecting and before its hello, it
asks the kernel who serves the socket (``SO_PEERCRED``: the server's uid when it listened).

Trusted: the client's own user and root, plus the one user named by ``VRAMTUI_ENGINE_USER``
(a name or a uid) — the owner of an engine shared with a group through ``--allow-group``.
Every refusal is :class:`UntrustedEngine` with one line that says what is wrong and what to do.
"""

from __future__ import annotations

import os
import pwd
import socket
import stat
from collections.abc import Mapping

from worker_sdk.connection import TRUST_VARIABLE, UnknownTrustedUser, trusted_user_uids

from ..paths import user_name
from .errors import UntrustedEngine
from .peer import PeerCred, peer_cred

_WHAT_TO_DO = ("remove it (it may need root), or set XDG_RUNTIME_DIR or VRAMTUI_RUNTIME_DIR to "
               "a private directory; `vramtui --serve` moves away from a squatted /tmp "
               "directory by itself")


def trusted_uids(environ: Mapping[str, str] = os.environ) -> frozenset[int]:
    """Our own uid, root, and the user ``VRAMTUI_ENGINE_USER`` names (if any): the worker
    SDK's one reader of it (workers check their server the same way)."""
    try:
        return trusted_user_uids(environ)
    except UnknownTrustedUser as exc:
        raise UntrustedEngine(f"{exc} (see `getent passwd`)") from None


def _stranger(uid: int) -> str:
    me = os.geteuid()
    hint = ""
    if uid not in (me, 0):
        hint = (f" (if that user shares an engine with you on purpose, set "
                f"{TRUST_VARIABLE}={_name(uid)})")
    return f"{user_name(uid)}, not to you ({user_name(me)}) or root{hint}"


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def check_socket_path(path: str, trusted: frozenset[int]) -> None:
    """Refuse a socket whose directory or file another user controls (before connecting).

    A missing directory or socket is not refused here: connecting then says nobody runs.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    try:
        st = os.lstat(directory)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedEngine(
            f"refusing the engine socket {path}: its directory {directory} is a symbolic link "
            f"(to {os.readlink(directory)}, made by {user_name(st.st_uid)}); nothing was sent; "
            + _WHAT_TO_DO)
    if st.st_uid not in trusted:
        raise UntrustedEngine(
            f"refusing the engine socket {path}: its directory {directory} belongs to "
            f"{_stranger(st.st_uid)} — another user may be impersonating the engine; nothing "
            "was sent; " + _WHAT_TO_DO)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise UntrustedEngine(
            f"refusing the engine socket {path}: its directory {directory} is writable by "
            f"other users (mode {mode:04o}), so anyone could have replaced the socket; nothing "
            f"was sent; make it private (chmod 700 {directory}) or use another directory")
    try:
        sock_st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISLNK(sock_st.st_mode):
        raise UntrustedEngine(
            f"refusing the engine socket {path}: it is a symbolic link (to {os.readlink(path)}"
            f", made by {user_name(sock_st.st_uid)}); nothing was sent; remove it")
    if sock_st.st_uid not in trusted:
        raise UntrustedEngine(
            f"refusing the engine socket {path}: it belongs to {_stranger(sock_st.st_uid)} — "
            "another user may be impersonating the engine; nothing was sent; remove it")


def check_peer(sock: socket.socket, path: str, trusted: frozenset[int]) -> PeerCred | None:
    """Refuse a connected socket whose server runs as an untrusted user (before any send).

    None where the platform cannot tell (no ``SO_PEERCRED``): the path checks stand alone.
    """
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        peer = peer_cred(sock)
    except OSError as exc:
        raise UntrustedEngine(f"cannot tell who serves {path} ({exc.strerror or exc}); "
                              "refusing to send anything to it") from None
    if peer.uid not in trusted:
        raise UntrustedEngine(
            f"refusing the engine at {path}: it is served by pid {peer.pid} of "
            f"{_stranger(peer.uid)} — another user may be impersonating the engine; nothing "
            "was sent; " + _WHAT_TO_DO)
    return peer
