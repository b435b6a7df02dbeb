"""What a backend is: the ``BackendSpec`` dataclass and the validation that builds one.

``build_spec`` takes one backend's merged descriptor mapping (layers and ``extends`` already
applied, YAML spelling: ``vram``, ``keep_alive``, ``timeouts.start`` …) and returns a frozen
``BackendSpec`` or raises ``InvalidBackend`` listing every bad field. It does no YAML and knows
nothing of files except the directory each path field is relative to.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import brief
from ..textsafe import visible
from ..units import parse_duration, parse_size
from ..validate import PRIORITY_MAX, PRIORITY_MIN
from .errors import FieldError, unknown_key_message
from .http import HttpSpec, keep_macros, parse_http

DEFAULT_SAFETY_MIB = 512
DEFAULT_KEEP_ALIVE_S = 300.0
#: Longer is no idle time anyone means: it reads as 'never' (``9999h`` was a common way to
#: write it, and a figure past a float's range must not reach the engine's timers).
MAX_KEEP_ALIVE_S = 366 * 86400.0
MAX_CONCURRENCY = 65536  # requests one worker runs at once (a vLLM may be set to thousands)
DEFAULT_START_TIMEOUT_S = 120.0
DEFAULT_STOP_GRACE_S = 10.0
DEFAULT_PING_TIMEOUT_S = 5.0
#: A model server's answer that sends nothing for this long fails its job (its slot freed):
#: long enough for a first token after a big prompt's prefill on a slow GPU.
DEFAULT_IDLE_TIMEOUT_S = 300.0
#: What the engine does when a worker holds more than its figures (see ``on_overuse``).
OVERUSE_POLICIES = ("warn", "evict", "kill")
DEFAULT_ON_OVERUSE = "evict"
DEFAULT_VRAMD_EVENT_TIMEOUT_S = 600.0  # vramd's own default (VRAMD_EVENT_TIMEOUT_SEC)

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# Keys of a backend as written in YAML. The last three are read by the loader, not kept.
TOP_KEYS = frozenset(
    {
        "name",
        "description",
        "command",
        "script",
        "python",
        "cwd",
        "env",
        "vram",
        "safety",
        "priority",
        "gpus",
        "keep_alive",
        "pinned",
        "preload",
        "unlisted",
        "stream",
        "inline_results",
        "concurrency",
        "timeouts",
        "calibration",
        "reload_cost",
        "wake_cost",
        "target_wait",
        "sleep",
        "simulated",
        "on_overuse",
        "protocol",
        "unload_frees_vram",
        "vramd",
        "extends",
        "abstract",
        "enabled",
        "api",
        "aliases",
        "listed_as",
        "http",
    }
)
# What an ``api:`` backend speaks over the HTTP front door's OpenAI-compatible routes.
API_KINDS = ("chat", "completions", "embeddings", "images", "speech", "transcriptions",
             "responses", "rerank")
MAX_ALIAS = 128


def is_model_name(text: str) -> bool:
    """Whether ``text`` may be a model name a client asks for (an alias): any printable text
    (spaces, any script: llama-swap's model IDs are any YAML key, ``My Model``, ``模型``),
    none at either end, up to 128 characters; never a control or line-breaking character."""
    return 0 < len(text) <= MAX_ALIAS and text.isprintable() and text == text.strip()

VRAM_KEYS = frozenset({"peak", "weights", "activation", "context"})
TIMEOUT_KEYS = frozenset({"start", "request", "stop_grace", "ping", "idle"})
CALIBRATION_KEYS = frozenset({"request"})
SLEEP_KEYS = frozenset({"residual", "host", "level"})
SLEEP_LEVELS = (1, 2)  # vLLM's: 1 keeps the weights in host memory, 2 drops them too
VRAMD_SETTING_KEYS = frozenset({"load_keys", "shape_keys", "load_kwargs", "event_timeout"})
# How the engine talks to a backend's worker: our wire protocol, or vramd's JSON lines.
PROTOCOLS = ("vramtui", "vramd")
# Mappings that a later layer (or a child through ``extends``) merges key by key.
MERGED_MAPPINGS = frozenset({"vram", "env", "timeouts", "calibration", "vramd", "http"})

# vramd's names, met in a file without ``version: 2``.
VRAMD_KEY_HINTS = {
    "vram_mib": "vramd's name: here it is 'vram' (e.g. vram: 6GiB), or mark the file 'version: 2'",
    "runtime": "vramd's name: here 'command' and 'env' are top-level, or mark the file "
    "'version: 2'",
    "calibrate_request": "vramd's name: here it is 'calibration: {request: …}', or mark the file "
    "'version: 2'",
    "gpu_ids": "vramd's name: here it is 'gpus', or mark the file 'version: 2'",
}


class Unusable:
    """A value that a translation (a vramd file) could not make sense of, with the reason.

    It stands in the mapping where the value was, so that ``build_spec`` reports it as an error
    of that field, at the line that wrote it, and a later layer can still replace it.
    """

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"Unusable({self.message!r})"


class InvalidBackend(Exception):
    """One backend has bad fields; ``errors`` lists them all."""

    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__(errors)
        self.errors = tuple(errors)


@dataclass(frozen=True)
class VramSpec:
    """A backend's VRAM figures in MiB; ``None`` where unknown."""

    peak_mib: int | None = None
    weights_mib: int | None = None
    activation_mib: int | None = None
    context_mib: int | None = None

    @property
    def peak(self) -> int | None:
        """The explicit peak, else weights + activation (+ context); ``None``: unmeasured."""
        if self.peak_mib is not None:
            return self.peak_mib
        if self.weights_mib is not None and self.activation_mib is not None:
            return self.weights_mib + self.activation_mib + (self.context_mib or 0)
        return None

    @property
    def resident(self) -> int | None:
        """What stays in VRAM between jobs: weights + context, else peak - activation.

        With only a peak known, the whole peak is assumed resident (the safe side).
        """
        if self.weights_mib is not None:
            return self.weights_mib + (self.context_mib or 0)
        peak = self.peak
        if peak is None:
            return None
        return max(0, peak - (self.activation_mib or 0))


@dataclass(frozen=True)
class SleepSpec:
    """How the engine may put a worker of this backend to sleep (when the worker can).

    ``enabled`` False (``sleep: false``): never, whatever the worker offers. ``residual_mib``
    and ``host_mib`` are the priors of what a sleeping worker keeps on its GPU and takes in
    host memory, until a sleep of it was measured; ``level`` is asked of the worker (1: the
    weights go to host memory; 2: they are dropped, and reloaded from disk on waking).
    """

    enabled: bool = True
    residual_mib: int | None = None
    host_mib: int | None = None
    level: int = 1


@dataclass(frozen=True)
class Timeouts:
    start_s: float = DEFAULT_START_TIMEOUT_S
    request_s: float | None = None  # None: no limit; counted from dispatch to the worker
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    ping_s: float = DEFAULT_PING_TIMEOUT_S  # a worker that answers no ping for this is hung
    # a model server's answer that sends no byte for this long fails its job (None: never)
    idle_s: float | None = DEFAULT_IDLE_TIMEOUT_S


@dataclass(frozen=True)
class VramdSettings:
    """How the engine drives a worker that speaks vramd's JSON lines (``protocol: vramd``).

    ``load_kwargs`` go with the ``load`` command when the worker starts. A request's keys named
    in ``load_keys`` are load kwargs too: when they differ from those the worker loaded with
    (compared on ``shape_keys`` when given, else on ``load_keys``), the worker is loaded again
    with them before the request runs. ``event_timeout_s``: a running request that sends no
    event for that long is taken as hung and its worker is killed (``None``: never).
    """

    load_keys: tuple[str, ...] = ()
    shape_keys: tuple[str, ...] | None = None
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    event_timeout_s: float | None = DEFAULT_VRAMD_EVENT_TIMEOUT_S

    @property
    def reload_keys(self) -> tuple[str, ...]:
        """The request keys whose change means loading again."""
        return self.shape_keys if self.shape_keys is not None else self.load_keys


@dataclass(frozen=True)
class BackendSpec:
    """One backend (a model served by a worker process), validated and normalised."""

    name: str
    command: tuple[str, ...] = ()
    cwd: Path = Path(".")
    env: dict[str, str] = field(default_factory=dict)
    vram: VramSpec = VramSpec()
    safety_mib: int = DEFAULT_SAFETY_MIB
    priority: int = 0
    gpus: tuple[int, ...] | None = None  # None: any GPU; HOST_GPU: the host device
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S  # math.inf: never unloaded for idleness
    pinned: bool = False
    preload: bool = False  # started when the engine starts (llama-swap's on_startup.preload)
    unlisted: bool = False  # answers by name over HTTP, but left out of the model lists
    stream: bool = False
    inline_results: bool = False  # HTML/SVG results shown in a browser, not downloaded
    concurrency: int = 1
    timeouts: Timeouts = Timeouts()
    calibration_request: bytes | None = None
    reload_cost_s: float | None = None
    wake_cost_s: float | None = None  # a wake's cost until one was measured
    target_wait_s: float | None = None  # how long its next expected request may wait
    sleep: SleepSpec = SleepSpec()
    description: str = ""
    source: str = ""
    simulated: bool = False
    on_overuse: str = DEFAULT_ON_OVERUSE
    protocol: str = "vramtui"  # one of PROTOCOLS
    # False: the worker's unload gives no memory back (vramd's peak_profile.unload_frees_vram);
    # only the end of its process does.
    unload_frees_vram: bool = True
    vramd: VramdSettings = VramdSettings()
    api: tuple[str, ...] = ()  # OpenAI-compatible APIs it speaks (``API_KINDS``)
    aliases: tuple[str, ...] = ()  # other model names it answers to over HTTP
    # the name the model lists show in place of its own (an alias: a llama-swap model's ID)
    listed_as: str | None = None
    http: HttpSpec | None = None  # set: its command starts an HTTP model server, not a worker

    @property
    def server(self) -> bool:
        """Run as an HTTP model server (an ``http:`` section), not as a worker."""
        return self.http is not None

    @property
    def runner(self) -> str:
        """What runs it, as messages name it: "server" or "worker"."""
        return "server" if self.http is not None else "worker"

    @property
    def peak(self) -> int | None:
        return self.vram.peak

    @property
    def resident(self) -> int | None:
        return self.vram.resident

    @property
    def unmeasured(self) -> bool:
        """No peak known: admission cannot size it (calibrate it first)."""
        return self.vram.peak is None


# -- small converters: raise ValueError (message only) or FieldError (field and message) ----


def _int(value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{brief(value)} is not a whole number")
    if minimum is not None and value < minimum:
        raise ValueError(f"{brief(value)} is too small (the least is {minimum})")
    if maximum is not None and value > maximum:
        raise ValueError(f"{brief(value)} is too large (the most is {maximum})")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{brief(value)} is not true or false")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{brief(value)} is not text")
    return value


def _mapping(value: object, what: str) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{brief(value)} is not a mapping of {what}")
    return value


_VAR_RE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand(text: str, environ: Mapping[str, str]) -> str:
    """Expand a leading ``~`` and ``$VAR``/``${VAR}`` (``$$`` is a ``$``); unset is an error."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(1):
            return "$"
        var = match.group(2) or match.group(3)
        if var not in environ:
            raise ValueError(f"environment variable ${var} is not set (write $$ for a '$')")
        return environ[var]

    if text == "~" or text.startswith("~/"):
        home = environ.get("HOME") or os.path.expanduser("~")
        text = home + text[1:]
    return _VAR_RE.sub(substitute, text)


def _path(text: object, base: Path, environ: Mapping[str, str]) -> str:
    """A path field: expanded, and relative to ``base``; symlinks kept (a venv's python is one)."""
    expanded = expand(_str(text), environ)
    if not expanded:
        raise ValueError("an empty path")
    return os.path.normpath(os.path.join(base, expanded))


def _command(value: object, base: Path, environ: Mapping[str, str]) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            words: list[object] = list(shlex.split(value))
        except ValueError as exc:
            raise ValueError(f"{brief(value)} cannot be split into words: {exc}") from None
    elif isinstance(value, list | tuple):
        words = list(value)
    else:
        raise ValueError(f"{brief(value)} is not a list of words or a command line")
    if not words:
        raise ValueError("an empty command")
    argv: list[str] = []
    for word in words:
        if isinstance(word, bool) or not isinstance(word, str | int | float):
            raise ValueError(f"{brief(word)} is not a word of a command line (quote it)")
        argv.append(expand(str(word), environ))
    program = argv[0]
    if "/" in program:
        argv[0] = os.path.normpath(os.path.join(base, program))
        if not os.path.exists(argv[0]):
            raise ValueError(f"program {argv[0]} does not exist")
    return tuple(argv)


PATH_KEYS = ("script", "python", "cwd")  # read by _path, relative to the file's folder


def anchor_paths(data: Mapping[str, Any], base_dir: Callable[[str], Path],
                 environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``data`` with each relative path that ``build_spec`` resolves against ``base_dir(key)``
    (``script``, ``python``, ``cwd``, a ``command``'s program) made absolute, so that it means
    the same written to a file elsewhere (what an importer writes). ``$VAR``s are kept."""

    def absolute(text: str, base: Path, program: bool = False) -> str:
        try:
            expanded = expand(text, environ)
        except ValueError:
            return text  # left for build_spec to report
        if not expanded or os.path.isabs(expanded) or (program and "/" not in expanded):
            return text
        if "$" not in text:  # all literal: tidied ($$ is a literal '$')
            return os.path.normpath(os.path.join(base, text)).replace("$", "$$")
        return os.path.join(str(base).replace("$", "$$"), text)

    out = dict(data)
    if out.get("cwd") is None:  # build_spec's default: the folder of what it runs
        run_key = "script" if out.get("script") is not None else "command"
        out["cwd"] = str(base_dir(run_key)).replace("$", "$$")
    for key in PATH_KEYS:
        if isinstance(out.get(key), str):
            out[key] = absolute(out[key], base_dir(key))
    command = out.get("command")
    try:
        words = shlex.split(command) if isinstance(command, str) else command
    except ValueError:
        words = None  # left for build_spec to report
    if isinstance(words, list | tuple) and words and isinstance(words[0], str):
        first = absolute(words[0], base_dir("command"), program=True)
        if first != words[0]:
            out["command"] = [first, *words[1:]]
    return out


def _size_field(value: object) -> int:
    return parse_size(value)


def _vram(value: object) -> VramSpec:
    if not isinstance(value, Mapping):
        return VramSpec(peak_mib=_field("vram", parse_size, value))
    figures: dict[str, int | None] = {}
    for key, item in value.items():
        if key not in VRAM_KEYS:
            raise FieldError(f"vram.{key}", unknown_key_message(key, VRAM_KEYS))
        figures[f"{key}_mib"] = None if item is None else _field(f"vram.{key}", parse_size, item)
    vram = VramSpec(**figures)
    if vram.peak_mib is not None and vram.weights_mib is not None:
        floor = vram.weights_mib + (vram.context_mib or 0)
        if vram.peak_mib < floor:
            raise FieldError(
                "vram.peak",
                f"peak {vram.peak_mib} MiB is below weights + context ({floor} MiB)",
            )
    return vram


_GPUS_HELP = "{value} is not a list of GPU indices (e.g. [0, 1], [host] or 'all')"
HOST_GPU = -1  # ``gpus: [host]``: the host device (``--gpus host``), whatever its index


def _gpu_item(item: object) -> object:
    """``host`` is the host device; anything else must be an index."""
    if isinstance(item, str) and item.strip().lower() == "host":
        return HOST_GPU
    if isinstance(item, str):
        try:
            return int(item)
        except ValueError:
            raise ValueError(_GPUS_HELP.format(value=brief(item))) from None
    return item


def _gpus(value: object) -> tuple[int, ...] | None:
    if isinstance(value, str):
        if value.strip().lower() in ("all", "any"):
            return None
        items: list[object] = [part.strip() for part in value.split(",")]
    elif isinstance(value, int) and not isinstance(value, bool):
        items = [value]
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise ValueError(_GPUS_HELP.format(value=brief(value)))
    if not items:
        raise ValueError("is empty (leave it out, or write 'all', to allow any GPU)")
    gpus: list[int] = []
    for item in items:
        index = HOST_GPU if isinstance(item, str) and _gpu_item(item) == HOST_GPU \
            else _int(_gpu_item(item), minimum=0)
        if index in gpus:
            raise ValueError(f"GPU {'host' if index == HOST_GPU else index} is listed twice")
        gpus.append(index)
    return tuple(gpus)


def _timeouts(value: object) -> Timeouts:
    mapping = _mapping(value, "timeouts (start, request, stop_grace, ping, idle)")
    for key in mapping:
        if key not in TIMEOUT_KEYS:
            raise FieldError(f"timeouts.{key}", unknown_key_message(key, TIMEOUT_KEYS))
    start = mapping.get("start")
    request = mapping.get("request")
    grace = mapping.get("stop_grace")
    ping = mapping.get("ping")
    start_s = (
        DEFAULT_START_TIMEOUT_S
        if start is None
        else _field("timeouts.start", parse_duration, start)
    )
    if start_s <= 0:
        raise FieldError("timeouts.start", f"{brief(start)} must be more than 0")
    request_s = _limit("timeouts.request", request, None)
    idle_s = _limit("timeouts.idle", mapping.get("idle"), DEFAULT_IDLE_TIMEOUT_S)
    stop_grace_s = (
        DEFAULT_STOP_GRACE_S
        if grace is None
        else _field("timeouts.stop_grace", parse_duration, grace)
    )
    ping_s = (
        DEFAULT_PING_TIMEOUT_S if ping is None else _field("timeouts.ping", parse_duration, ping)
    )
    if ping_s <= 0:
        raise FieldError("timeouts.ping", f"{brief(ping)} must be more than 0")
    return Timeouts(start_s=start_s, request_s=request_s, stop_grace_s=stop_grace_s,
                    ping_s=ping_s, idle_s=idle_s)


def _limit(key: str, value: object, default: float | None) -> float | None:
    """A limit that may be none: a duration, or ``none``/``never`` (None); ``default`` when
    not given."""
    if value is None:
        return default
    if isinstance(value, str) and value.lower() == "none":
        return None
    seconds = _field(key, _infinite_duration, value)
    if seconds <= 0:
        raise FieldError(key, f"{brief(value)} must be more than 0 (or 'never')")
    return None if math.isinf(seconds) else seconds


def _overuse(value: object) -> str:
    if value not in OVERUSE_POLICIES:
        raise ValueError(f"{brief(value)} is not one of {', '.join(OVERUSE_POLICIES)}")
    return str(value)


def _infinite_duration(value: object) -> float:
    return parse_duration(value, allow_infinite=True)


def _keep_alive(value: object) -> float:
    """A keep-alive; more than a year is 'never' (a file that loaded before still loads)."""
    seconds = _infinite_duration(value)
    return math.inf if seconds > MAX_KEEP_ALIVE_S else seconds


def _calibration(value: object) -> bytes | None:
    mapping = _mapping(value, "calibration settings (request)")
    for key in mapping:
        if key not in CALIBRATION_KEYS:
            raise FieldError(f"calibration.{key}", unknown_key_message(key, CALIBRATION_KEYS))
    request = mapping.get("request")
    if request is None:
        return None
    if isinstance(request, bytes):
        return request
    if isinstance(request, str):
        return request.encode("utf-8")
    try:
        return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise FieldError("calibration.request", f"cannot be sent as JSON: {exc}") from None


def _sleep(value: object) -> SleepSpec:
    if isinstance(value, bool):
        return SleepSpec(enabled=value)
    mapping = _mapping(value, "sleep settings (residual, host, level), or true/false")
    for key in mapping:
        if key not in SLEEP_KEYS:
            raise FieldError(f"sleep.{key}", unknown_key_message(key, SLEEP_KEYS))
    values: dict[str, Any] = {}
    for key in ("residual", "host"):
        if mapping.get(key) is not None:
            values[f"{key}_mib"] = _field(f"sleep.{key}", parse_size, mapping[key])
    level = mapping.get("level")
    if level is not None:
        if isinstance(level, bool) or level not in SLEEP_LEVELS:
            raise FieldError("sleep.level", f"{brief(level)} is not a sleep level (1: the "
                             "weights go to host memory; 2: they are dropped)")
        values["level"] = level
    return SleepSpec(**values)


def _protocol(value: object) -> str:
    if not isinstance(value, str) or value not in PROTOCOLS:
        known = ", ".join(PROTOCOLS)
        raise ValueError(f"{brief(value)} is not a worker protocol (one of: {known})")
    return value


def _names(value: object, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise FieldError(key, f"{brief(value)} is not a list of request keys")
    names: list[str] = []
    for item in value:
        if not isinstance(item, str) or not item:
            raise FieldError(key, f"{brief(item)} is not a request key")
        if item not in names:
            names.append(item)
    return tuple(names)


def _vramd_settings(value: object) -> VramdSettings:
    known = ", ".join(sorted(VRAMD_SETTING_KEYS))
    mapping = _mapping(value, f"vramd worker settings ({known})")
    for key in mapping:
        if key not in VRAMD_SETTING_KEYS:
            raise FieldError(f"vramd.{key}", unknown_key_message(key, VRAMD_SETTING_KEYS))
    values: dict[str, Any] = {}
    if mapping.get("load_keys") is not None:
        values["load_keys"] = _names(mapping["load_keys"], "vramd.load_keys")
    if mapping.get("shape_keys") is not None:
        values["shape_keys"] = _names(mapping["shape_keys"], "vramd.shape_keys")
    kwargs = mapping.get("load_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
            raise FieldError("vramd.load_kwargs", f"{brief(kwargs)} is not a mapping of names "
                             "to values")
        try:
            values["load_kwargs"] = json.loads(json.dumps(dict(kwargs)))
        except (TypeError, ValueError) as exc:
            raise FieldError("vramd.load_kwargs", f"cannot be sent as JSON: {exc}") from None
    timeout = mapping.get("event_timeout")
    if timeout is not None:
        seconds = _field("vramd.event_timeout", _infinite_duration, timeout)
        if seconds <= 0:
            raise FieldError("vramd.event_timeout", f"{brief(timeout)} must be more than 0 "
                             "(or 'never')")
        values["event_timeout_s"] = None if math.isinf(seconds) else seconds
    return VramdSettings(**values)


def _api(value: object) -> tuple[str, ...]:
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list | tuple) or not words:
        raise ValueError(f"{brief(value)} is not one of {', '.join(API_KINDS)} (or a list)")
    kinds: list[str] = []
    for word in words:
        if word not in API_KINDS:
            raise ValueError(f"{brief(word)} is not an API; use one of {', '.join(API_KINDS)}")
        if word not in kinds:
            kinds.append(word)
    return tuple(kinds)


def _model_name(value: object) -> str:
    if not isinstance(value, str) or not is_model_name(value):
        raise ValueError(f"{brief(value)} is not a model name (printable text, no blank at "
                         f"either end, up to {MAX_ALIAS} characters)")
    return value


def _aliases(value: object) -> tuple[str, ...]:
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list | tuple):
        raise ValueError(f"{brief(value)} is not a list of model names")
    names: list[str] = []
    for word in words:
        name = _model_name(word)
        if name not in names:
            names.append(name)
    return tuple(names)


def _env(value: object, environ: Mapping[str, str]) -> dict[str, str]:
    mapping = _mapping(value, "variable names to values")
    env: dict[str, str] = {}
    for key, item in mapping.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise FieldError(f"env.{key}", f"{key!r} is not an environment variable name")
        if item is None:
            continue
        if isinstance(item, Unusable):
            raise FieldError(f"env.{key}", item.message)
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise FieldError(f"env.{key}", f"{brief(item)} is not text (quote it, e.g. '1')")
        env[key] = _field(f"env.{key}", expand, str(item), environ)
    return env


def _field(name: str, convert: Callable[..., Any], *args: Any) -> Any:
    """Run a converter, turning its ValueError into a FieldError for ``name``."""
    try:
        return convert(*args)
    except FieldError:
        raise
    except ValueError as exc:
        raise FieldError(name, str(exc)) from None


def build_spec(
    name: str,
    data: Mapping[str, Any],
    *,
    base_dir: Callable[[str], Path],
    environ: Mapping[str, str] = os.environ,
    source: str = "",
) -> BackendSpec:
    """Validate one backend's merged mapping (YAML key spelling) into a ``BackendSpec``.

    ``base_dir(key)`` is the directory of the file that wrote ``key`` (for relative paths).
    ``None`` values mean "not set" (the default). Raises ``InvalidBackend`` with all errors.
    """
    errors: list[FieldError] = []
    values: dict[str, Any] = {}

    def take(key: str, attr: str, convert: Callable[..., Any], *args: Any) -> None:
        value = data.get(key)
        if value is None or isinstance(value, Unusable):
            return
        try:
            values[attr] = _field(key, convert, value, *args)
        except FieldError as exc:
            errors.append(exc)

    for key, value in data.items():
        if key not in TOP_KEYS:
            errors.append(FieldError(str(key), unknown_key_message(key, TOP_KEYS, VRAMD_KEY_HINTS)))
        elif isinstance(value, Unusable):
            errors.append(FieldError(str(key), value.message))

    if not NAME_RE.match(name):
        errors.append(
            FieldError("name", f"{name!r} is not a backend name (letters, digits, . _ -; up to 64)")
        )

    # An HTTP model server: its macros (${PORT} …) are filled in when it starts, not here.
    http_value = data.get("http")
    if http_value is not None and not isinstance(http_value, Unusable):
        try:
            values["http"] = parse_http(http_value, data.get("command"), data.get("env"))
        except FieldError as exc:
            errors.append(exc)
        environ = keep_macros(environ)

    # What to run.
    command, script, python = data.get("command"), data.get("script"), data.get("python")
    if command is not None and script is not None:
        errors.append(
            FieldError(
                "script",
                "give either 'command' or 'script', not both (an overlay can drop the other "
                "with 'command: null' or 'script: null')",
            )
        )
    elif isinstance(command, Unusable):
        pass  # reported above
    elif command is not None:
        take("command", "command", _command, base_dir("command"), environ)
        if python is not None:
            errors.append(FieldError("python", "'python' is only used with 'script'"))
    elif script is not None:
        try:
            script_path = _field("script", _path, script, base_dir("script"), environ)
            if not os.path.isfile(script_path):
                raise FieldError("script", f"worker script {script_path} does not exist")
            interpreter = sys.executable
            if python is not None:
                interpreter = _field("python", _path, python, base_dir("python"), environ)
                if not os.path.exists(interpreter):
                    raise FieldError("python", f"interpreter {interpreter} does not exist")
            values["command"] = (interpreter, "-m", "worker_sdk", script_path)
        except FieldError as exc:
            errors.append(exc)
    else:
        errors.append(FieldError("command", "nothing to run: give 'command' or 'script'"))

    run_key = "script" if script is not None else "command"
    cwd = data.get("cwd")
    if isinstance(cwd, Unusable):
        pass  # reported above
    elif cwd is None:
        values["cwd"] = base_dir(run_key)
    else:
        try:
            cwd_path = _field("cwd", _path, cwd, base_dir("cwd"), environ)
            if not os.path.isdir(cwd_path):
                raise FieldError("cwd", f"directory {cwd_path} does not exist")
            values["cwd"] = Path(cwd_path)
        except FieldError as exc:
            errors.append(exc)

    take("env", "env", _env, environ)
    take("vram", "vram", _vram)
    take("safety", "safety_mib", _size_field)
    take("priority", "priority", lambda v: _int(v, minimum=PRIORITY_MIN, maximum=PRIORITY_MAX))
    take("gpus", "gpus", _gpus)
    take("keep_alive", "keep_alive_s", _keep_alive)
    take("pinned", "pinned", _bool)
    take("preload", "preload", _bool)
    take("unlisted", "unlisted", _bool)
    take("stream", "stream", _bool)
    take("inline_results", "inline_results", _bool)
    take("concurrency", "concurrency", lambda v: _int(v, minimum=1, maximum=MAX_CONCURRENCY))
    take("timeouts", "timeouts", _timeouts)
    take("calibration", "calibration_request", _calibration)
    take("reload_cost", "reload_cost_s", parse_duration)
    take("wake_cost", "wake_cost_s", parse_duration)
    take("target_wait", "target_wait_s", parse_duration)
    take("sleep", "sleep", _sleep)
    take("description", "description", _str)
    take("simulated", "simulated", _bool)
    take("on_overuse", "on_overuse", _overuse)
    take("protocol", "protocol", _protocol)
    take("unload_frees_vram", "unload_frees_vram", _bool)
    take("vramd", "vramd", _vramd_settings)
    if values.get("protocol", "vramtui") == "vramd":
        # vramd's worker loop runs one generate at a time and has no stream of chunks.
        if values.get("concurrency", 1) > 1:
            errors.append(FieldError("concurrency", "a vramd worker runs one request at a "
                                     "time: leave 'concurrency' out (or 1)"))
        if values.get("stream"):
            errors.append(FieldError("stream", "a vramd worker does not stream: its result "
                                     "comes whole, at the end (leave 'stream' out)"))
    elif data.get("vramd") is not None:
        errors.append(FieldError("vramd", "settings for a vramd worker: they go with "
                                 "'protocol: vramd'"))
    if http_value is not None:
        vram = values.get("vram")
        if isinstance(vram, VramSpec) and vram.peak_mib is not None \
                and vram.weights_mib is None and vram.activation_mib is None:
            # A model server's one figure is all of it, its slots included: llama-server,
            # vLLM and SGLang take the memory of every slot as they start, so a request adds
            # none (taken per request, it let 3 of llama-server's 4 slots run on 24 GiB).
            values["vram"] = replace(vram, activation_mib=0)
        if script is not None:
            errors.append(FieldError("script", "an http: backend runs a server: give its "
                                     "'command' (e.g. [llama-server, --port, '${PORT}']), "
                                     "not a worker 'script'"))
        if values.get("protocol", "vramtui") != "vramtui":
            errors.append(FieldError("protocol", "an http: backend speaks HTTP: leave "
                                     "'protocol' out"))
    elif isinstance(data.get("timeouts"), Mapping) and data["timeouts"].get("idle") is not None:
        errors.append(FieldError("timeouts.idle", "the silence of a model server's answer "
                                 "(an http: backend); a worker that stops answering is hung "
                                 "after timeouts.ping (vramd's: vramd.event_timeout): leave "
                                 "'idle' out"))
    take("api", "api", _api)
    take("aliases", "aliases", _aliases)
    take("listed_as", "listed_as", _model_name)
    listed = values.get("listed_as")
    if listed is not None and listed != name and listed not in values.get("aliases", ()):
        errors.append(FieldError("listed_as", f"{brief(listed)} is neither its name nor one "
                                 "of its aliases: add it to aliases"))

    if errors:
        raise InvalidBackend(errors)
    if "description" in values:  # shown on terminals by every face: nothing in it acts there
        values["description"] = visible(values["description"].strip(), lines=True)
    return BackendSpec(name=name, source=source, **values)
