"""supervisor.paths: where files live, environment overrides, private directories."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from supervisor.paths import (
    REPORT_STAMP,
    SUN_PATH_SIZE,
    Paths,
    PathsError,
    SocketPathTooLong,
    backends_dir_of,
    parse_report_name,
    pid_record,
    service_unit_path,
)

ROOT = Path(__file__).resolve().parents[1]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_defaults_from_home_only(tmp_path: Path) -> None:
    paths = Paths.from_env({"HOME": str(tmp_path)})
    assert paths.config_dir == tmp_path / ".config" / "vramtui"
    assert paths.state_dir == tmp_path / ".local" / "state" / "vramtui"
    assert paths.runtime_dir == Path(f"/tmp/vramtui-{os.getuid()}")


def test_xdg_variables_are_honoured(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "XDG_STATE_HOME": str(tmp_path / "st"),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
    }
    paths = Paths.from_env(env)
    assert paths.config_dir == tmp_path / "cfg" / "vramtui"
    assert paths.state_dir == tmp_path / "st" / "vramtui"
    assert paths.runtime_dir == tmp_path / "run" / "vramtui"


def test_relative_xdg_values_are_ignored(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": "rel/cfg", "XDG_RUNTIME_DIR": "rel"}
    paths = Paths.from_env(env)
    assert paths.config_dir == tmp_path / ".config" / "vramtui"
    assert paths.runtime_dir == Path(f"/tmp/vramtui-{os.getuid()}")


def test_vramtui_overrides_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = {
        "HOME": str(tmp_path / "home"),
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "VRAMTUI_CONFIG_DIR": "~/myconf",
        "VRAMTUI_STATE_DIR": "relstate",
        "VRAMTUI_RUNTIME_DIR": str(tmp_path / "r"),
    }
    paths = Paths.from_env(env)
    assert paths.config_dir == tmp_path / "home" / "myconf"
    assert paths.state_dir == tmp_path / "relstate"  # made absolute
    assert paths.runtime_dir == tmp_path / "r"


def test_empty_override_counts_as_unset(tmp_path: Path) -> None:
    paths = Paths.from_env({"HOME": str(tmp_path), "VRAMTUI_CONFIG_DIR": ""})
    assert paths.config_dir == tmp_path / ".config" / "vramtui"


def test_derived_paths() -> None:
    p = Paths(Path("/c"), Path("/s"), Path("/r"))
    assert p.backends_dir == Path("/c/backends.d")
    assert p.logs_dir == Path("/s/logs")
    assert p.journal_path == Path("/s/journal.sqlite3")
    assert p.calibration_dir == Path("/s/calibration")
    assert p.control_socket == Path("/r/control.sock")
    assert p.worker_control_socket == Path("/r/workers.ctrl.sock")
    assert p.worker_data_socket == Path("/r/workers.data.sock")
    assert p.lock_path == Path("/r/engine.lock")
    assert p.sim_dir == Path("/r/simgpu")
    assert p.worker_log_path("sdxl") == Path("/s/logs/sdxl.log")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.config_dir = Path("/x")  # type: ignore[misc]


def test_derived_files() -> None:
    p = Paths(Path("/c"), Path("/s"), Path("/r"))
    assert p.calibration_overlay("sdxl") == Path("/c/backends.d/zz-calibrated-sdxl.yaml")
    assert p.calibration_report("sdxl", "20260101-115500") == Path(
        "/s/calibration/sdxl-20260101-115500.json")
    assert p.worker_records_dir == Path("/r/workers")
    assert pid_record(p.worker_records_dir, 41077) == Path("/r/workers/41077.json")
    assert pid_record(p.sim_dir, 7) == Path("/r/simgpu/7.json")
    assert backends_dir_of("/c") == p.backends_dir


def test_a_report_name_reads_back() -> None:
    import time

    stamp = time.strftime(REPORT_STAMP, time.gmtime(1_767_268_800.0))
    assert stamp == "20260101-120000"
    for backend in ("sdxl", "llm-8b-sim", "a-20250101-000000"):
        name = Paths(Path("/c"), Path("/s"), Path("/r")).calibration_report(backend, stamp).name
        assert parse_report_name(name) == (backend, stamp)
    for name in ("sdxl.json", "sdxl-2026-01-01.json", "sdxl-20260101-120000.yaml", "-x.json"):
        assert parse_report_name(name) is None


def test_the_service_unit_follows_xdg_config_home(tmp_path: Path) -> None:
    unit = Path("systemd/user/vramtui.service")
    assert service_unit_path({"HOME": str(tmp_path)}) == tmp_path / ".config" / unit
    assert service_unit_path({"HOME": str(tmp_path), "XDG_CONFIG_HOME": "/x"}) == Path("/x") / unit


# Files being rewritten elsewhere: each still joins a name to a Paths directory by hand, and
# switches to the Paths method named here.  Remove a line when its file has switched.
PENDING: dict[str, str] = {}


def test_no_module_builds_a_vramtui_path_by_hand() -> None:
    import re

    joined = re.compile(r"\b(config_dir|state_dir|runtime_dir|logs_dir|calibration_dir|"
                        r"backends_dir|sim_dir|worker_records_dir)\)? */ ")
    found = set()
    for package in ("supervisor", "vramtui"):
        for source in sorted((ROOT / package).rglob("*.py")):
            name = source.relative_to(ROOT).as_posix()
            if name != "supervisor/paths.py" and joined.search(source.read_text()):
                found.add(name)
    assert found <= set(PENDING), sorted(found - set(PENDING))


def make_paths(tmp_path: Path) -> Paths:
    return Paths.from_env(
        {
            "HOME": str(tmp_path),
            "VRAMTUI_CONFIG_DIR": str(tmp_path / "a" / "config"),
            "VRAMTUI_STATE_DIR": str(tmp_path / "b" / "state"),
            "VRAMTUI_RUNTIME_DIR": str(tmp_path / "run"),
        }
    )


def test_ensure_creates_private_directories(tmp_path: Path) -> None:
    old = os.umask(0)  # mkdir's mode alone would then give 0777-ish; ensure() must not
    try:
        paths = make_paths(tmp_path).ensure()
    finally:
        os.umask(old)
    for directory in (
        paths.config_dir,
        paths.backends_dir,
        paths.state_dir,
        paths.logs_dir,
        paths.calibration_dir,
        paths.runtime_dir,
        paths.sim_dir,
    ):
        assert directory.is_dir()
        assert mode(directory) == 0o700, directory
    assert paths.ensure() == paths  # idempotent


def test_ensure_tightens_a_loose_runtime_dir(tmp_path: Path) -> None:
    paths = make_paths(tmp_path)
    paths.runtime_dir.mkdir()
    os.chmod(paths.runtime_dir, 0o777)
    paths.ensure()
    assert mode(paths.runtime_dir) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_ensure_refuses_a_runtime_dir_of_another_user(tmp_path: Path) -> None:
    paths = make_paths(tmp_path)
    paths.runtime_dir.mkdir(mode=0o700)
    os.chown(paths.runtime_dir, 54321, 54321)
    with pytest.raises(PathsError, match="belongs to uid 54321.*VRAMTUI_RUNTIME_DIR"):
        paths.ensure()
    assert stat.S_IMODE(os.stat(paths.runtime_dir).st_mode) == 0o700  # left alone


def test_ensure_refuses_a_runtime_path_that_is_a_file(tmp_path: Path) -> None:
    paths = make_paths(tmp_path)
    paths.runtime_dir.write_text("")
    with pytest.raises(PathsError, match="not a directory"):
        paths.ensure()


def test_socket_path_too_long(tmp_path: Path) -> None:
    long_dir = tmp_path / ("x" * 120)
    paths = Paths(tmp_path / "c", tmp_path / "s", long_dir)
    with pytest.raises(SocketPathTooLong) as info:
        paths.ensure()
    message = str(info.value)
    assert "VRAMTUI_RUNTIME_DIR" in message and str(long_dir) in message
    assert "\n" not in message
    assert not long_dir.exists() and not (tmp_path / "c").exists()  # nothing created


def test_socket_path_limit_is_exact(tmp_path: Path) -> None:
    limit = SUN_PATH_SIZE - 1
    longest = "workers.data.sock"
    base = str(tmp_path) + "/"
    fill = limit - len(base) - 1 - len(longest)  # one "/" between runtime dir and socket name
    assert fill > 0
    fits = Paths(tmp_path, tmp_path, Path(base + "y" * fill))
    fits.check_socket_paths()
    assert len(os.fsencode(fits.worker_data_socket)) == limit
    too_long = Paths(tmp_path, tmp_path, Path(base + "y" * (fill + 1)))
    with pytest.raises(SocketPathTooLong):
        too_long.check_socket_paths()
