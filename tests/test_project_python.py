"""The scripts started as ``scripts/NAME`` on a Python without the project's dependencies:
started again on the venv's, or one line that says how to make it (never a traceback)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"


def _base_lacks_dependencies() -> bool:
    """The interpreter the venv was made from, when it exists and lacks what the engine
    needs (a machine with them installed globally cannot show the switch)."""
    if not BASE_PYTHON.exists() or sys.prefix == sys.base_prefix:
        return False
    probe = subprocess.run([str(BASE_PYTHON), "-c", "import aiohttp, yarl, msgpack"],
                           capture_output=True)
    return probe.returncode != 0


pytestmark = pytest.mark.process
needs_bare_python = pytest.mark.skipif(not _base_lacks_dependencies(),
                                       reason="no Python without the dependencies here")


@needs_bare_python
@pytest.mark.parametrize("script", ["interactive-soak", "host-soak", "admission-soak"])
def test_a_script_started_on_a_bare_python_runs_on_the_venvs(script: str) -> None:
    done = subprocess.run([str(BASE_PYTHON), str(ROOT / "scripts" / script), "--help"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}") and "Traceback" not in done.stderr


@needs_bare_python
def test_without_a_venv_it_says_how_to_make_one_in_one_line(tmp_path: Path) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import project_python as p; "
            "from pathlib import Path; p.ROOT = Path(sys.argv[2]); p.use_project_python(); "
            "print('went on')")
    done = subprocess.run([str(BASE_PYTHON), "-c", code, str(ROOT / "scripts"),
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "lacks" in lines[0] and "python3 -m venv .venv" in lines[0]
    assert str(tmp_path) in lines[0]


def _copy_of_the_scripts(root: Path) -> Path:
    """``root``/scripts with project_python.py and a script that says each start."""
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "project_python.py", root / "scripts")
    script = root / "scripts" / "s"
    script.write_text("print('started', flush=True)\n"
                      "from project_python import use_project_python\n"
                      "use_project_python()\nprint('went on')\n")
    return script


@needs_bare_python
def test_a_venv_python_that_is_no_venvs_is_tried_once_not_for_ever(tmp_path: Path) -> None:
    """A ``.venv/bin/python`` whose prefix is elsewhere (a venv without its pyvenv.cfg, a
    link made by hand) lacks the dependencies too: it started the script again for ever."""
    script = _copy_of_the_scripts(tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(BASE_PYTHON.resolve())
    done = subprocess.run([str(BASE_PYTHON), str(script)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and done.stdout.splitlines() == ["started", "started"]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "is no venv's Python" in lines[0], done.stderr


@needs_bare_python
def test_a_venv_without_the_dependencies_says_to_install_them(tmp_path: Path) -> None:
    script = _copy_of_the_scripts(tmp_path)
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(tmp_path / ".venv")],
                   check=True, timeout=60)
    done = subprocess.run([str(BASE_PYTHON), str(script)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 2 and done.stdout.splitlines() == ["started", "started"]
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "install them" in lines[0] and "-m pip install" in lines[0]
