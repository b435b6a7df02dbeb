"""Reading llama-swap's ``config.yaml`` as our own descriptors, as llama-swap reads it.

A llama-swap file is a mapping with ``models:`` (a mapping by model ID) and neither ``name:``
nor ``backends:``.  Each model becomes one backend that runs as a model server (``http:``):

- macros: the top-level ``macros`` and a model's own (which override them), plus
  ``${MODEL_ID}``, expanded in every value of the model, the last declared first (so one may
  use an earlier one), a value that is a whole ``${m}`` keeping its type; ``${PORT}`` stays
  ours (the engine picks a free port, so ``startPort`` has no use); ``${env.X}`` becomes our
  ``${X}`` in ``cmd`` and ``env`` (read when vramtui loads the file) and is read now elsewhere;
- ``cmd`` split as llama-swap splits it: comment lines dropped, a line ending in ``\\``
  joined to the next, then split as a POSIX shell would; a ``$`` that is no macro is written
  ``$$`` (llama-swap starts no shell, so it is literal there too);
- ``proxy`` → ``http.url`` (left out when it is the default ``http://localhost:${PORT}``),
  ``checkEndpoint`` → ``http.health`` (``none`` kept), ``useModelName`` →
  ``http.model_name``, ``cmdStop`` → ``http.stop``, ``healthCheckTimeout`` (the model's, else
  the top-level one) → ``http.ready_timeout``; ``ttl`` (else ``globalTTL``; 0 or none: never)
  → ``keep_alive``, ``unloadTimeout`` → ``timeouts.stop_grace``, ``concurrencyLimit`` (else
  llama-server's ``-np``/``--parallel`` in ``cmd``) → ``concurrency``; ``env`` (``K=V``
  items) → ``env``, but ``CUDA_VISIBLE_DEVICES=N`` → ``gpus: [N]`` (the engine places a
  server and sets that variable itself); ``aliases``, ``unlisted``; ``name``/``description``
  → ``description``;
- ``hooks.on_startup.preload`` → ``preload: true``; ``groups`` are read and explained:
  vramtui decides which models share a GPU from their measured memory, so ``swap`` and
  ``exclusive`` have nothing left to say, and ``persistent: true`` makes its members pinned.

A model ID that is not a backend name (``org/model:7b``) gets a name made of it, the ID kept
as an alias.  What cannot be mapped comes back as one ``DescriptorWarning`` each, never
silently; a model that cannot be read at all is one ``DescriptorError`` and the others load.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import brief
from .errors import DescriptorError, DescriptorWarning
from .schema import ALIAS_RE
from .yamlio import LinedDict, LinedList

DEFAULT_PROXY = "http://localhost:${PORT}"
_DEFAULT_PROXIES = frozenset({DEFAULT_PROXY, "http://127.0.0.1:${PORT}"})
RESERVED = frozenset({"PORT", "MODEL_ID", "PID"})
API = ("chat", "completions", "embeddings")
_MACRO_NAME = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
_MACRO_USE = re.compile(r"\$\{([A-Za-z0-9_-]+)\}")
_ENV_USE = re.compile(r"\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}")
# One piece of a word in our spelling: an env macro, a macro we keep, or any other ``$``.
_DOLLAR = re.compile(r"\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}|\$\{(PORT)\}|\$")
_PARALLEL = frozenset({"-np", "--parallel"})
MIN_HEALTH_TIMEOUT_S = 15  # llama-swap raises a smaller healthCheckTimeout to this
MAX_EXPANDED = 64 * 1024  # characters of one value once its macros are in (a command line)

# What each model key becomes (the ones read below), and what each unmapped key means.
MODEL_KEYS = frozenset({"cmd", "cmdStop", "proxy", "aliases", "env", "checkEndpoint", "ttl",
                        "unloadTimeout", "unlisted", "useModelName", "name", "description",
                        "concurrencyLimit", "macros", "healthCheckTimeout"})
MODEL_UNMAPPED = {
    "filters": "vramtui forwards the request unchanged (no stripParams/setParams)",
    "sendLoadingState": "vramtui sends no loading text; a streaming client waiting for a "
                        "model gets SSE comment lines with its queue position",
    "timeouts": "vramtui bounds a request with 'timeouts.request' (set it in the "
                "descriptor)",
    "capabilities": "vramtui lists what a model speaks in 'api:' (chat, completions, "
                    "embeddings here)",
    "compat": "vramtui forwards requests unchanged",
    "metadata": "vramtui's /v1/models shows a model's description and aliases, not metadata",
}
TOP_KEYS = frozenset({"models", "macros", "startPort", "healthCheckTimeout", "globalTTL",
                      "unloadTimeout", "groups", "hooks"})
TOP_UNMAPPED = {
    "apiKeys": "vramtui's HTTP door takes one bearer token instead (--http-token-file)",
    "includeAliasesInList": "vramtui's /v1/models lists each model once, with its aliases",
    "sendLoadingState": "vramtui sends no loading text; waiting streams get their queue "
                        "position as SSE comments",
    "logLevel": "vramtui's log is its own (--log-file)",
    "logRequests": "every request is a job: `vramtui jobs` lists them",
    "logTimeFormat": "vramtui's log format is its own",
    "logToStdout": "each model's output is its backend's log (`vramtui logs NAME`)",
    "metricsMaxInMemory": "vramtui's /metrics has its own series",
    "captureBuffer": "vramtui keeps no request captures",
    "matrix": "vramtui decides which models share a GPU from their measured memory",
    "router": "vramtui decides which models share a GPU from their measured memory",
    "routing": "vramtui decides which models share a GPU from their measured memory",
    "scheduler": "vramtui queues by priority ('priority:' in a descriptor)",
    "peers": "vramtui serves only the models it runs",
    "profiles": "vramtui has no profiles: each model is a backend",
    "selectors": "vramtui has no selectors: each model is a backend",
    "performance": "vramtui has its own settings",
    "upstream": "vramtui has its own settings",
    "ui": "vramtui's dashboard is `vramtui web`",
    "store": "vramtui keeps its jobs in its own journal",
}


def is_llama_swap(document: Any) -> bool:
    """Whether a YAML document is a llama-swap ``config.yaml`` (``models:`` by ID)."""
    return (isinstance(document, Mapping) and isinstance(document.get("models"), Mapping)
            and not {"name", "backends", "version"} & set(document))


class _Out:
    """The entries, warnings and errors of one file, in the order met."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.items: list[tuple[LinedDict, int | None] | DescriptorError] = []

    def warn(self, line: int | None, field: str | None, backend: str | None,
             message: str) -> None:
        self.items.append(DescriptorWarning(self.file, line, field, backend, message))

    def error(self, line: int | None, field: str | None, backend: str | None,
              message: str) -> None:
        self.items.append(DescriptorError(self.file, line, field, backend, message))


class _Bad(ValueError):
    """A model that cannot be read: (the llama-swap key, the message)."""

    def __init__(self, key: str | None, message: str) -> None:
        super().__init__(key, message)
        self.key = key
        self.message = message


class _Said(Exception):
    """A model left out whose error has been told already."""


def _line(node: Any, key: Any, fallback: int | None = None) -> int | None:
    return node.key_line(key) if isinstance(node, LinedDict) else fallback


def from_llama_swap(document: Mapping[Any, Any], file: Path,
                    environ: Mapping[str, str]) -> Iterator[
                        tuple[LinedDict, int | None] | DescriptorError]:
    """Each model of a llama-swap document as one of our entries (with its line), and a
    ``DescriptorWarning`` for each thing that is not mapped, or an error for what is bad."""
    out = _Out(file)
    _Translator(document, out, environ).run()
    yield from out.items


class _Translator:
    def __init__(self, doc: Mapping[Any, Any], out: _Out, environ: Mapping[str, str]) -> None:
        self.doc = doc
        self.out = out
        self.environ = environ
        self.names: dict[str, str] = {}  # model ID -> backend name
        self.pinned: set[str] = set()
        self.preload: set[str] = set()

    def run(self) -> None:
        doc, out = self.doc, self.out
        for key in doc:
            if key in TOP_KEYS:
                continue
            why = TOP_UNMAPPED.get(str(key), "not a key vramtui knows of llama-swap's")
            out.warn(_line(doc, key), str(key), None, f"llama-swap's {key!r} is not used: {why}")
        macros = self._macros(doc.get("macros"), _line(doc, "macros"), None)
        if macros is None:
            return
        if "startPort" in doc:
            out.warn(_line(doc, "startPort"), "startPort", None, "not needed: the engine "
                     "picks a free port for each ${PORT}")
        models = doc["models"]
        self.names = self._names(models)
        self._groups(doc.get("groups"), _line(doc, "groups"))
        self._hooks(doc.get("hooks"), _line(doc, "hooks"))
        for model_id, body in models.items():
            name = self.names.get(str(model_id))
            if name is None:
                continue
            line = _line(models, model_id)
            try:
                entry = self._model(str(model_id), name, body, line, macros)
            except _Said:
                continue
            except _Bad as bad:
                where = _line(body, bad.key, line) if bad.key else line
                out.error(where, bad.key, name, bad.message)
                continue
            out.items.append((entry, line))

    # -- the top level ---------------------------------------------------------------------
    def _macros(self, value: Any, line: int | None,
                backend: str | None) -> list[tuple[str, Any]] | None:
        if value is None:
            return []
        if not isinstance(value, Mapping):
            self.out.error(line, "macros", backend, "'macros' must be a mapping of names "
                           "to values")
            return None
        macros: list[tuple[str, Any]] = []
        for name, macro in value.items():
            where = _line(value, name, line)
            text = str(name)
            problem = None
            if not _MACRO_NAME.match(text):
                problem = f"macro name {text!r}: letters, digits, _ and -, up to 63"
            elif text in RESERVED:
                problem = f"macro name {text!r} is reserved (llama-swap sets it)"
            elif isinstance(macro, Mapping | list):
                problem = f"macro {text!r} must be a single value, not {brief(macro)}"
            elif isinstance(macro, str) and f"${{{text}}}" in macro:
                problem = f"macro {text!r} refers to itself"
            if problem is not None:
                self.out.error(where, "macros", backend, problem)
                return None
            macros.append((text, macro))
        return macros

    def _names(self, models: Mapping[Any, Any]) -> dict[str, str]:
        names: dict[str, str] = {}
        taken: set[str] = set()
        for model_id in models:
            if model_id is None or isinstance(model_id, bool):  # (YAML's null:, yes:)
                self.out.error(_line(models, model_id), None, None, f"a model ID is "
                               f"{'null' if model_id is None else brief(model_id)}, not text: "
                               "quote it, or name the model")
                continue
            text = str(model_id)
            name = re.sub(r"[^A-Za-z0-9._-]+", "-", text).lstrip("._-")[:64] or "model"
            base, n = name, 2
            while name in taken:
                suffix = f"-{n}"
                name, n = base[:64 - len(suffix)] + suffix, n + 1
            taken.add(name)
            names[text] = name
            if name != text:
                self.out.warn(_line(models, model_id), None, name, f"model {text!r} is "
                              f"backend {name!r} here (a backend name is letters, digits, "
                              ". _ -); its ID stays an alias")
        return names

    def _members(self, value: Any, line: int | None, what: str) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.out.warn(line, what, None, f"{brief(value)} is not a list of model IDs; "
                          "ignored")
            return []
        aliases = {str(a): str(model_id) for model_id, body in self.doc["models"].items()
                   if isinstance(body, Mapping) and isinstance(body.get("aliases"), list)
                   for a in body["aliases"]}
        found = []
        for member in value:
            model_id = str(member) if str(member) in self.names else aliases.get(str(member))
            if model_id is not None:
                found.append(model_id)
            else:
                self.out.warn(line, what, None, f"{brief(member)} is not a model of this "
                              "file; ignored")
        return found

    def _groups(self, groups: Any, line: int | None) -> None:
        if groups is None:
            return
        if not isinstance(groups, Mapping):
            self.out.warn(line, "groups", None, "'groups' is not a mapping; ignored")
            return
        for group_id, group in groups.items():
            where = _line(groups, group_id, line)
            if not isinstance(group, Mapping):
                self.out.warn(where, f"groups.{group_id}", None, "not a mapping; ignored")
                continue
            members = self._members(group.get("members"), _line(group, "members", where),
                                    f"groups.{group_id}.members")
            flags = ", ".join(f"{k}: {str(group[k]).lower()}" for k in
                              ("swap", "exclusive", "persistent") if k in group)
            text = (f"group {group_id!r} ({', '.join(members) or 'no members'}"
                    f"{'; ' + flags if flags else ''}): vramtui decides which models share a "
                    "GPU from their measured memory: they run side by side when they fit and "
                    "take turns when they do not")
            if group.get("persistent") is True:
                self.pinned.update(members)
                text += "; persistent: its members are pinned (never evicted for another)"
            self.out.warn(where, f"groups.{group_id}", None, text)

    def _hooks(self, hooks: Any, line: int | None) -> None:
        if hooks is None:
            return
        if not isinstance(hooks, Mapping):
            self.out.warn(line, "hooks", None, "'hooks' is not a mapping; ignored")
            return
        startup = hooks.get("on_startup")
        for key in hooks:
            if key != "on_startup":
                self.out.warn(_line(hooks, key, line), f"hooks.{key}", None,
                              "not a hook vramtui runs; ignored")
        if not isinstance(startup, Mapping):
            return
        for key in startup:
            if key != "preload":
                self.out.warn(_line(startup, key, line), f"hooks.on_startup.{key}", None,
                              "not a hook vramtui runs; ignored")
        self.preload.update(self._members(startup.get("preload"),
                                          _line(startup, "preload", line),
                                          "hooks.on_startup.preload"))

    # -- one model --------------------------------------------------------------------------
    def _model(self, model_id: str, name: str, body: Any, line: int | None,
               global_macros: list[tuple[str, Any]]) -> LinedDict:
        if not isinstance(body, Mapping):
            raise _Bad(None, f"model {model_id!r} must be a mapping (cmd, proxy, …), not "
                       f"{brief(body)}")
        own = self._macros(body.get("macros"), _line(body, "macros", line), name)
        if own is None:
            raise _Said()  # (its one error line is out)
        macros = _merge([("MODEL_ID", model_id), *global_macros], own)
        values: dict[str, Any] = {}
        for key, value in body.items():
            key = str(key)
            if key == "macros":
                continue
            if key not in MODEL_KEYS:
                why = MODEL_UNMAPPED.get(key, "not a model key vramtui knows of llama-swap's")
                self.out.warn(_line(body, key, line), key, name,
                              f"llama-swap's {key!r} is not used: {why}")
                continue
            if key in ("cmd", "cmdStop") and isinstance(value, str):
                value = _strip_comments(value)
            values[key] = _substitute(value, macros, key)
        top = self.doc
        for key, top_key in (("healthCheckTimeout", "healthCheckTimeout"),
                             ("ttl", "globalTTL"), ("unloadTimeout", "unloadTimeout")):
            if key not in values and top_key in top:
                values[key] = top[top_key]
        return self._entry(model_id, name, body, line, values)

    def _entry(self, model_id: str, name: str, body: Any, line: int | None,
               values: dict[str, Any]) -> LinedDict:
        entry = LinedDict(line=line)

        def put(key: str, value: Any, source: str | None) -> None:
            entry[key] = value
            where = _line(body, source, line) if source else line
            if where is not None:
                entry.key_lines[key] = where

        put("name", name, None)
        cmd = values.get("cmd")
        if cmd is None or isinstance(cmd, str) and not cmd.strip():
            raise _Bad("cmd", "a model needs 'cmd': the command line that starts its server")
        if not isinstance(cmd, str):
            raise _Bad("cmd", f"{brief(cmd)} is not a command line (llama-swap's 'cmd' is "
                       "text, split as a shell would)")
        argv = self._words(cmd, "cmd")
        self._left_macros(values)
        proxy = values.get("proxy", DEFAULT_PROXY)
        if not isinstance(proxy, str):
            raise _Bad("proxy", f"{brief(proxy)} is not a URL")
        if "${PORT}" in proxy and "${PORT}" not in cmd:
            if "proxy" in values:
                raise _Bad("proxy", "proxy uses ${PORT} but cmd does not: ${PORT} is only "
                           "given to a command that takes it")
            raise _Bad("cmd", "cmd does not take ${PORT}: pass it to the server (e.g. "
                       "--port ${PORT}), or set 'proxy' to the address it listens on")
        described = [str(values[k]) for k in ("name", "description") if values.get(k)]
        if described:
            put("description", " — ".join(described), "description" if "description" in
                values else "name")
        put("command", argv, "cmd")
        if "env" in values:
            env = self._env(values["env"])
            pinned_gpu = env.get("CUDA_VISIBLE_DEVICES", "")
            if pinned_gpu.isdigit():  # the engine places it, and sets the variable itself
                del env["CUDA_VISIBLE_DEVICES"]
                put("gpus", [int(pinned_gpu)], "env")
            elif pinned_gpu:
                self.out.warn(_line(body, "env", line), "env", name, f"CUDA_VISIBLE_DEVICES="
                              f"{pinned_gpu} is kept: the server spans those GPUs, but "
                              "vramtui admits it by its memory on the one it places it on")
            if env:
                put("env", env, "env")
        http = LinedDict(line=_line(body, "cmd", line))
        if proxy not in _DEFAULT_PROXIES:
            http["url"] = self._resolve_env(proxy, "proxy")
        if "checkEndpoint" in values:
            check = values["checkEndpoint"]
            if not isinstance(check, str) or not (check == "none" or check.startswith("/")):
                raise _Bad("checkEndpoint", f"{brief(check)}: a path such as /health, or "
                           "none")
            if check != "/health":
                http["health"] = check
        if values.get("useModelName"):
            http["model_name"] = str(values["useModelName"])
        stop = values.get("cmdStop")
        if stop and "${PID}" in str(stop):
            self.out.warn(_line(body, "cmdStop", line), "cmdStop", name, "left out: it "
                          "signals ${PID}, and vramtui stops a server's whole process group "
                          "itself (SIGTERM, then SIGKILL after timeouts.stop_grace)")
        elif stop:
            http["stop"] = self._words(str(stop), "cmdStop")
        if "healthCheckTimeout" in values:
            ready = _seconds(values["healthCheckTimeout"], "healthCheckTimeout")
            if ready < MIN_HEALTH_TIMEOUT_S:  # (as llama-swap reads it)
                self.out.warn(_line(body, "healthCheckTimeout", line), "healthCheckTimeout",
                              name, f"{ready} s is under llama-swap's minimum: "
                              f"{MIN_HEALTH_TIMEOUT_S} s, as there")
                ready = MIN_HEALTH_TIMEOUT_S
            http["ready_timeout"] = f"{ready}s"
        put("http", http, None)
        put("api", list(API), None)
        ttl = _seconds(values.get("ttl", 0), "ttl")
        put("keep_alive", f"{ttl}s" if ttl > 0 else "never", "ttl" if "ttl" in values else None)
        if "unloadTimeout" in values:
            grace = _seconds(values["unloadTimeout"], "unloadTimeout")
            put("timeouts", {"stop_grace": f"{grace}s"}, "unloadTimeout")
        if values.get("concurrencyLimit") == 0:
            self.out.warn(_line(body, "concurrencyLimit", line), "concurrencyLimit", name,
                          "0 is llama-swap's default: the concurrency comes from -np/--parallel "
                          "in cmd, else the engine's default")
        concurrency = self._concurrency(values.get("concurrencyLimit"), argv)
        if concurrency is not None:
            put("concurrency", concurrency, "concurrencyLimit")
        aliases = self._aliases(model_id, name, values.get("aliases"), body, line)
        if aliases:
            put("aliases", aliases, "aliases")
        unlisted = values.get("unlisted", False)
        if not isinstance(unlisted, bool):
            raise _Bad("unlisted", f"{brief(unlisted)} is not true or false")
        if unlisted:
            put("unlisted", True, "unlisted")
        if model_id in self.pinned:
            put("pinned", True, None)
        if model_id in self.preload:
            put("preload", True, None)
        return entry

    def _words(self, text: str, key: str) -> list[str]:
        lines = []
        for raw in text.split("\n"):
            trimmed = raw.strip()
            lines.append(trimmed[:-1] + " " if trimmed.endswith("\\") else raw)
        try:
            words = shlex.split("\n".join(lines), comments=False, posix=True)
        except ValueError as exc:
            raise _Bad(key, f"cannot be split into words as a shell would: {exc}") from None
        if not words:
            raise _Bad(key, "an empty command")
        return [self._ours(word) for word in words]

    def _ours(self, word: str) -> str:
        """One word in our spelling: ``${env.X}`` → ``${X}``, ``${PORT}`` kept, any other
        ``$`` doubled."""
        def piece(match: re.Match[str]) -> str:
            if match.group(1):
                return f"${{{match.group(1)}}}"
            if match.group(2):
                return match.group(0)
            return "$$"
        return _DOLLAR.sub(piece, word)

    def _resolve_env(self, text: str, key: str) -> str:
        def value(match: re.Match[str]) -> str:
            var = match.group(1)
            if var not in self.environ:
                raise _Bad(key, f"environment variable {var} is not set")
            return self.environ[var]
        return _ENV_USE.sub(value, text)

    def _left_macros(self, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            for text in _strings(value):
                for macro in _MACRO_USE.findall(text):
                    if macro == "PORT" or (macro == "PID" and key == "cmdStop"):
                        continue
                    raise _Bad(key, f"unknown macro '${{{macro}}}' (define it under "
                               "'macros:')")

    def _env(self, value: Any) -> dict[str, str]:
        if not isinstance(value, list):
            raise _Bad("env", f"{brief(value)} is not a list of K=V items")
        env: dict[str, str] = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep or not key:
                raise _Bad("env", f"{brief(item)} is not K=V")
            env[key] = self._ours(val)
        return env

    def _concurrency(self, limit: Any, argv: list[str]) -> int | None:
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise _Bad("concurrencyLimit", f"{brief(limit)} is not a whole number")
            if limit:
                return limit
        for flag, value in zip(argv, argv[1:], strict=False):
            if flag in _PARALLEL and value.isdigit() and int(value) > 0:
                return int(value)
        return None

    def _aliases(self, model_id: str, name: str, value: Any, body: Any,
                 line: int | None) -> list[str]:
        wanted = [model_id] if model_id != name else []
        if value is not None:
            if not isinstance(value, list):
                raise _Bad("aliases", f"{brief(value)} is not a list of names")
            wanted += [str(a) for a in value]
        aliases: list[str] = []
        for alias in wanted:
            if not ALIAS_RE.match(alias):
                self.out.warn(_line(body, "aliases", line), "aliases", name,
                              f"alias {alias!r} is left out: a model name is letters, "
                              "digits, . _ : / @ + - (up to 128)")
            elif alias not in aliases and alias != name:
                aliases.append(alias)
        return aliases


def _merge(base: list[tuple[str, Any]], own: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    merged = list(base)
    for name, value in own:
        for i, (existing, _) in enumerate(merged):
            if existing == name:
                merged[i] = (name, value)
                break
        else:
            merged.append((name, value))
    return merged


def _substitute(value: Any, macros: list[tuple[str, Any]], key: str) -> Any:
    """Every macro in every string of ``value``, the last declared first, as llama-swap; a
    string that would grow past :data:`MAX_EXPANDED` (macros of macros) is an error of
    ``key``, found before it is built."""
    for name, macro in reversed(macros):
        value = _substitute_one(value, f"${{{name}}}", macro, key)
    return value


def _substitute_one(value: Any, slug: str, macro: Any, field: str) -> Any:
    if isinstance(value, str):
        if value == slug:
            return macro
        if slug in value:
            text = str(macro).lower() if isinstance(macro, bool) else str(macro)
            size = len(value) + value.count(slug) * (len(text) - len(slug))
            if size > MAX_EXPANDED:
                raise _Bad(field, f"its macros expand it to {size:,} characters, more than "
                           f"{MAX_EXPANDED:,}: does a macro use another many times over?")
            return value.replace(slug, text)
        return value
    if isinstance(value, Mapping):
        out = LinedDict(line=value.line if isinstance(value, LinedDict) else None)
        for key, item in value.items():
            out[key] = _substitute_one(item, slug, macro, field)
        if isinstance(value, LinedDict):
            out.key_lines.update(value.key_lines)
        return out
    if isinstance(value, list):
        items = LinedList([_substitute_one(v, slug, macro, field) for v in value],
                          line=value.line if isinstance(value, LinedList) else None)
        if isinstance(value, LinedList):
            items.lines = list(value.lines)
        return items
    return value


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _strip_comments(text: str) -> str:
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith("#"))


def _seconds(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Bad(key, f"{brief(value)} is not a whole number of seconds")
    return value
