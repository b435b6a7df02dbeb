"""What a server backend is started with: its macros filled in, its port picked.

``plan_launch`` gives the argv, environment, base URL and stop command of one start of a
server (``${PORT}`` a free port on this host, ``${GPU}`` the placed GPU, ``${MODEL}`` the
backend's name, ``${VRAM_MIB}``/``${VRAM_FRACTION}`` its admitted budget, ``${API_KEY}`` a
secret of this start, which every request the engine makes of it then carries).
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from yarl import URL

from ..backends.http import MACROS, fill
from ..backends.schema import BackendSpec

log = logging.getLogger("supervisor")
#: Where llama-server and vLLM take the key they ask every caller for (``server_key``).
KEY_FLAG = "--api-key"
KEY_VARIABLES = ("LLAMA_API_KEY", "VLLM_API_KEY")


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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
    port = free_port(URL(fill(http.url, {"PORT": "1"})).host or "127.0.0.1") \
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


def server_key(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key the server will ask every caller for, as llama-server and vLLM take it: its
    ``--api-key`` (the first of a comma-separated list), else ``LLAMA_API_KEY`` or
    ``VLLM_API_KEY`` in its environment. The engine's requests carry it: a llama-swap
    ``cmd`` with ``--api-key`` works unchanged (there the clients sent it; here the door has
    its own token, and a client's ``Authorization`` is never forwarded)."""
    for i, word in enumerate(argv):
        if word == KEY_FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(KEY_FLAG + "="):
            value = word.split("=", 1)[1]
        else:
            continue
        return value.split(",")[0].strip() or None
    for name in KEY_VARIABLES:
        if env.get(name):
            return env[name].split(",")[0].strip() or None
    return None
