"""`pip install -e .` with no extra gives a vramtui that starts (the README's first command):
every module of the TUI, the CLI, the engine and the worker SDK imports with the base
dependencies alone — pyproject's ``[project].dependencies`` and what they require — except
the faces that belong to an extra (the HTTP door, the browser dashboard, Dynamo's typed
requests), which say which extra to install when asked for.

A newcomer's walk found ``vramtui`` dying on ``No module named 'yarl'`` after a plain install:
the descriptor schema used it, and only the http extra brought it.  Here the packages that no
base dependency needs are made absent (``sys.modules[name] = None``, what Python sees when a
package is not installed) in a fresh interpreter, and every module is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Modules that are the faces of an extra: `.[http]` (HTTP door, browser dashboard) and
# `.[dynamo]` (Dynamo's typed requests).
EXTRA_ONLY = ("vramtui.web", "supervisor.http", "worker_sdk.dynamo.requests")

PROBE = r"""
import importlib, importlib.metadata as md, json, pkgutil, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as norm

def closure(names):
    seen, todo = set(), list(names)
    while todo:
        name = norm(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        todo += [r.name for r in map(Requirement, requires)
                 if r.marker is None or r.marker.evaluate({"extra": ""})]
    return seen

base = [r.name for r in map(Requirement, md.distribution("vramtui").requires or [])
        if r.marker is None or r.marker.evaluate({"extra": ""})]
allowed = closure(base) | {"vramtui"}
absent = sorted(m for m, dists in md.packages_distributions().items()
                if not {norm(d) for d in dists} & allowed and m not in sys.modules)
for name in absent:
    sys.modules[name] = None  # as if not installed
failed = {}
for package in ("vramtui", "supervisor", "worker_sdk"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.endswith(".__main__"):  # runs the command itself
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed[info.name] = str(exc)
print(json.dumps({"absent": absent, "failed": failed}))
"""


@pytest.mark.process
def test_every_module_but_the_extras_faces_imports_with_the_base_dependencies() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert "aiohttp" in seen["absent"]  # the probe does take the extras away
    wrong = {name: why for name, why in seen["failed"].items()
             if not name.startswith(EXTRA_ONLY)}
    assert not wrong, wrong


@pytest.mark.process
def test_web_without_the_http_extra_says_what_to_install() -> None:
    # `vramtui web` after a plain install died in a ModuleNotFoundError traceback: its module
    # imports aiohttp as it loads, before run_web could say which extra it needs.
    probe = ("import sys\nsys.modules['aiohttp'] = None\nfrom vramtui.cli import main\n"
             "sys.exit(main(['web']))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == ("vramtui web: the HTTP front door needs aiohttp and "
                                   "prometheus-client: pip install 'vramtui[http]'")
