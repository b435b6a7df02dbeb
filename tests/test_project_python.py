"""The scripts started as ``scripts/NAME`` on a Python without the project's dependencies:
started again on the venv's, or one line that says how to make it (never a traceback)."""

from __future__ import annotations

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
