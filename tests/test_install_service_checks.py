"""``vramtui install-service`` writes only a unit that can start: a non-loopback address
needs a token file that exists and only the user can read (the unit never carries
``VRAMTUI_HTTP_TOKEN``); its ``Documentation=`` names the README it was installed from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from serve_support import cli, echo_backend, make_env, new_root

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.process
def test_a_unit_that_could_not_start_is_refused_with_the_reason(tmp_path: Path) -> None:
    root = new_root()
    env = make_env(root, [echo_backend()])
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    env["VRAMTUI_HTTP_TOKEN"] = "x" * 40  # set here, but never written into the unit
    unit = tmp_path / "systemd" / "user" / "vramtui.service"
    token = tmp_path / "token"
    try:
        done = cli(env, "install-service", "--http", "0.0.0.0:8080")
        assert done.returncode == 2 and not unit.exists()
        assert done.stderr.startswith("vramtui install-service: the unit could not start: "
                                      "listening on http://0.0.0.0:8080 lets other machines in")
        assert "set a token first (--http-token-file or http.token_file)" in done.stderr
        done = cli(env, "install-service", "--http", "0.0.0.0:8080", "--http-token-file",
                   str(token))
        assert done.returncode == 2 and "cannot read the token file" in done.stderr
        token.write_text("y" * 40 + "\n")
        token.chmod(0o644)
        done = cli(env, "install-service", "--http", "0.0.0.0:8080", "--http-token-file",
                   str(token))
        assert done.returncode == 2 and "chmod 600" in done.stderr and not unit.exists()
        token.chmod(0o600)
        done = cli(env, "install-service", "--http", "0.0.0.0:8080", "--http-token-file",
                   str(token))
        assert done.returncode == 0, done.stderr
        text = unit.read_text()
        assert f"Documentation=file://{README}\n" in text
        assert "VRAMTUI_HTTP_TOKEN" not in text
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.process
@pytest.mark.parametrize(("gpus", "says"), [
    ("bogus", "bad --gpus value 'bogus'"),
    ("sim:0", "bad simulated GPU size 'sim:0'"),
    ("host,auto", "one host device at most, and last"),
    ("auto,host:lots", "bad host memory size"),
])
def test_a_gpus_value_serve_refuses_is_no_unit(tmp_path: Path, gpus: str, says: str) -> None:
    # `install-service --gpus bogus` wrote a unit whose --serve exits 2 at once: systemd
    # restarted it every five seconds, for ever
    root = new_root()
    env = make_env(root, [echo_backend()])
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    unit = tmp_path / "systemd" / "user" / "vramtui.service"
    try:
        done = cli(env, "install-service", "--gpus", gpus)
        assert done.returncode == 2 and not unit.exists(), done.stderr
        assert done.stderr.startswith("vramtui install-service: the unit could not start: ")
        assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1
        done = cli(env, "install-service", "--gpus", "sim:8GiB,host", "--print")
        assert done.returncode == 0 and "--gpus sim:8GiB,host" in done.stdout, done.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
