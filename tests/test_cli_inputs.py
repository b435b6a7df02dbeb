"""Files and arguments a user hands the CLI that are not what they seem: each gets one line
and an exit code, never a traceback, a hang or a file read without end.

A llama-swap file reached through a link in another folder or on ``/dev/stdin`` converts as
the file itself does; ``/dev/zero`` named as a file (a device: its size says 0, its reading
never ends) is read only up to the limit of what it stands for; JSON nested past what can be
parsed is refused as such.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from serve_support import cli, make_env

pytestmark = pytest.mark.process

LLAMA_SWAP = "models:\n  m1:\n    cmd: /bin/true --port ${PORT} --model ./weights.gguf\n"


def one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1, (done.returncode, done.stderr)
    assert lines[0].startswith("vramtui: error: "), lines
    return lines[0]


def test_a_linked_or_piped_llama_swap_file_converts_as_the_file_itself(tmp_path: Path) -> None:
    env = make_env(tmp_path)
    real = tmp_path / "conf" / "config.yaml"
    real.parent.mkdir()
    real.write_text(LLAMA_SWAP)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "config.yaml").symlink_to(real)
    direct = cli(env, "import-llama-swap", str(real), "-o", str(tmp_path / "a"))
    linked = cli(env, "import-llama-swap", str(tmp_path / "links" / "config.yaml"),
                 "-o", str(tmp_path / "b"))
    with open(real, "rb") as given:  # `import-llama-swap /dev/stdin < config.yaml`
        piped = subprocess.run([*cli_argv(), "import-llama-swap", "/dev/stdin", "-o",
                                str(tmp_path / "c")], env=env, stdin=given, capture_output=True,
                               text=True, timeout=60)
    for done in (direct, linked, piped):
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    # it runs where llama-swap would run it: in the working directory (./weights.gguf is
    # read from there), however the file was named (for /dev/stdin, the folder was /dev)
    cwd = {d: yaml.safe_load((tmp_path / d / "m1.yaml").read_text())["cwd"] for d in "abc"}
    assert cwd == dict.fromkeys("abc", os.getcwd())


@pytest.mark.parametrize(("command", "said"), [
    ("import-llama-swap", "more than a descriptor file may be"),
    ("import-vramd", "not a regular file"),
    ("recalibrate", "more than a calibration report is")])
def test_a_file_that_never_ends_is_read_to_its_limit(tmp_path: Path, command: str,
                                                     said: str) -> None:
    out = ("-o", str(tmp_path / "out")) if command.startswith("import") else ()
    done = cli(make_env(tmp_path), command, "/dev/zero", *out, timeout=60)
    assert said in one_line(done, 2)
    assert not (tmp_path / "out").exists()


def test_a_request_file_that_never_ends_is_read_to_the_request_limit(tmp_path: Path) -> None:
    env = {**make_env(tmp_path), "VRAMTUI_MAX_REQUEST": "1MiB"}
    done = cli(env, "submit", "echo", "--data-file", "/dev/zero", timeout=30)
    assert "over 1 MiB" in one_line(done, 2) and "VRAMTUI_MAX_REQUEST" in done.stderr
    with open("/dev/zero", "rb") as zero:
        piped = subprocess.run([*cli_argv(), "submit", "echo", "-"], env=env,
                               stdin=zero, capture_output=True, text=True, timeout=30)
    assert "over 1 MiB" in one_line(piped, 2)


def cli_argv() -> list[str]:
    from serve_support import PYTHON

    return [PYTHON, "-m", "vramtui"]


@pytest.mark.parametrize("flag", ["--data", "--metadata"])
def test_json_nested_past_reading_is_refused_as_such(tmp_path: Path, flag: str) -> None:
    deep = "[" * 5000 + "]" * 5000 if flag == "--data" else '{"a": ' + "[" * 5000 + "]" * 5000 + "}"
    done = cli(make_env(tmp_path), "submit", "echo", flag, deep)
    assert "nests too deep" in one_line(done, 2)



def test_an_empty_backends_path_is_refused_not_read_as_the_current_folder(
        tmp_path: Path) -> None:
    done = cli(make_env(tmp_path), "--serve", "--gpus", "sim:8GiB", "--backends", "")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "vramtui: error: argument --backends: an empty path: name a descriptor file or folder")
    assert not (tmp_path / "run").exists()  # no engine started
