"""vramd's interpolations and its ``tool:`` shortcut, as vramd 0.3.9 resolves them.

- ``${env:VAR}`` is the value of ``VAR`` (vramd refuses to start a worker whose command names
  an unset variable; so do we, as a descriptor error).
- ``${monorepo:TOOL}`` is TOOL's interpreter; ``${monorepo:python}`` and ``${monorepo}`` are
  the entry's own tool's (``runtime.monorepo_tool``, else ``tool``).
- A tool's interpreter is ``<root>/<Folder>/.venv/bin/python`` for the first root of
  ``$VRAMD_TOOLS_ROOT`` (``os.pathsep``-separated) and the first folder spelling that has one:
  the tool's name as written, Capitalized, CamelCased at digits (``text2icon`` → ``Text2Icon``),
  UPPER, and with ``_`` as ``-``. Without ``VRAMD_TOOLS_ROOT`` nothing is guessed.
- A backend with ``tool: T`` (or ``runtime.monorepo_tool: T``) and no ``runtime.command`` runs
  ``<T's python> -m T serve --ums-worker`` — the flag vramd 0.3.9 passes (its comments say
  ``--vramd-worker``; its code, and the tools written for it, use ``--ums-worker``).

Everything here is pure: the environment comes in as a mapping, the file system is only read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

TOOLS_ROOT_ENV = "VRAMD_TOOLS_ROOT"
TOOL_WORKER_ARGS = ("serve", "--ums-worker")

_REF_RE = re.compile(r"\$\{(env|monorepo)(?::([^}]*))?\}")
_OUR_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Unresolved(ValueError):
    """A reference that cannot be resolved; the message says what to do."""


def _camel_at_digits(tool: str) -> str:
    """``text2icon`` → ``Text2Icon``, ``skymap2d`` → ``Skymap2D``."""
    return "".join(part if part.isdigit() else part.capitalize()
                   for part in re.split(r"(\d+)", tool))


def tool_folder_names(tool: str) -> list[str]:
    """The folder spellings tried for ``tool``, in order, without repeats."""
    names: list[str] = []
    for name in (tool, tool.capitalize(), _camel_at_digits(tool), tool.upper(),
                 tool.replace("_", "-")):
        if name and name not in names:
            names.append(name)
    return names


def tools_roots(environ: Mapping[str, str]) -> list[Path]:
    raw = environ.get(TOOLS_ROOT_ENV, "").strip()
    home = environ.get("HOME") or os.path.expanduser("~")
    roots = []
    for part in raw.split(os.pathsep):
        part = part.strip()
        if part:
            if part == "~" or part.startswith("~/"):
                part = home + part[1:]
            roots.append(Path(part))
    return roots


def tool_python(tool: str, environ: Mapping[str, str]) -> str:
    """The interpreter of ``tool``'s venv (not resolved: a venv's python is a symlink)."""
    roots = tools_roots(environ)
    if not roots:
        raise Unresolved(f"tool {tool!r}: {TOOLS_ROOT_ENV} is not set, so its venv cannot be "
                         f"found; set {TOOLS_ROOT_ENV} to the folder holding "
                         f"<tool>/.venv, or give runtime.command")
    for root in roots:
        for name in tool_folder_names(tool):
            python = root / name / ".venv" / "bin" / "python"
            if python.is_file() and os.access(python, os.X_OK):
                return str(python)
    where = ", ".join(str(root) for root in roots)
    spellings = "/".join(tool_folder_names(tool))
    raise Unresolved(f"tool {tool!r}: no {{{spellings}}}/.venv/bin/python under "
                     f"{TOOLS_ROOT_ENV} ({where}); create that venv or give runtime.command")


def tool_command(tool: str, environ: Mapping[str, str]) -> list[str]:
    """What vramd runs for a backend that names only its tool."""
    return [tool_python(tool, environ), "-m", tool, *TOOL_WORKER_ARGS]


def escape_dollars(text: str) -> str:
    """A literal text in our spelling, where ``$`` starts a variable (``$$`` is a ``$``)."""
    return text.replace("$", "$$")


def interpolate(text: str, environ: Mapping[str, str], *, tool: str | None,
                keep_env: bool = False) -> tuple[str, str]:
    """``(ours, value)`` of one vramd string: ``value`` with every reference resolved, and
    ``ours`` the same in our spelling — the value with ``$`` doubled, or (``keep_env``) with
    ``${env:VAR}`` kept as our ``${VAR}`` so that it is read when our loader runs.

    vramd expands only a whole word (``${env:X}/bin`` stays literal there); here a reference
    anywhere in the text is expanded, which is what such a word can only have meant.
    Raises ``Unresolved``.
    """
    ours: list[str] = []
    value: list[str] = []
    pos = 0
    for match in _REF_RE.finditer(text):
        literal = text[pos:match.start()]
        ours.append(escape_dollars(literal))
        value.append(literal)
        pos = match.end()
        kind, arg = match.group(1), match.group(2)
        if kind == "env":
            if not arg:
                raise Unresolved(f"{match.group(0)} names no variable (write ${{env:NAME}})")
            if arg not in environ:
                raise Unresolved(f"{match.group(0)}: environment variable {arg} is not set; "
                                 f"set it (or write the value)")
            resolved = environ[arg]
            keep = keep_env and _OUR_VAR_RE.match(arg) is not None
            ours.append(f"${{{arg}}}" if keep else escape_dollars(resolved))
        else:
            target = tool if arg in (None, "", "python") else arg
            if not target:
                raise Unresolved(f"{match.group(0)} needs the backend's tool (tool: or "
                                 f"runtime.monorepo_tool)")
            try:
                resolved = tool_python(target, environ)
            except Unresolved as exc:
                raise Unresolved(f"{match.group(0)}: {exc}") from None
            ours.append(escape_dollars(resolved))
        value.append(resolved)
    ours.append(escape_dollars(text[pos:]))
    value.append(text[pos:])
    return "".join(ours), "".join(value)


def expand_home(path: str, environ: Mapping[str, str]) -> str:
    """A leading ``~`` or ``~user`` expanded, as vramd does (``~`` from ``HOME``)."""
    if path == "~" or path.startswith("~/"):
        return (environ.get("HOME") or os.path.expanduser("~")) + path[1:]
    if path.startswith("~"):
        return os.path.expanduser(path)
    return path


def is_our_worker(argv: list[str]) -> bool:
    """True when ``argv`` runs a worker that speaks our wire protocol (worker_sdk, verda-io)."""
    for i, word in enumerate(argv[:-1]):
        if word == "-m" and argv[i + 1].split(".")[0] in ("worker_sdk", "verda_io"):
            return argv[i + 1] in ("worker_sdk", "verda_io", "worker_sdk.__main__",
                                   "verda_io.__main__")
    return False
