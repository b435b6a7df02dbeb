"""Where NVIDIA Dynamo is imported (lazily, here only) and where it looks for its peers.

Nothing in :mod:`worker_sdk.dynamo` imports Dynamo at module level: :func:`import_dynamo`
returns the names the package uses, or raises :class:`DynamoMissing` (an ``ImportError``, as
AITune's ``dynamo_worker`` raises when ``ai-dynamo-runtime`` is absent) with a one-line message.
"""

from __future__ import annotations

import grp
import importlib.util
import os
import pwd
import stat
from types import SimpleNamespace

MISSING_MESSAGE = ("worker_sdk.dynamo needs NVIDIA Dynamo (ai-dynamo-runtime): "
                   "pip install 'vramtui[dynamo]'")


class DynamoMissing(ImportError):
    """``ai-dynamo-runtime`` is not installed, or does not import; the message is one line."""

    def __init__(self, message: str = MISSING_MESSAGE) -> None:
        super().__init__(message)


def import_dynamo() -> SimpleNamespace:
    """The Dynamo names this package uses; :class:`DynamoMissing` when Dynamo is absent."""
    try:
        from dynamo.llm import HttpError, ModelInput, ModelType, WorkerType, register_model
        from dynamo.llm.exceptions import Cancelled, WorkerUnavailable
        from dynamo.runtime import Context, DistributedRuntime
    except ImportError as exc:
        try:
            spec = importlib.util.find_spec("dynamo")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise DynamoMissing() from exc
        where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "?"
        detail = " ".join(str(exc).split())
        raise DynamoMissing(
            f"worker_sdk.dynamo cannot import NVIDIA Dynamo (the 'dynamo' at {where}: "
            f"{detail}); reinstall: pip install 'vramtui[dynamo]'"
        ) from exc
    return SimpleNamespace(
        Cancelled=Cancelled,
        Context=Context,
        DistributedRuntime=DistributedRuntime,
        HttpError=HttpError,
        ModelInput=ModelInput,
        ModelType=ModelType,
        WorkerType=WorkerType,
        WorkerUnavailable=WorkerUnavailable,
        register_model=register_model,
    )


class UnsafeDiscoveryDir(RuntimeError):
    """The file-discovery directory is one another user could write; the message is one line."""


def apply_discovery_dir(directory: str) -> None:
    """Point Dynamo (this process) at file discovery in ``directory``, TCP, ZMQ: no etcd/NATS.
    The directory is made (private) and checked when a runtime starts
    (:func:`secure_discovery_dir`)."""
    os.environ["DYN_DISCOVERY_BACKEND"] = "file"
    os.environ["DYN_FILE_KV"] = os.path.abspath(directory)
    os.environ.setdefault("DYN_REQUEST_PLANE", "tcp")
    os.environ.setdefault("DYN_EVENT_PLANE", "zmq")


def apply_enable_nats() -> None:
    """AITune's ``enable_nats=True``: Dynamo 1.6.1 reads it from the event plane's setting."""
    os.environ["DYN_EVENT_PLANE"] = "nats"


def discovery_backend() -> str:
    return os.environ.get("DYN_DISCOVERY_BACKEND", "etcd")


def request_plane() -> str:
    return os.environ.get("DYN_REQUEST_PLANE", "tcp")


# -- file discovery: a directory only we may write -----------------------------------------
#
# Dynamo's file backend trusts every file in its directory: an entry there names the TCP
# address a client sends its requests to.  Another user who can write the directory (one
# they made first in /tmp: Dynamo's default is /tmp/dynamo_store_kv, a fixed name) can plant
# an instance that receives every request, and remove ours.  So before a runtime starts with
# file discovery, the directory must be ours (made 0700 when missing), no directory in it
# writable by group or others, and no directory above it writable by another user (unless
# sticky, as /tmp); Dynamo is then given the checked path, links resolved.  It is made 0700
# too: an entry's instance id is what Dynamo's TCP request plane asks of a request, so a user
# who can read the entries can send jobs to every endpoint listed there.

FILE_KV_NAME = "dynamo_store_kv"  # Dynamo 1.6.1's file store without DYN_FILE_KV: $TMPDIR/this


def file_discovery_dir() -> str | None:
    """The directory Dynamo's file discovery will use (``DYN_FILE_KV``, else Dynamo's default
    in ``$TMPDIR`` or ``/tmp``); None when discovery is not the file backend."""
    if discovery_backend() != "file":
        return None
    configured = os.environ.get("DYN_FILE_KV")
    if configured:
        return os.path.abspath(configured)
    return os.path.join(os.environ.get("TMPDIR") or "/tmp", FILE_KV_NAME)


def secure_discovery_dir() -> str | None:
    """Check (and create, private) the file-discovery directory; point ``DYN_FILE_KV`` at it,
    links resolved.  None when discovery is not the file backend; :class:`UnsafeDiscoveryDir`
    (one line) when another user could write it."""
    directory = file_discovery_dir()
    if directory is None:
        return None
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UnsafeDiscoveryDir(f"cannot create the Dynamo discovery directory {directory}: "
                                 f"{exc.strerror or exc}") from None
    real = os.path.realpath(directory)
    uid = os.geteuid()
    advice = ("another user could add endpoints there and receive your requests; use a "
              "directory of your own (--discovery-dir DIR or DYN_FILE_KV)")
    try:
        st = os.stat(real)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeDiscoveryDir(f"the Dynamo discovery directory {directory} is not a "
                                     "directory")
        if st.st_uid != uid:
            raise UnsafeDiscoveryDir(f"the Dynamo discovery directory {_named(directory, real)} "
                                     f"belongs to {_user(st.st_uid)}, not to you: {advice}")
        for parent in _parents(real):
            if _others_may_change(os.stat(parent), uid):
                raise UnsafeDiscoveryDir(
                    f"the Dynamo discovery directory {_named(directory, real)} is in {parent}, "
                    f"which another user can change: {advice}")
        if stat.S_IMODE(st.st_mode) & 0o077:  # its entries' instance ids open the endpoints
            os.chmod(real, 0o700)
        # Made private just now: what another user may have put there before must go too.
        # Our other processes write there meanwhile: Dynamo writes an entry as .tmp_<id>,
        # links it to its name and unlinks the temporary, and removes an instance's entry
        # when it stops, so what was listed a moment ago may be gone (and is no threat).
        for top, dirs, files in os.walk(real):  # (links are not followed)
            for path in (top, *(os.path.join(top, name) for name in (*dirs, *files))):
                try:
                    sub = os.lstat(path)
                except FileNotFoundError:
                    continue
                if stat.S_ISLNK(sub.st_mode) or sub.st_uid != uid:
                    raise UnsafeDiscoveryDir(
                        f"the Dynamo discovery directory {_named(directory, real)} holds "
                        f"{path}, which " + ("is a link" if stat.S_ISLNK(sub.st_mode) else
                                             f"belongs to {_user(sub.st_uid)}") + f": {advice}")
    except OSError as exc:
        raise UnsafeDiscoveryDir(f"cannot check the Dynamo discovery directory {directory}: "
                                 f"{exc.strerror or exc}") from None
    os.environ["DYN_FILE_KV"] = real
    return real


def _others_may_change(st: os.stat_result, uid: int) -> bool:
    """Whether a user other than ``uid`` (and root) may rename or replace what is in this
    directory: its owner is another, or it is writable by others (unless sticky, as /tmp),
    or by a group that is not ``uid``'s own private one (umask 002 makes every directory
    group-writable for a group of one)."""
    if st.st_uid not in (uid, 0):
        return True
    if st.st_mode & stat.S_ISVTX:
        return False
    if st.st_mode & 0o002:
        return True
    return bool(st.st_mode & 0o020) and not _private_group(st.st_gid, uid)


def _private_group(gid: int, uid: int) -> bool:
    """``gid`` is ``uid``'s primary group and has no other member."""
    try:
        user = pwd.getpwuid(uid)
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        return False
    if user.pw_gid != gid or members - {user.pw_name}:
        return False
    return not any(other.pw_gid == gid and other.pw_uid != uid for other in pwd.getpwall())


def _parents(path: str) -> list[str]:
    out = []
    while (parent := os.path.dirname(path)) != path:
        out.append(parent)
        path = parent
    return out


def _named(directory: str, real: str) -> str:
    return directory if directory == real else f"{directory} (that is {real})"


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"
