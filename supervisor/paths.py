"""Where vramtui keeps its files: the one module that owns every path.

Three roots, each overridable by an environment variable:

- config:  ``$VRAMTUI_CONFIG_DIR``, else ``$XDG_CONFIG_HOME/vramtui``, else ``~/.config/vramtui``
- state:   ``$VRAMTUI_STATE_DIR``, else ``$XDG_STATE_HOME/vramtui``, else ``~/.local/state/vramtui``
- runtime: ``$VRAMTUI_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/vramtui``, else ``/tmp/vramtui-$UID``

Everything else (sockets, lock, journal, logs, calibration reports) is derived from them.
``Paths.ensure()`` creates the directories private (0700), refuses a runtime directory that
belongs to someone else, and checks that the socket paths fit in ``sockaddr_un``.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

APP = "vramtui"
PRIVATE_MODE = 0o700

# sun_path holds this many bytes including the terminating NUL (Linux 108, BSD/macOS 104).
SUN_PATH_SIZE = 104 if sys.platform == "darwin" or "bsd" in sys.platform else 108


class PathsError(RuntimeError):
    """A vramtui directory cannot be used; the message names it and says what to do."""


class SocketPathTooLong(PathsError):
    """A Unix socket path would not fit in ``sockaddr_un``."""


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


@dataclass(frozen=True)
class Paths:
    """The three roots; every other path is a property derived from them."""

    config_dir: Path
    state_dir: Path
    runtime_dir: Path

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
        if runtime is None:
            xdg_runtime = _xdg(environ, "XDG_RUNTIME_DIR")
            runtime = xdg_runtime / APP if xdg_runtime else Path(f"/tmp/{APP}-{os.getuid()}")
        return cls(config_dir=config, state_dir=state, runtime_dir=runtime)

    # -- config ------------------------------------------------------------------------------
    @property
    def backends_dir(self) -> Path:
        return self.config_dir / "backends.d"

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

    def worker_log_path(self, backend: str) -> Path:
        """The stderr log of one backend's worker."""
        return self.logs_dir / f"{backend}.log"

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
        return self.runtime_dir / "simgpu"

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
        """Create every directory (0700) and check the runtime directory; return ``self``.

        Raises ``PathsError`` (or its subclass ``SocketPathTooLong``) with a one-line message.
        Nothing is created when the socket paths are too long.
        """
        self.check_socket_paths()
        for directory in (
            self.config_dir,
            self.backends_dir,
            self.state_dir,
            self.logs_dir,
            self.calibration_dir,
        ):
            _make_private_dir(directory)
        _secure_runtime_dir(self.runtime_dir)
        _make_private_dir(self.sim_dir)
        return self


def _make_private_dir(path: Path) -> None:
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


def _secure_runtime_dir(path: Path) -> None:
    """Create the runtime directory, or make sure an existing one is ours and private."""
    _make_private_dir(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise PathsError(f"cannot inspect runtime directory {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise PathsError(f"runtime directory {path} is not a directory")
    uid = os.geteuid()
    if st.st_uid != uid:
        raise PathsError(
            f"runtime directory {path} belongs to uid {st.st_uid}, not to you (uid {uid}); "
            f"remove it or set VRAMTUI_RUNTIME_DIR to a directory of your own"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(path, PRIVATE_MODE)
        except OSError as exc:
            raise PathsError(
                f"runtime directory {path} is open to other users and cannot be made "
                f"private: {exc.strerror}"
            ) from None
