"""Where vramtui keeps its files: the one module that owns every path.

Three roots, each overridable by an environment variable:

- config:  ``$VRAMTUI_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/vramtui``, else ``~/.config/vramtui``
- state:   ``$VRAMTUI_STATE_DIR``, else ``$XDG_STATE_HOME/vramtui``, else ``~/.local/state/vramtui``
- runtime: ``$VRAMTUI_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/vramtui``, else ``/tmp/vramtui-$UID``

Everything else (sockets, lock, journal, logs, calibration reports and overlays, the worker
records, the simulated GPU's ledger) is derived from them here, by a property or method of
:class:`Paths`; no other module joins a file name to one of these directories
(``tests/test_paths.py`` looks).  Two paths live outside the three roots and are built here
too: the systemd user unit (:func:`service_unit_path`) and the name of a per-process record
(:func:`pid_record`).

``Paths.ensure()`` creates the directories private (0700) and checks that the socket paths fit
in ``sockaddr_un``.  Runtime and state paths are created and opened without following symbolic
links (``O_NOFOLLOW``, then ``fstat``/``fchmod`` on the open directory, never on a name that
could be swapped): a runtime directory that is a link, is not a directory, or belongs to
another user is refused, and so is a state directory that is not ours.  Config directories may
be links (dotfiles often are).

Squatting.  ``/tmp`` is shared: another user can create ``/tmp/vramtui-$UID`` first.  When that
implicit default is taken by someone else, the engine does not give up: it makes a private
directory of its own with an unguessable name (``/tmp/vramtui-$UID.XXXXXXXX``) and records it
in the state directory (``runtime-dir``, a file under our own home), where clients find it; an
explicitly chosen runtime directory that is not ours is refused with a one-line message.
Clients check the runtime directory and the server's peer credentials themselves before
sending anything (:mod:`supervisor.control.trust`).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

APP = "vramtui"
PRIVATE_MODE = 0o700
FILE_MODE = 0o600
RUNTIME_POINTER = "runtime-dir"  # in the state directory: where a squatted runtime dir moved
BACKENDS_DIR = "backends.d"  # in the config directory: the user's descriptors and overlays
REPORT_STAMP = "%Y%m%d-%H%M%S"  # strftime format of the stamp in a calibration report's name
SERVICE_UNIT = f"{APP}.service"
_REPORT_NAME = r"^(?P<backend>.+)-(?P<stamp>\d{8}-\d{6})\.json$"

# sun_path holds this many bytes including the terminating NUL (Linux 108, BSD/macOS 104).
SUN_PATH_SIZE = 104 if sys.platform == "darwin" or "bsd" in sys.platform else 108
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# logging and tempfile are imported where they are used: every CLI command builds Paths, and
# the two cost `vramtui status` ~9 ms of its 100 ms start.


class PathsError(RuntimeError):
    """A vramtui directory cannot be used; the message names it and says what to do."""


class SocketPathTooLong(PathsError):
    """A Unix socket path would not fit in ``sockaddr_un``."""


class NotOurs(PathsError):
    """A path that must be ours belongs to someone else, or is a link, or is not a directory."""


def _home(environ: Mapping[str, str]) -> Path:
    home = environ.get("HOME")
    if home:
        return Path(home)
    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def _expand(value: str, home: Path) -> Path:
    """``~`` from the given home, and relative paths made absolute (never resolving links)."""
    if value == "~" or value.startswith("~/"):
        value = str(home) + value[1:]
    return Path(os.path.abspath(value))


def _override(environ: Mapping[str, str], name: str, home: Path) -> Path | None:
    value = environ.get(name, "")
    return _expand(value, home) if value else None


def _xdg(environ: Mapping[str, str], name: str) -> Path | None:
    # The XDG spec says relative values are invalid and must be ignored.
    value = environ.get(name, "")
    return Path(value) if value and os.path.isabs(value) else None


def default_runtime_dir(uid: int | None = None) -> Path:
    """``/tmp/vramtui-$UID``: the runtime directory when nothing says otherwise."""
    return Path(f"/tmp/{APP}-{os.getuid() if uid is None else uid}")


def user_name(uid: int) -> str:
    """``uid 1001 (mallory)`` for messages."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


@dataclass(frozen=True)
class Paths:
    """The three roots; every other path is a property derived from them.

    ``implicit_runtime`` is true when the runtime directory is the ``/tmp`` default (no
    variable chose it): only then may :meth:`ensure` move it away from a squatter.
    """

    config_dir: Path
    state_dir: Path
    runtime_dir: Path
    implicit_runtime: bool = field(default=False, compare=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Paths:
        home = _home(environ)
        config = _override(environ, "VRAMTUI_CONFIG_DIR", home) or (
            (_xdg(environ, "XDG_CONFIG_HOME") or home / ".config") / APP
        )
        state = _override(environ, "VRAMTUI_STATE_DIR", home) or (
            (_xdg(environ, "XDG_STATE_HOME") or home / ".local" / "state") / APP
        )
        runtime = _override(environ, "VRAMTUI_RUNTIME_DIR", home)
        implicit = False
        if runtime is None:
            xdg_runtime = _xdg(environ, "XDG_RUNTIME_DIR")
            if xdg_runtime:
                runtime = xdg_runtime / APP
            else:
                runtime, implicit = default_runtime_dir(), True
                if not _is_our_dir(runtime):  # squatted (or gone): where the engine moved
                    runtime = read_runtime_pointer(state / RUNTIME_POINTER) or runtime
        return cls(config_dir=config, state_dir=state, runtime_dir=runtime,
                   implicit_runtime=implicit)

    # -- config ------------------------------------------------------------------------------
    @property
    def backends_dir(self) -> Path:
        return backends_dir_of(self.config_dir)

    def calibration_overlay(self, backend: str) -> Path:
        """Where a calibration writes ``backend``'s measured figures: last in ``backends.d``
        (``zz-``), so that they win over the user's own files."""
        return self.backends_dir / f"zz-calibrated-{backend}.yaml"

    @property
    def settings_file(self) -> Path:
        """The engine's settings (its ``http:`` section, for now)."""
        return self.config_dir / "config.yaml"

    # -- state -------------------------------------------------------------------------------
    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def journal_path(self) -> Path:
        return self.state_dir / "journal.sqlite3"

    @property
    def calibration_dir(self) -> Path:
        return self.state_dir / "calibration"

    @property
    def yields_path(self) -> Path:
        """The GPUs handed over (``vramtui yield``): they stay so across a restart."""
        return self.state_dir / "yielded.json"

    @property
    def timings_path(self) -> Path:
        """The measured load, wake and job times: a restart keeps them."""
        return self.state_dir / "timings.json"

    @property
    def runtime_pointer(self) -> Path:
        """Where the engine records the runtime directory it moved to (see the module doc)."""
        return self.state_dir / RUNTIME_POINTER

    def worker_log_path(self, backend: str) -> Path:
        """The stderr log of one backend's worker."""
        return self.logs_dir / f"{backend}.log"

    def calibration_report(self, backend: str, stamp: str) -> Path:
        """The report of ``backend``'s calibration begun at ``stamp`` (``REPORT_STAMP``);
        :func:`parse_report_name` reads the name back."""
        return self.calibration_dir / f"{backend}-{stamp}.json"

    # -- runtime -----------------------------------------------------------------------------
    @property
    def control_socket(self) -> Path:
        return self.runtime_dir / "control.sock"

    @property
    def worker_control_socket(self) -> Path:
        return self.runtime_dir / "workers.ctrl.sock"

    @property
    def worker_data_socket(self) -> Path:
        return self.runtime_dir / "workers.data.sock"

    @property
    def lock_path(self) -> Path:
        return self.runtime_dir / "engine.lock"

    @property
    def sim_dir(self) -> Path:
        """The simulated GPU's ledger: one :func:`pid_record` per worker process."""
        return self.runtime_dir / "simgpu"

    @property
    def worker_records_dir(self) -> Path:
        """The lifeline's records of live worker groups: one :func:`pid_record` each."""
        return self.runtime_dir / "workers"

    # -- checks and creation -----------------------------------------------------------------
    @property
    def socket_paths(self) -> tuple[Path, ...]:
        return (self.control_socket, self.worker_control_socket, self.worker_data_socket)

    def check_socket_paths(self) -> None:
        """Raise ``SocketPathTooLong`` if any socket path would not fit in ``sockaddr_un``."""
        limit = SUN_PATH_SIZE - 1
        for sock in self.socket_paths:
            size = len(os.fsencode(sock))
            if size > limit:
                raise SocketPathTooLong(
                    f"socket path {sock} is {size} bytes, over the {limit}-byte limit of Unix "
                    f"sockets; set VRAMTUI_RUNTIME_DIR to a shorter directory "
                    f"(e.g. /tmp/{APP}-{os.getuid()})"
                )

    def ensure(self) -> Paths:
        """Create every directory (0700) and check the runtime directory; return the paths to
        use — ``self``, or a copy with a private runtime directory of our own when the
        implicit ``/tmp`` one belongs to someone else (logged as a warning).

        Raises ``PathsError`` (or its subclasses) with a one-line message.  Nothing is created
        when the socket paths are too long.
        """
        self.check_socket_paths()
        for directory in (self.config_dir, self.backends_dir):
            _make_dir(directory)
        for directory in (self.state_dir, self.logs_dir, self.calibration_dir):
            _make_private_dir(directory, what="state directory", links_of_ours=True)
        paths = self
        try:
            _make_private_dir(self.runtime_dir, what="runtime directory")
        except NotOurs as exc:
            if not self.implicit_runtime:
                raise
            paths = replace(self, runtime_dir=_runtime_fallback(self))
            paths.check_socket_paths()
            import logging

            logging.getLogger("supervisor").warning(
                "%s; using %s instead (recorded in %s for clients)", exc,
                paths.runtime_dir, self.runtime_pointer)
        _make_private_dir(paths.sim_dir, what="runtime directory")
        return paths


# -- names inside a directory, and paths outside the three roots ------------------------------


def backends_dir_of(config_dir: Path | str) -> Path:
    """The ``backends.d`` of a config directory (:attr:`Paths.backends_dir`, for a caller
    that has the directory alone)."""
    return Path(config_dir) / BACKENDS_DIR


def parse_report_name(name: str) -> tuple[str, str] | None:
    """``("sdxl", "20260101-115500")`` for ``sdxl-20260101-115500.json`` (a name that
    :meth:`Paths.calibration_report` gives); None for any other name."""
    import re

    match = re.match(_REPORT_NAME, name)
    return None if match is None else (match.group("backend"), match.group("stamp"))


def pid_record(directory: Path, pid: int) -> Path:
    """The record of process ``pid`` in ``directory`` (``<pid>.json``): the lifeline's worker
    records and the simulated GPU's ledger (``worker_sdk.sim`` writes the same name; it
    cannot import this module)."""
    return directory / f"{pid}.json"


def service_unit_path(environ: Mapping[str, str] = os.environ) -> Path:
    """The systemd user unit ``vramtui install-service`` writes: in
    ``$XDG_CONFIG_HOME/systemd/user``, else ``~/.config/systemd/user``."""
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base) / "systemd" / "user" / SERVICE_UNIT


# -- directories -------------------------------------------------------------------------------


def _is_our_dir(path: Path) -> bool:
    """True when ``path`` is a real directory (not a link) of ours."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _make_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with the leaf 0700; leave an existing one alone."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise PathsError(f"{path} exists and is not a directory") from None
        return
    except OSError as exc:
        raise PathsError(f"cannot create directory {path}: {exc.strerror or exc}") from None
    os.chmod(path, PRIVATE_MODE)  # mkdir's mode is filtered by the umask


def _make_private_dir(path: Path, *, what: str, links_of_ours: bool = False) -> None:
    """Create ``path`` 0700, or check an existing one is a directory of ours and make it private.

    Never follows a link at ``path`` itself (``links_of_ours`` allows a link that we own, to a
    directory we own: a state directory moved to another disk).  Raises :class:`NotOurs`.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, PRIVATE_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise PathsError(f"cannot create {what} {path}: {exc.strerror or exc}") from None
    uid = os.geteuid()
    flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC
    try:
        fd = os.open(path, flags | _NOFOLLOW)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise PathsError(f"cannot open {what} {path}: {exc.strerror or exc}") from None
        fd = _open_own_link(path, flags, what=what, allowed=links_of_ours)
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise NotOurs(f"{what} {path} is not a directory")
        if st.st_uid != uid:
            raise NotOurs(
                f"{what} {path} belongs to {user_name(st.st_uid)}, not to you ({user_name(uid)})"
                f"; remove it, or set {_variable(what)} to a directory of your own"
            )
        if stat.S_IMODE(st.st_mode) & 0o077:
            try:
                os.fchmod(fd, PRIVATE_MODE)
            except OSError as exc:
                raise PathsError(f"{what} {path} is open to other users and cannot be made "
                                 f"private: {exc.strerror}") from None
    finally:
        os.close(fd)


def _open_own_link(path: Path, flags: int, *, what: str, allowed: bool) -> int:
    """``path`` is a link (or not a directory): open its target only if the link is ours."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise PathsError(f"cannot inspect {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISLNK(st.st_mode):
        raise NotOurs(f"{what} {path} is not a directory")
    if not allowed or st.st_uid != os.geteuid():
        raise NotOurs(
            f"{what} {path} is a symbolic link (to {os.readlink(path)}, owned by "
            f"{user_name(st.st_uid)}); refusing to follow it: remove it, or set "
            f"{_variable(what)} to a directory of your own"
        )
    try:
        return os.open(path, flags)
    except OSError as exc:
        raise PathsError(f"cannot open {what} {path}: {exc.strerror or exc}") from None


def _variable(what: str) -> str:
    return "VRAMTUI_RUNTIME_DIR" if what.startswith("runtime") else "VRAMTUI_STATE_DIR"


# -- files -------------------------------------------------------------------------------------


def open_private(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` for a file of ours in a private directory: never through a link, never
    inheritable, new files 0600.  Raises ``OSError`` (``ELOOP`` for a link)."""
    fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{path} is not a regular file of ours")
        if flags & os.O_CREAT and stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)  # the umask filtered os.open's mode
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_group(gid: int, uid: int) -> bool:
    """``gid`` is ``uid``'s own group (user private groups: Debian's, Ubuntu's and Fedora's
    default, with umask 002): the user's primary group, of the user's name, no other member.
    Group write there lets nobody else write."""
    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and \
        all(m == user.pw_name for m in group.gr_mem)


#: The most of a calibration report read (its raw samples included).
MAX_REPORT_BYTES = 256 * 1024 * 1024


def read_bounded(file: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of a file the user names (a FIFO or ``/dev/stdin`` too): at most ``limit``
    + 1, so the caller sees one too many. A size in the file's metadata is no bound (a
    device or a FIFO says 0 and may never end: ``/dev/zero``); what is read is."""
    with open(file, "rb") as handle:
        return handle.read(limit + 1)


class Untrusted(Exception):
    """A file of the user's that someone else could have written (the one-line reason)."""


def read_own(file: Path, stakes: str, limit: int) -> bytes:
    """The bytes of one of the user's own files that the engine acts on (a descriptor,
    ``config.yaml``): at most ``limit`` + 1, so the caller sees one too many.  As ssh does
    with its own files, it is read only when no one else can have written it: the file
    belongs to the engine's user or to root, and neither group nor others may write it; its
    directory likewise (and, through a link, its target's), unless it is sticky (as ``/tmp``
    is: others may add files there, but not replace ours, and theirs fail the first check).
    Group write is no one else's in the user's own private group (:func:`private_group`):
    ``mkdir`` and editors under umask 002 make such files.  The owner and mode checked are
    those of the descriptor read: no name is looked up between the check and the read.
    ``stakes`` says what whoever writes it gets ("runs commands as you"), for the one-line
    reason of :class:`Untrusted`; ``OSError`` is the caller's to word
    (``FileNotFoundError``, ``IsADirectoryError``).  A file that is not a regular one (a
    FIFO, a device) is refused unread."""
    me = os.geteuid()
    fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(file))
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted("it is not a regular file")
        for why in (_not_ours(st, "it", file, stakes, me),
                    *(_not_ours(path.stat(), what, path, stakes, me)
                      for path, what in _directories(file))):
            if why is not None:
                raise Untrusted(why)
        chunks, left = [], limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _directories(file: Path) -> tuple[tuple[Path, str], ...]:
    """The directories whose writers could replace ``file``: its own and, through a link,
    its target's."""
    own = file.parent
    real = Path(os.path.realpath(file)).parent
    return ((own, "its directory"),) + (((real, "its target's directory"),)
                                         if real != Path(os.path.realpath(own)) else ())


def _not_ours(st: os.stat_result, what: str, path: Path, stakes: str, me: int) -> str | None:
    """Why the file or directory of ``st`` is not one only ``me`` (or root) can write."""
    writable = stat.S_IMODE(st.st_mode) & 0o022
    if what != "it" and st.st_mode & stat.S_ISVTX:
        writable = 0
    if writable & 0o020 and private_group(st.st_gid, me):
        writable &= ~0o020  # (umask 002 with a group of one's own: nobody else in it)
    if st.st_uid not in (me, 0):
        return (f"{what} belongs to {user_name(st.st_uid)}: whoever writes it {stakes}; "
                "copy it to a file of yours, or chown it")
    if writable:
        return (f"{what} may be written by {'others' if writable & 0o002 else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): whoever writes it {stakes}; "
                f"chmod go-w {path}")
    return None


# -- the runtime directory's way out of a squatted /tmp ------------------------------------


def read_runtime_pointer(pointer: Path) -> Path | None:
    """The runtime directory recorded at ``pointer``, if the record and the directory are
    both ours and private (else None: a stale or planted record is ignored)."""
    try:
        fd = open_private(pointer, os.O_RDONLY)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)
    target = Path(text)
    base = default_runtime_dir()
    if not (target.is_absolute() and target.parent == base.parent
            and target.name.startswith(base.name + ".")):
        return None
    try:
        st = os.lstat(target)
    except OSError:
        return None
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid()
            or stat.S_IMODE(st.st_mode) & 0o077):
        return None
    return target


def _runtime_fallback(paths: Paths) -> Path:
    """A private runtime directory of our own next to the squatted default, recorded in the
    state directory so that clients find it; an existing valid record is reused."""
    pointer = paths.runtime_pointer
    existing = read_runtime_pointer(pointer)
    if existing is not None:
        return existing
    base = default_runtime_dir()
    import tempfile

    created = Path(tempfile.mkdtemp(prefix=base.name + ".", dir=base.parent))  # 0700, ours
    temp = pointer.with_name(f".{pointer.name}.{os.getpid()}.tmp")
    try:
        fd = open_private(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, f"{created}\n".encode())
        finally:
            os.close(fd)
        try:
            os.link(temp, pointer)  # never replaces a record another engine just made
        except FileExistsError:
            winner = read_runtime_pointer(pointer)
            if winner is not None:
                os.rmdir(created)
                return winner
            os.replace(temp, pointer)  # a stale record: ours replaces it
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.rmdir(created)
        raise PathsError(f"{base} belongs to another user and no private runtime directory "
                         f"could be recorded in {pointer}: {exc.strerror or exc}; set "
                         "VRAMTUI_RUNTIME_DIR to a directory of your own") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    return created
