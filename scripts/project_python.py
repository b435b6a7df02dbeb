"""The scripts here run on the project's own Python: its venv's, which has vramtui's dependencies.

A script started as ``scripts/NAME`` runs on whatever ``python3`` is first on the PATH; one
that imports the engine needs its dependencies (aiohttp, yarl, msgpack, pyyaml). Called
first, :func:`use_project_python` starts the script again on the repository's ``.venv``
Python when this one lacks them (the README's install makes that venv), or says in one line
how to get it; it returns at once when they are all here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("aiohttp", "yarl", "msgpack", "yaml", "psutil")
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,dynamo]'"


def missing() -> list[str]:
    """The dependencies this Python cannot import."""
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def use_project_python() -> None:
    """Return when this Python has the dependencies; else run this script again on the
    venv's, or exit 2 with one line that says how to make it."""
    lacking = missing()
    if not lacking:
        return
    script = Path(sys.argv[0]).name
    venv_python = ROOT / ".venv" / "bin" / "python"
    if venv_python.exists() and Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        os.execv(str(venv_python), [str(venv_python), *sys.argv])
    print(f"{script}: this Python ({sys.executable}) lacks {', '.join(lacking)}; make the "
          f"project's venv first ({INSTALL}, in {ROOT}) and run it again",
          file=sys.stderr)
    raise SystemExit(2)
