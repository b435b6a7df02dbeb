"""What a server backend is started with: its macros filled in, its port picked.

``plan_launch`` gives the argv, environment, base URL and stop command of one start of a
server (``${PORT}`` a port free at its url's host, IPv4 or IPv6; ``${GPU}`` the placed GPU,
``${MODEL}`` the backend's name, ``${VRAM_MIB}``/``${VRAM_FRACTION}`` its admitted budget,
``${API_KEY}`` a secret of this start, which every request the engine makes of it then
carries); :class:`~supervisor.errors.CannotStart` when it cannot be planned.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from yarl import URL

from ..backends.http import MACROS, fill, free_port
from ..backends.schema import BackendSpec
from ..errors import CannotStart

log = logging.getLogger("supervisor")
#: Where llama-server and vLLM take the key they ask every caller for (``server_key``).
KEY_FLAG = "--api-key"
KEY_VARIABLES = ("LLAMA_API_KEY", "VLLM_API_KEY")
#: The shells whose ``-c SCRIPT`` ``server_key`` reads (the server runs inside the script).
SHELLS = frozenset({"sh", "bash", "dash"})
_VARIABLE_RE = re.compile(r"\$(?:([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\})")


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...]
    env: dict[str, str]
    url: str  # its base URL, no trailing slash
    stop: tuple[str, ...] | None
    port: int | None  # the port the engine picked (None: the url names its own)
    api_key: str | None = None  # ${API_KEY}: sent as Authorization: Bearer on every request

    @property
    def auth_headers(self) -> dict[str, str]:
        """The headers every request of the engine to this server carries."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def macro_values(spec: BackendSpec, gpu: int, port: int | None, gpu_total_mib: int | None,
                 budget_mib: int | None, api_key: str | None = None) -> dict[str, str]:
    """The macros' values; a backend of unknown size runs alone: its budget is the GPU."""
    values = {"GPU": str(gpu), "MODEL": spec.name}
    if api_key is not None:
        values["API_KEY"] = api_key
    if port is not None:
        values["PORT"] = str(port)
    budget = budget_mib if budget_mib is not None else gpu_total_mib
    if budget is not None:
        values["VRAM_MIB"] = str(budget)
    values["VRAM_FRACTION"] = f"{min(1.0, budget / gpu_total_mib):.3f}" \
        if budget is not None and gpu_total_mib else "1.000"
    assert set(values) <= set(MACROS)
    return values


def plan_launch(spec: BackendSpec, gpu: int, env: Mapping[str, str],
                gpu_total_mib: int | None, budget_mib: int | None = None) -> Launch:
    """The start of ``spec``'s server on ``gpu`` (``env``: the base environment;
    ``budget_mib``: the peak it is admitted at, declared or measured)."""
    http = spec.http
    assert http is not None
    texts = (http.url, *spec.command, *spec.env.values(), *(http.stop or ()))
    wants_port = any("${PORT}" in text for text in texts)
    port = _port(spec.name, URL(fill(http.url, {"PORT": "1"})).host or "127.0.0.1") \
        if wants_port else None
    api_key = secrets.token_urlsafe(32) if any("${API_KEY}" in text for text in texts) \
        else None
    if api_key is not None and any("${API_KEY}" in word for word in spec.command):
        log.warning("%s: ${API_KEY} in its command line is readable by every local user (ps); "
                    "give it in env (LLAMA_API_KEY, VLLM_API_KEY) instead", spec.name)
    values = macro_values(spec, gpu, port, gpu_total_mib,
                          budget_mib if budget_mib is not None else spec.peak, api_key)
    full = dict(env)
    full.update({k: fill(v, values) for k, v in spec.env.items()})
    argv = tuple(fill(w, values) for w in spec.command)
    return Launch(argv=argv, env=full, url=fill(http.url, values),
                  stop=tuple(fill(w, values) for w in http.stop) if http.stop else None,
                  port=port, api_key=server_key(argv, full) or api_key)


def _port(backend: str, host: str) -> int:
    """``${PORT}``, free at ``host``; :class:`CannotStart` when none can be picked there (it
    could at load: its address went since, or its name no longer resolves)."""
    try:
        return free_port(host)
    except OSError as exc:
        raise CannotStart(f"no port for ${{PORT}} can be picked at {host} (http.url of "
                          f"{backend}): {exc.strerror or exc}; name an address of this "
                          "host, e.g. http://127.0.0.1:${PORT}") from None


def server_key(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key the server will ask every caller for, as llama-server and vLLM take it: its
    ``--api-key`` (the first of a comma-separated list), else ``LLAMA_API_KEY`` or
    ``VLLM_API_KEY`` in its environment. The engine's requests carry it: a llama-swap
    ``cmd`` with ``--api-key`` works unchanged (there the clients sent it; here the door has
    its own token, and a client's ``Authorization`` is never forwarded).

    A server started by a shell (``sh -c "exec llama-server … --api-key K"``, a multi-line
    ``cmd`` given to ``bash -c``) has its key in the script: its words are read too, with
    ``$NAME`` taken from ``env`` and ``export LLAMA_API_KEY=K`` as the environment; a script
    that does not split (an open quote), or a key that only running it would tell
    (``$(cat key)``), gives none."""
    script = _script_words(argv)
    scope = dict(env)
    for word in script:  # `export LLAMA_API_KEY=K`, `LLAMA_API_KEY=K exec llama-server`
        name, eq, value = word.partition("=")
        if eq and name in KEY_VARIABLES:
            scope[name] = _expanded(value, scope) or ""
    for words, shell in ((argv, False), (script, True)):
        for i, word in enumerate(words):
            if word == KEY_FLAG and i + 1 < len(words):
                value: str | None = words[i + 1]
            elif word.startswith(KEY_FLAG + "="):
                value = word.split("=", 1)[1]
            else:
                continue
            if shell:
                value = _expanded(value, scope)
            return _first_key(value)
    for name in KEY_VARIABLES:
        if scope.get(name):
            return _first_key(scope[name])
    return None


def _script_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The words of the script ``argv`` runs when it is ``sh -c SCRIPT`` (or ``bash -lc``,
    ``sh -e -c``, ``/bin/bash -c`` …), split as the shell would at its blanks, newlines and
    ``;``/``&&``/``|`` (no expansion; comment lines dropped); none for any other command or
    a script that does not split."""
    if not argv or os.path.basename(argv[0]) not in SHELLS:
        return ()
    i, runs_script = 1, False
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if word in ("-o", "+o", "-O", "+O"):  # an option that takes the next word
            i += 2
        elif word.startswith("--"):  # bash's own (--login, --norc)
            i += 1
        elif len(word) > 1 and word[0] in "-+":
            runs_script = runs_script or (word[0] == "-" and "c" in word[1:])
            i += 1
        else:
            break
    if not runs_script or i >= len(argv):
        return ()
    # A comment line goes; shlex's `#` would also end a word at it (`--api-key ab#c`).
    lines = (line for line in argv[i].split("\n") if not line.lstrip().startswith("#"))
    lexer = shlex.shlex("\n".join(lines), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        return tuple(lexer)
    except ValueError:  # "No closing quotation", "No escaped character": the shell says so
        return ()


def _expanded(word: str | None, env: Mapping[str, str]) -> str | None:
    """``word`` of a script with its ``$NAME``/``${NAME}`` taken from ``env``; None when it
    holds another expansion (``$(…)``, ``${X:-y}``), which only the shell can tell."""
    if word is None or "$" in _VARIABLE_RE.sub("", word):
        return None
    return _VARIABLE_RE.sub(lambda m: env.get(m.group(1) or m.group(2), ""), word)


def _first_key(value: str | None) -> str | None:
    """The first of a comma-separated list of keys (llama-server takes several)."""
    return (value or "").split(",")[0].strip() or None
