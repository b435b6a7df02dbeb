"""Reading llama-swap's ``config.yaml`` as our own descriptors, as llama-swap reads it.

A llama-swap file is a mapping with ``models:`` (a mapping by model ID) and neither ``name:``
nor ``backends:``.  Each model becomes one backend that runs as a model server (``http:``):

- macros: the top-level ``macros`` and a model's own (which override them), plus
  ``${MODEL_ID}``, expanded in every value of the model, the last declared first (so one may
  use an earlier one), a value that is a whole ``${m}`` keeping its type; the top-level
  macros in the top-level values too; a macro's value read as llama-swap's YAML reads it
  (1.2: ``on`` is text) and written into text as Go writes it (``1.0`` is ``1``);
  ``${PORT}`` stays ours (the engine picks a free port, so ``startPort`` has no use);
  ``${env.X}`` becomes our ``${X}`` in ``cmd``, ``cmdStop`` and ``env`` (read when vramtui
  loads the file; read now when ``X`` is one of our server macros, and in a command line
  when its value is several words, which llama-swap splits) and is read now in every
  other value, a whole ``${env.X}`` as the YAML value it spells;
- ``cmd`` split as llama-swap splits it: comment lines dropped (before and after the macros
  go in), a line ending in ``\\`` joined to the next, then split by :func:`posix_words`;
  a ``$`` that is no macro is written ``$$`` (llama-swap starts no shell, so it is literal
  there too);
- ``proxy`` → ``http.url`` (left out when it is the default ``http://localhost:${PORT}``),
  ``checkEndpoint`` → ``http.health`` (``none`` kept), ``useModelName`` →
  ``http.model_name``, ``cmdStop`` → ``http.stop``, the top-level ``healthCheckTimeout``
  (llama-swap reads no model's own) → ``http.ready_timeout``; ``ttl`` (none or -1:
  ``globalTTL``; 0: never) → ``keep_alive``, ``unloadTimeout`` (0: the top-level one, else
  10 s) → ``timeouts.stop_grace``, ``concurrencyLimit`` (else
  llama-server's ``-np``/``--parallel`` in ``cmd``, else llama-swap's default, 10: the
  requests it lets through at once) → ``concurrency``; ``env`` (``K=V``
  items) → ``env``, but ``CUDA_VISIBLE_DEVICES=N`` → ``gpus: [N]`` (the engine places a
  server and sets that variable itself); ``aliases``, ``unlisted``; ``name``/``description``
  → ``description``;
- ``hooks.on_startup.preload`` → ``preload: true``; ``routing.scheduler.settings.fifo.
  priority`` → each model's ``priority``; ``groups`` (top-level, or under
  ``routing.router.settings``, where llama-swap keeps them now) are read and explained:
  vramtui decides which models share a GPU from their measured memory, so ``swap`` and
  ``exclusive`` have nothing left to say, and ``persistent: true`` makes its members pinned.

A model ID that is not a backend name (``org/model:7b``) gets a name made of it that is no
other model's ID nor anyone's alias, the ID kept as an alias and listed in its place
(``listed_as``: ``/v1/models`` and ``/running`` show the ID, as llama-swap's do). As in
llama-swap, a request's model is looked up among the IDs first: an alias that is another
model's ID is left out, and so is one that an earlier model has (llama-swap refuses that
file). What cannot be mapped comes back as one ``DescriptorWarning`` each, never silently;
a model that cannot be read at all is one ``DescriptorError`` and the others load.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..errors import brief
from ..units import digits
from ..validate import PRIORITY_MAX, PRIORITY_MIN
from .errors import DescriptorError, DescriptorWarning
from .http import MACROS as SERVER_MACROS
from .schema import MAX_ALIAS, MAX_KEEP_ALIVE_S, NAME_RE, is_model_name
from .yamlio import LinedDict, LinedList, core_scalar, load_core

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
DEFAULT_HEALTH_TIMEOUT_S = 120  # llama-swap's healthCheckTimeout when none is given
DEFAULT_UNLOAD_TIMEOUT_S = 10  # llama-swap's unloadTimeout when none (or 0) is given
DEFAULT_TTL = -1  # a model's ttl that means: globalTTL
DEFAULT_CONCURRENCY = 10  # llama-swap's concurrencyLimit when none (or 0) is given
#: Keys whose ``${env.X}`` is kept as our ``${X}``, read each time vramtui loads the file
#: (everywhere else it is read now, as llama-swap reads the whole file).
LATE_ENV_KEYS = frozenset({"cmd", "cmdStop", "env"})
#: The top-level values that are read (global macros and env macros in them).
TOP_VALUES = ("healthCheckTimeout", "globalTTL", "unloadTimeout", "groups", "hooks",
              "routing")
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
                      "unloadTimeout", "groups", "hooks", "routing"})
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
                    environ: Mapping[str, str], workdir: Path | None = None) -> Iterator[
                        tuple[LinedDict, int | None] | DescriptorError]:
    """Each model of a llama-swap document as one of our entries (with its line), and a
    ``DescriptorWarning`` for each thing that is not mapped, or an error for what is bad.
    ``workdir``: where its servers run (llama-swap runs them in its own working directory,
    which relative paths in ``cmd`` are read from); None: the file's folder, said once."""
    out = _Out(file)
    _Translator(document, out, environ, load_core(document), workdir).run()
    yield from out.items


class _Translator:
    def __init__(self, doc: Mapping[Any, Any], out: _Out, environ: Mapping[str, str],
                 core: Any = None, workdir: Path | None = None) -> None:
        self.doc = doc
        self.workdir = workdir
        self.out = out
        self.environ = environ
        # The same file read as llama-swap reads its scalars (YAML 1.2): where the macros'
        # values come from (``on`` stays ``on``; ``1e3`` is the number 1000).
        self.core = core if isinstance(core, Mapping) else None
        self.names: dict[str, str] = {}  # model ID -> backend name
        self.taken_aliases: dict[str, str] = {}  # alias -> the model ID that has it
        self.pinned: set[str] = set()
        self.preload: set[str] = set()
        self.priority: dict[str, int] = {}  # model ID -> its priority (routing.scheduler)
        self.spread: set[str] = set()  # env variables of several words read into a command
        self.top: dict[str, Any] = {}  # TOP_VALUES, their macros in

    def _core_macros(self, *path: Any) -> Any:
        """The macros at ``path`` (("macros",) or ("models", ID, "macros")) as YAML 1.2 reads
        them, else as given."""
        node: Any = self.doc
        core: Any = self.core
        for key in path:
            node = _get(node, key)
            core = _get(core, key)
        # (its own names too: a macro named ``on`` is ``on`` there, not YAML 1.1's True)
        return core if isinstance(core, Mapping) and isinstance(node, Mapping) else node

    def run(self) -> None:
        doc, out = self.doc, self.out
        for key in doc:
            if key in TOP_KEYS:
                continue
            why = TOP_UNMAPPED.get(str(key), "not a key vramtui knows of llama-swap's")
            out.warn(_line(doc, key), str(key), None, f"llama-swap's {key!r} is not used: {why}")
        macros = self._macros(self._core_macros("macros"), _line(doc, "macros"), None)
        if macros is None:
            return
        if "startPort" in doc:
            out.warn(_line(doc, "startPort"), "startPort", None, "not needed: the engine "
                     "picks a free port for each ${PORT}")
        for key in TOP_VALUES:  # (as llama-swap: the global macros apply to them too)
            if doc.get(key) is None:  # (left empty: its default, as there)
                continue
            try:
                self.top[key] = self._env_now(_substitute(doc[key], macros, key), key)
                self._left_macros({key: self.top[key]})
            except _Bad as bad:
                out.error(_line(doc, key), key, None, bad.message)
                return
        if self.workdir is None:
            out.warn(None, "cwd", None, "the working directory is unknown (removed?): the "
                     "models run in the file's folder, and relative paths in cmd are read "
                     "from there (llama-swap reads them from its working directory)")
        models = doc["models"]
        self.names = self._names(models)
        self._groups(self.top.get("groups"), _line(doc, "groups"))
        self._routing(self.top.get("routing"), _line(doc, "routing"))
        self._hooks(self.top.get("hooks"), _line(doc, "hooks"))
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
            elif macro is None:
                problem = f"macro {text!r} has no value (llama-swap refuses a null macro)"
            elif isinstance(macro, str) and f"${{{text}}}" in macro:
                problem = f"macro {text!r} refers to itself"
            if problem is not None:
                self.out.error(where, "macros", backend, problem)
                return None
            macros.append((text, macro))
        return macros

    def _names(self, models: Mapping[Any, Any]) -> dict[str, str]:
        """Each model ID's backend name: the ID itself when it is a backend name, else one
        made of it that is no other model's ID nor anyone's alias (a request names a model
        by its ID or an alias: the name made up here must not take either)."""
        names: dict[str, str] = {}
        ids: dict[Any, str] = {}  # the key as YAML read it -> its text
        for model_id in models:
            if model_id is None or isinstance(model_id, bool):  # (YAML's null:, yes:)
                self.out.error(_line(models, model_id), None, None, f"a model ID is "
                               f"{'null' if model_id is None else brief(model_id)}, not text: "
                               "quote it, or name the model")
                continue
            ids[model_id] = str(model_id)
        taken = set(ids.values()) | {
            str(a) for body in models.values() if isinstance(body, Mapping)
            and isinstance(body.get("aliases"), list) for a in body["aliases"]}
        for model_id, text in ids.items():
            if NAME_RE.match(text):
                names[text] = text
                continue
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
            text = str(member).strip()  # (llama-swap trims what it preloads)
            if not text:
                continue
            model_id = text if text in self.names else aliases.get(text)
            if model_id in found:
                refused = " (llama-swap refuses such a file)" if what.startswith("groups") \
                    else ""
                self.out.warn(line, what, None, f"{text!r} is in it twice{refused}; once is "
                              "enough")
            elif model_id is not None:
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
        group_of: dict[str, str] = {}
        for group_id, group in groups.items():
            where = _line(groups, group_id, line)
            if not isinstance(group, Mapping):
                self.out.warn(where, f"groups.{group_id}", None, "not a mapping; ignored")
                continue
            members = self._members(group.get("members"), _line(group, "members", where),
                                    f"groups.{group_id}.members")
            for member in members:
                if member in group_of:
                    self.out.warn(where, f"groups.{group_id}.members", None, f"{member!r} is "
                                  f"in group {group_of[member]!r} too (llama-swap refuses such "
                                  "a file); vramtui reads both")
                group_of.setdefault(member, str(group_id))
            flags = ", ".join(f"{k}: {str(group[k]).lower()}" for k in
                              ("swap", "exclusive", "persistent") if k in group)
            text = (f"group {group_id!r} ({', '.join(members) or 'no members'}"
                    f"{'; ' + flags if flags else ''}): vramtui decides which models share a "
                    "GPU from their measured memory: they run side by side when they fit and "
                    "take turns when they do not")
            if group.get("persistent") is True:
                self.pinned.update(members)
                text += ("; persistent: its members are pinned (never evicted for another, "
                         "once their memory is known: until a request of each was measured, "
                         "or with vram: in its descriptor, a member leaves when another "
                         "model needs the room)")
            self.out.warn(where, f"groups.{group_id}", None, text)

    def _routing(self, routing: Any, line: int | None) -> None:
        """llama-swap's ``routing:`` (where its groups now live): ``router.settings.groups``
        read as the top-level ``groups``; ``scheduler.settings.fifo.priority`` (model ID →
        priority, higher first) as each model's ``priority``; the rest said not used."""
        if routing is None:
            return
        if not isinstance(routing, Mapping):
            self.out.warn(line, "routing", None, "'routing' is not a mapping; ignored")
            return
        for key in routing:
            if key not in ("router", "scheduler"):
                self.out.warn(_line(routing, key, line), f"routing.{key}", None,
                              "not a part of routing vramtui reads; ignored")
        router = self._routing_part(routing, "router", "group", line, "vramtui decides "
                                    "which models share a GPU from their measured memory")
        settings = router.get("settings") if router is not None else None
        if isinstance(settings, Mapping):
            self._groups(settings.get("groups"), _line(settings, "groups", line))
        scheduler = self._routing_part(routing, "scheduler", "fifo", line, "vramtui queues "
                                       "by priority, first come first served within one")
        if scheduler is None:
            return
        where = _line(routing, "scheduler", line)
        settings = scheduler.get("settings")
        fifo = settings.get("fifo") if isinstance(settings, Mapping) else None
        ranks = fifo.get("priority") if isinstance(fifo, Mapping) else None
        if ranks is None:
            return
        if not isinstance(ranks, Mapping):
            self.out.warn(where, "routing.scheduler.settings.fifo.priority", None,
                          f"{brief(ranks)} is not a mapping of model IDs to numbers; ignored")
            return
        for model_id, rank in ranks.items():
            found = self._members([model_id], where, "routing.scheduler.settings.fifo.priority")
            if not found:
                continue
            if isinstance(rank, bool) or not isinstance(rank, int) or \
                    not PRIORITY_MIN <= rank <= PRIORITY_MAX:
                self.out.warn(where, "routing.scheduler.settings.fifo.priority", None,
                              f"{model_id!r}: {brief(rank)} is not a whole number from "
                              f"{PRIORITY_MIN} to {PRIORITY_MAX}; ignored")
                continue
            self.priority[found[0]] = rank

    def _routing_part(self, routing: Mapping[Any, Any], part: str, ours: str,
                      line: int | None, instead: str) -> Mapping[Any, Any] | None:
        """``routing.<part>`` (None: not a mapping); a ``use`` other than ``ours`` said."""
        value = routing.get(part)
        if not isinstance(value, Mapping):
            return None
        if value.get("use", ours) != ours:
            self.out.warn(_line(routing, part, line), f"routing.{part}.use", None,
                          f"{part} {brief(value.get('use'))} is not used: {instead}")
        return value

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
        own = self._macros(self._core_macros("models", model_id, "macros"),
                           _line(body, "macros", line), name)
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
                if key == "filters":
                    why += _by_id_note(value)
                self.out.warn(_line(body, key, line), key, name,
                              f"llama-swap's {key!r} is not used: {why}")
                continue
            if key in ("cmd", "cmdStop") and isinstance(value, str):
                value = _strip_comments(value)
            value = _substitute(value, macros, key)
            values[key] = value if key in LATE_ENV_KEYS else self._env_now(value, key)
        if "healthCheckTimeout" in values:  # (llama-swap sets every model's to the global)
            self.out.warn(_line(body, "healthCheckTimeout", line), "healthCheckTimeout", name,
                          "a model's own is not read by llama-swap: the top-level "
                          "healthCheckTimeout applies")
        values["healthCheckTimeout"] = self.top.get("healthCheckTimeout",
                                                    DEFAULT_HEALTH_TIMEOUT_S)
        ttl = values.get("ttl", DEFAULT_TTL)
        if ttl == DEFAULT_TTL:
            values["ttl"] = self.top.get("globalTTL", 0)
        grace = values.get("unloadTimeout", 0)
        if grace == 0:  # (0 is llama-swap's "not given": the global one, else its default)
            values["unloadTimeout"] = self.top.get("unloadTimeout") or DEFAULT_UNLOAD_TIMEOUT_S
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
        self.spread.clear()
        argv = self._words(cmd, "cmd")
        if self.spread:  # (said: an import writes the values, a key among them maybe)
            spread = ", ".join(f"${{env.{var}}}" for var in sorted(self.spread))
            self.out.warn(_line(body, "cmd", line), "cmd", name, f"{spread} holds several "
                          "words: read now and split, as llama-swap splits them, so the "
                          "descriptor has their values (an import writes them)")
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
        if self.workdir is not None:  # (else the file's folder, as a descriptor's)
            cwd = str(self.workdir).replace("$", "$$")
            if "/" in argv[0] and not argv[0].startswith(("/", "$")):
                argv[0] = os.path.normpath(f"{cwd}/{argv[0]}")  # (./x: in llama-swap's cwd)
            put("cwd", cwd, None)
        put("command", argv, "cmd")
        if "env" in values:
            env = self._env(values["env"], name, _line(body, "env", line))
            pinned_gpu = env.get("CUDA_VISIBLE_DEVICES", "")
            if digits(pinned_gpu):  # the engine places it, and sets the variable itself
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
            http["url"] = proxy
        if "checkEndpoint" in values:
            check = values["checkEndpoint"]
            if not isinstance(check, str) or not check.strip() or any(c.isspace()
                                                                       for c in check):
                raise _Bad("checkEndpoint", f"{brief(check)}: a path such as /health, or "
                           "none")
            if check != "none" and not check.startswith("/"):
                check = "/" + check  # (llama-swap asks it relative to the server's URL)
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
        ready = _seconds(values["healthCheckTimeout"], "healthCheckTimeout")
        if ready < MIN_HEALTH_TIMEOUT_S:  # (as llama-swap reads it)
            self.out.warn(_line(self.doc, "healthCheckTimeout", line), "healthCheckTimeout",
                          name, f"{ready} s is under llama-swap's minimum: "
                          f"{MIN_HEALTH_TIMEOUT_S} s, as there")
            ready = MIN_HEALTH_TIMEOUT_S
        http["ready_timeout"] = f"{ready}s"
        put("http", http, None)
        put("api", list(API), None)
        ttl = _seconds(values["ttl"], "ttl")
        # 0, or more than a year (as vramtui reads keep_alive): never
        put("keep_alive", f"{ttl}s" if 0 < ttl <= MAX_KEEP_ALIVE_S else "never",
            "ttl" if "ttl" in body else None)
        grace = _seconds(values["unloadTimeout"], "unloadTimeout")
        put("timeouts", {"stop_grace": f"{grace}s"}, "unloadTimeout" if "unloadTimeout" in body
            else None)
        if values.get("concurrencyLimit") == 0:
            self.out.warn(_line(body, "concurrencyLimit", line), "concurrencyLimit", name,
                          "0 is llama-swap's default: the concurrency comes from -np/--parallel "
                          f"in cmd, else llama-swap's default, {DEFAULT_CONCURRENCY}")
        put("concurrency", self._concurrency(values.get("concurrencyLimit"), argv),
            "concurrencyLimit")
        aliases = self._aliases(model_id, name, values.get("aliases"), body, line)
        if aliases:
            put("aliases", aliases, "aliases")
        if model_id != name and model_id in aliases:  # (listed by its ID, as llama-swap does)
            put("listed_as", model_id, None)
        unlisted = values.get("unlisted", False)
        if not isinstance(unlisted, bool):
            raise _Bad("unlisted", f"{brief(unlisted)} is not true or false")
        if unlisted:
            put("unlisted", True, "unlisted")
        if model_id in self.pinned:
            put("pinned", True, None)
        if model_id in self.priority:
            put("priority", self.priority[model_id], None)
        if model_id in self.preload:
            put("preload", True, None)
        return entry

    def _words(self, text: str, key: str) -> list[str]:
        """A command line split as llama-swap splits it when it starts the server (after its
        macros are in): comment lines dropped (again: a macro may have brought one), a line
        ending in ``\\`` joined to the next, then :func:`posix_words`."""
        lines = []
        for raw in _strip_comments(text).split("\n"):
            trimmed = raw.strip()
            lines.append(trimmed[:-1] + " " if trimmed.endswith("\\") else raw)
        words = posix_words(self._spread_env("\n".join(lines), key))
        if not words:
            raise _Bad(key, "an empty command")
        return [self._ours(word, key) for word in words]

    def _spread_env(self, text: str, key: str) -> str:
        """``${env.X}`` whose value is not one plain word read into the command line before
        it is split, as llama-swap reads every env macro into the file's text first:
        ``cmd: llama-server ${env.ARGS}`` with ``ARGS="-ngl 99 -c 4096"`` is four words, not
        one.  A value that is one word (a path, a token) stays ``${X}``, read each time
        vramtui loads the file, so an import writes no secret into the descriptor."""
        def one(match: re.Match[str]) -> str:
            var = match.group(1)
            if var not in self.environ or var in SERVER_MACROS:
                return match.group(0)
            value = self._env_value(var, key)
            if posix_words(value) == [value]:
                return match.group(0)
            self.spread.add(var)
            return value
        return _ENV_USE.sub(one, text)

    def _ours(self, word: str, key: str) -> str:
        """One word in our spelling: ``${env.X}`` → ``${X}`` (read when vramtui loads the
        file; read now when ``X`` is one of our server macros, ``PORT`` say, which ``${X}``
        would mean instead), ``${PORT}`` kept, any other ``$`` doubled."""
        def piece(match: re.Match[str]) -> str:
            if match.group(1):
                var = match.group(1)
                if var in SERVER_MACROS:
                    return self._env_value(var, key).replace("$", "$$")
                return f"${{{var}}}"
            if match.group(2):
                return match.group(0)
            return "$$"
        return _DOLLAR.sub(piece, word)

    def _env_value(self, var: str, key: str) -> str:
        if var not in self.environ:
            raise _Bad(key, f"environment variable {var} is not set")
        value = self.environ[var]
        if "\n" in value or "\r" in value or "\0" in value:
            raise _Bad(key, f"environment variable {var} holds a line break or a NUL, which "
                       "llama-swap refuses in a config")
        return value

    def _env_now(self, value: Any, key: str) -> Any:
        """Every ``${env.X}`` in ``value`` read now, as llama-swap reads them into the file's
        text before it parses it: a whole ``${env.X}`` is read as the YAML value it spells
        (``ttl: ${env.TTL}`` is a number)."""
        if isinstance(value, str):
            whole = _ENV_USE.fullmatch(value)
            if whole:
                return core_scalar(self._env_value(whole.group(1), key))
            return _ENV_USE.sub(lambda m: self._env_value(m.group(1), key), value)
        return _each(value, lambda item: self._env_now(item, key))

    def _left_macros(self, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            for text in _strings(value):
                for macro in _MACRO_USE.findall(text):
                    if macro == "PORT" or (macro == "PID" and key == "cmdStop"):
                        continue
                    raise _Bad(key, f"unknown macro '${{{macro}}}' (define it under "
                               "'macros:')")

    def _env(self, value: Any, name: str, line: int | None) -> dict[str, str]:
        if not isinstance(value, list):
            raise _Bad("env", f"{brief(value)} is not a list of K=V items")
        env: dict[str, str] = {}
        for item in value:
            key, sep, val = str(item).partition("=")
            if not sep or not key:
                self.out.warn(line, "env", name, f"{brief(item)} is not K=V: left out (a "
                              "process's environment has no such entry)")
                continue
            env[key] = self._ours(val, "env")
        return env

    def _concurrency(self, limit: Any, argv: list[str]) -> int:
        """The requests let through at once: llama-swap lets ``concurrencyLimit`` through
        (10 when none) and llama-server queues what its ``-np`` slots cannot take; with no
        limit given, ``-np`` is what the server serves at once, and the rest wait here."""
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
                raise _Bad("concurrencyLimit", f"{brief(limit)} is not a whole number")
            if limit:
                return limit
        for flag, value in zip(argv, argv[1:], strict=False):
            if flag in _PARALLEL and digits(value) and int(value) > 0:
                return int(value)
        return DEFAULT_CONCURRENCY

    def _aliases(self, model_id: str, name: str, value: Any, body: Any,
                 line: int | None) -> list[str]:
        wanted = [model_id] if model_id != name else []
        if value is not None:
            if not isinstance(value, list):
                raise _Bad("aliases", f"{brief(value)} is not a list of names")
            named = [str(a) for a in value if a is not None and not isinstance(a, Mapping | list)]
            if len(named) < len(value):
                self.out.warn(_line(body, "aliases", line), "aliases", name, "an alias that is "
                              "empty or not a name (null, a list, a mapping) is left out")
            wanted += named
        aliases: list[str] = []
        where = _line(body, "aliases", line)
        backends = set(self.names.values())
        for alias in wanted:
            if alias in aliases or alias == name:
                continue
            owner = self.taken_aliases.get(alias)
            if not is_model_name(alias):
                self.out.warn(where, "aliases", name, f"alias {alias!r} is left out: a model "
                              "name is printable text, no blank at either end, up to "
                              f"{MAX_ALIAS} characters")
            elif alias != model_id and (alias in self.names or alias in backends):
                # (llama-swap looks a request's model up among the IDs first)
                self.out.warn(where, "aliases", name, f"alias {alias!r} is left out: it is "
                              "another model's ID, and a request for it goes to that model, "
                              "as in llama-swap")
            elif owner is not None and owner != model_id:
                self.out.warn(where, "aliases", name, f"alias {alias!r} is left out: model "
                              f"{owner!r} has it already (llama-swap refuses such a file)")
            else:
                self.taken_aliases[alias] = model_id
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
            text = go_text(macro)
            size = len(value) + value.count(slug) * (len(text) - len(slug))
            if size > MAX_EXPANDED:
                raise _Bad(field, f"its macros expand it to {size:,} characters, more than "
                           f"{MAX_EXPANDED:,}: does a macro use another many times over?")
            return value.replace(slug, text)
        return value
    return _each(value, lambda item: _substitute_one(item, slug, macro, field))


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
    if isinstance(value, float) and value.is_integer():  # (Go's YAML takes 60.0 for an int)
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Bad(key, f"{brief(value)} is not a whole number of seconds")
    return value


def _get(node: Any, key: Any) -> Any:
    """``node[key]``, a key matched by its text too (a model ID ``7`` is the number 7 in
    the file and the text "7" here), None when absent or ``node`` is no mapping."""
    if not isinstance(node, Mapping):
        return None
    if key in node:
        return node[key]
    return next((value for k, value in node.items() if str(k) == str(key)), None)


def go_text(value: Any) -> str:
    """A macro's value as text, as llama-swap writes it into a string (Go's ``%v``): ``true``,
    ``42``, and a float in its shortest form, ``1e+06`` from six places up or below
    ``1e-04``, ``1`` for 1.0."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, float):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0"
    digits_tuple, exponent = Decimal(repr(abs(value))).normalize().as_tuple()[1:]
    digits = "".join(map(str, digits_tuple))
    point = len(digits) + int(exponent)  # where the decimal point falls in ``digits``
    if not -4 <= point - 1 < 6:  # %e
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{point - 1:+03d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def posix_words(line: str) -> list[str]:
    """``line`` split into words as llama-swap splits a command (the POSIX dialect of
    golib's shlex, which never fails): blanks are space, tab and newline; outside quotes a
    backslash takes the next character as it is (before a newline, or at the end, it is
    dropped); inside double quotes it does only before ``$``, a backquote, ``"``, ``\\`` or
    a newline, and stays otherwise; nothing is special inside single quotes; a quote left
    open runs to the end."""
    words: list[str] = []
    word: list[str] | None = None  # the word being read (None: between words)
    quote = ""  # the open quote, if any
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        i += 1
        if c == "\\" and quote != "'":
            nxt = line[i] if i < n else ""
            if not (quote == '"' and nxt not in ("$", "`", '"', "\\", "\n", "")):
                i += 1
                if nxt in ("\n", ""):
                    continue  # a line continued, or a backslash at the very end: gone
                c = nxt  # taken as it is
                word = [] if word is None else word
                word.append(c)
                continue
        if quote and c == quote:
            quote = ""
        elif quote:
            assert word is not None
            word.append(c)
        elif c in ("'", '"'):
            quote = c
            word = [] if word is None else word
        elif c in (" ", "\t", "\n"):
            if word is not None:
                words.append("".join(word))
                word = None
        else:
            word = [] if word is None else word
            word.append(c)
    if word is not None:
        words.append("".join(word))
    return words


def _each(value: Any, fn: Any) -> Any:
    """``value`` with ``fn`` applied to each of its items (of a mapping or list, keeping
    their lines); ``value`` itself otherwise."""
    if isinstance(value, Mapping):
        out = LinedDict(line=value.line if isinstance(value, LinedDict) else None)
        for key, item in value.items():
            out[key] = fn(item)
        if isinstance(value, LinedDict):
            out.key_lines.update(value.key_lines)
        return out
    if isinstance(value, list):
        items = LinedList([fn(v) for v in value],
                          line=value.line if isinstance(value, LinedList) else None)
        if isinstance(value, LinedList):
            items.lines = list(value.lines)
        return items
    return value


def _by_id_note(filters: Any) -> str:
    """What a model's ``filters.setParamsByID`` would have served: llama-swap makes each of
    its IDs an alias, with its parameters set; vramtui serves none of them."""
    by_id = filters.get("setParamsByID") if isinstance(filters, Mapping) else None
    if not isinstance(by_id, Mapping) or not by_id:
        return ""
    ids = ", ".join(repr(str(k)) for k in list(by_id)[:8]) + (" …" if len(by_id) > 8 else "")
    return f"; the model IDs of its setParamsByID ({ids}) are not served"
