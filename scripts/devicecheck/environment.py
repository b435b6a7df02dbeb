"""The Python environment the check runs in: a fresh venv of the project, or one given.

A GPU machine may have no network at all, so a fresh venv installs from, in this order:

1. ``--wheels DIR`` (else ``.whl/`` in the repository, if present): ``pip install --no-index
   --find-links DIR -e .`` — nothing is downloaded.  ``prepare_wheels`` fills such a folder
   where pip can reach the registry (``scripts/device-check --prepare-wheels .whl``): every
   base dependency of ``pyproject.toml`` plus setuptools, for the target's Python and CPU;
2. the package index (``pip install -e .``), with short time-outs so a machine without a
   network fails in seconds, not minutes.

``--venv PATH`` or ``--python PATH`` skip all that and use an existing interpreter where the
project is importable.  Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

IMPORT_CHECK = ("import vramtui, supervisor, worker_sdk, textual, pynvml, psutil, yaml, msgpack;"
                "import sys; print(sys.version.split()[0])")
DEVICE_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64")
BUILD_REQUIREMENTS = ("setuptools>=68",)


class EnvironmentError_(Exception):
    """The environment could not be made; the message says why and what to do."""


@dataclass(frozen=True)
class PythonEnv:
    python: str
    how: str  # "fresh venv from wheels in DIR", "fresh venv from the index", "given"
    version: str
    seconds: float
    fresh: bool


def _tail(text: str, lines: int = 4) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "no output"


def _run(argv: list[str], log: Path, timeout: float, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(argv)}\n")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentError_(f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''} "
                                f"took more than {timeout:g} s") from exc
    except OSError as exc:
        raise EnvironmentError_(f"cannot run {argv[0]}: {exc}") from exc
    with open(log, "a") as f:
        f.write(done.stdout + done.stderr)
    return done


def clean_env() -> dict[str, str]:
    """The environment for the project's own venv: nothing on PYTHONPATH but what we add."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}


def check_imports(python: str, log: Path, env: dict[str, str]) -> str:
    done = _run([python, "-c", IMPORT_CHECK], log, 60, env)
    if done.returncode != 0:
        raise EnvironmentError_(f"{python} cannot import the project: {_tail(done.stderr, 2)}")
    return done.stdout.strip().splitlines()[-1]


def given(python: str, log: Path) -> PythonEnv:
    """An existing interpreter (``--python``, or ``--venv``'s bin/python), checked."""
    t0 = time.monotonic()
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise EnvironmentError_(f"{python} is not an executable Python")
    version = check_imports(python, log, dict(os.environ))
    return PythonEnv(python, f"given: {python}", version, time.monotonic() - t0, fresh=False)


def fresh(repo: Path, venv: Path, log: Path, *, wheels: Path | None,
          base_python: str = sys.executable, timeout: float = 240.0) -> PythonEnv:
    """``python3 -m venv`` + ``pip install -e repo`` (from ``wheels`` when given)."""
    t0 = time.monotonic()
    env = clean_env()
    done = _run([base_python, "-m", "venv", str(venv)], log, 90, env)
    python = str(venv / "bin" / "python")
    if done.returncode != 0:
        raise EnvironmentError_(f"python3 -m venv failed: {_tail(done.stderr, 2)} (is the "
                                "python3-venv package installed? or pass --venv/--python)")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if wheels is not None:
        pip += ["--no-index", "--find-links", str(wheels)]
        how = f"fresh venv, offline from the wheels in {wheels}"
    else:
        pip += ["--timeout", "10", "--retries", "1"]
        how = "fresh venv, from the package index"
    done = _run(pip + ["-e", str(repo)], log, timeout - (time.monotonic() - t0), env)
    if done.returncode != 0:
        hint = ("the wheels do not cover pyproject.toml's dependencies: run "
                "`scripts/device-check --prepare-wheels DIR` again where pip can download"
                if wheels is not None else
                "no package index reachable? run `scripts/device-check --prepare-wheels .whl` "
                "where pip works and carry .whl, or pass --venv PATH")
        raise EnvironmentError_(f"pip install -e . failed: {_tail(done.stderr)}; {hint}")
    version = check_imports(python, log, env)
    return PythonEnv(python, how, version, time.monotonic() - t0, fresh=True)


def base_requirements(repo: Path) -> list[str]:
    with open(repo / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return [str(r) for r in project.get("dependencies", [])]


def prepare_wheels(repo: Path, target: Path, *, python_version: str = "3.12",
                   platforms: tuple[str, ...] = DEVICE_PLATFORMS,
                   python: str = sys.executable) -> tuple[int, list[str]]:
    """Download (no install) every base dependency and the build backend as wheels for the
    target (CPython ``python_version`` on x86-64 Linux) into ``target``.  Returns pip's exit
    code and the command."""
    target.mkdir(parents=True, exist_ok=True)
    argv = [python, "-m", "pip", "download", "--disable-pip-version-check", "-q",
            "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
            "-d", str(target)]
    for platform in platforms:
        argv += ["--platform", platform]
    argv += [*base_requirements(repo), *BUILD_REQUIREMENTS]
    return subprocess.call(argv), argv
