"""The scripts here run on the project's own Python: its venv's, which has vramtui's dependencies.

A script started as ``scripts/NAME`` runs on whatever ``python3`` is first on the PATH; one
that imports the engine needs its dependencies (aiohttp, yarl, msgpack, pyyaml). Called
first, :func:`use_project_python` starts the script again on the repository's ``.venv``
Python when this one lacks them (the README's install makes that venv), or says in one line
how to get it; it returns at once when they are all here. It starts the script again once at
most (:data:`AGAIN`): a ``.venv/bin/python`` that is no venv's (its ``sys.prefix`` elsewhere)
would otherwise start it again for ever.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NEEDED = ("aiohttp", "yarl", "msgpack", "yaml", "psutil")
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev,dynamo]'"
AGAIN = "VRAMTUI_SCRIPT_RESTARTED"  # set for the script started again (taken off at once)


def missing() -> list[str]:
    """The dependencies this Python cannot import."""
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def use_project_python() -> None:
    """Return when this Python has the dependencies; else run this script again on the
    venv's (once), or exit 2 with one line that says how to make it or what it lacks."""
    again = os.environ.pop(AGAIN, None) is not None  # (not for the script's own children)
    lacking = missing()
    if not lacking:
        return
    script = Path(sys.argv[0]).name
    venv = ROOT / ".venv"
    venv_python = venv / "bin" / "python"
    on_venv = Path(sys.prefix).resolve() == venv.resolve()
    if venv_python.exists() and not on_venv and not again:
        os.execve(str(venv_python), [str(venv_python), *sys.argv], {**os.environ, AGAIN: "1"})
    if on_venv:
        fix = f"install them ({venv_python} -m pip install -q -e '.[dev,dynamo]', in {ROOT})"
    elif again:  # started again on it, and still not on a venv
        fix = (f"{venv_python} is no venv's Python (its prefix is {sys.prefix}): make the "
               f"venv again (rm -rf .venv && {INSTALL}, in {ROOT})")
    else:
        fix = f"make the project's venv first ({INSTALL}, in {ROOT})"
    print(f"{script}: this Python ({sys.executable}) lacks {', '.join(lacking)}; {fix} and run "
          "it again", file=sys.stderr)
    raise SystemExit(2)
