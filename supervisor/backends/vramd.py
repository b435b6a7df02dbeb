"""Reading vramd's descriptor format (``version: 2``) as our own, as vramd 0.3.9 reads it.

One vramd backend entry becomes one entry in our spelling, each key keeping its line:

- ``vram_mib`` → ``vram.peak``; vramd's measured ``vram:`` block (``weights_gib``,
  ``activation_gib``, ``context_gib``, ``peak_mib``, ``admit_peak_mib``) → ``vram.weights`` /
  ``activation`` / ``context`` / ``peak`` (weights + context resident, activation on top), and
  its ``safety_mib`` → ``safety``; without one, vramd's margin ($VRAMD_VRAM_SAFETY_MIB, 384 MiB).
- ``runtime.command`` with ``${env:VAR}`` and ``${monorepo:tool}`` expanded (``vramd_tools``),
  relative paths resolved against the working directory, as vramd does (the one the engine
  started in, or ``runtime.cwd``) — and, when the path exists only there, against the file's
  folder, with a warning saying so; ``tool:``/``runtime.monorepo_tool`` without a command →
  the tool's venv under $VRAMD_TOOLS_ROOT; ``runtime.env`` expanded likewise (an unset variable
  drops that entry, as in vramd, with a warning); ``runtime.cwd`` (default: the working
  directory); ``runtime.load_timeout_sec`` → ``timeouts.start`` (default vramd's 300 s).
- The worker speaks vramd's JSON lines (``protocol: vramd``) unless its command runs one of
  ours (``-m worker_sdk``, ``-m verda_io``); ``load_keys``, ``shape_keys``,
  ``calibrate_load_kwargs`` and ``runtime.event_timeout_sec`` → ``vramd.*``;
  ``peak_profile.unload_frees_vram`` → ``unload_frees_vram``.
- ``calibrate_request`` → ``calibration.request``, ``gpu_ids`` → ``gpus``; keys that are ours
  too (``priority``, ``keep_alive`` …) pass through.
- What vramd reads and vramtui cannot honour (``footprint_key``, the ``peak_profile`` hints,
  unknown keys) gets a one-line warning naming the key; the records of a measurement
  (``measured:``, ``peak_profile.load_kwargs``/``staged_load``/``load_bound``) and ``adapter``
  (vramd's in-process mode, unused when a worker is declared) are read silently.

A value that cannot be made sense of becomes ``Unusable`` in place of our key, so that
validation reports it at its line and a later layer can still replace it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import brief
from ..units import mib_from_gib
from .errors import DescriptorWarning
from .schema import TOP_KEYS, Unusable
from .vramd_tools import (
    Unresolved,
    escape_dollars,
    expand_home,
    interpolate,
    is_our_worker,
    tool_command,
)
from .yamlio import LinedDict

VRAMD_VERSION = 2
VRAMD_LOAD_TIMEOUT_S = 300.0  # vramd's DEFAULT_LOAD_TIMEOUT_SEC
VRAMD_SAFETY_MIB = 384  # vramd's DEFAULT_VRAM_SAFETY_MIB
SAFETY_ENV = "VRAMD_VRAM_SAFETY_MIB"
EVENT_TIMEOUT_ENV = "VRAMD_EVENT_TIMEOUT_SEC"

RUNTIME_KEYS = frozenset({"command", "monorepo_tool", "cwd", "env", "load_timeout_sec",
                          "event_timeout_sec"})
MEASURED_VRAM_KEYS = {"weights_gib": "weights", "activation_gib": "activation",
                      "context_gib": "context"}
# peak_profile: what vramd's calibration records (read, nothing to do) …
PROFILE_RECORDS = frozenset({"load_kwargs", "staged_load", "load_bound"})
# … and vramd's own keys, translated or warned about one by one.
VRAMD_KEYS = frozenset({"name", "adapter", "vram_mib", "priority", "footprint_key", "tool",
                        "runtime", "load_keys", "shape_keys", "vram", "peak_profile",
                        "calibrate_request", "calibrate_load_kwargs", "measured", "gpu_ids"})


@dataclass(frozen=True)
class VramdContext:
    """What reading a vramd file depends on besides the file."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    # The working directory relative paths resolve against (vramd's: where it was started).
    workdir: Path | None = None
    # Write ``${env:VAR}`` as our ``${VAR}`` (read when our loader runs), not its value now.
    keep_env: bool = False


def from_vramd(entry: Mapping[Any, Any], file: Path,
               ctx: VramdContext) -> tuple[LinedDict, list[DescriptorWarning]]:
    """Our form of one vramd v2 backend entry, and the warnings about it."""
    translator = _Translator(entry, file, ctx)
    translator.run()
    return translator.out, translator.warnings


def _line(source: Any, key: Any) -> int | None:
    return source.key_line(key) if isinstance(source, LinedDict) else None


def _lined(line: int | None) -> LinedDict:
    return LinedDict(line=line)


def _mib(gib: Any) -> Any:
    """GiB as written by vramd calibrate → whole MiB, rounded up (the safe side)."""
    if isinstance(gib, bool) or not isinstance(gib, int | float):
        return gib  # left for validation to say what is wrong
    return mib_from_gib(gib)


def _seconds(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


class _Translator:
    def __init__(self, entry: Mapping[Any, Any], file: Path, ctx: VramdContext) -> None:
        self.entry = entry
        self.file = file
        self.ctx = ctx
        self.environ = ctx.environ
        name = entry.get("name")
        self.name = name if isinstance(name, str) else None
        self.out = LinedDict(line=entry.line if isinstance(entry, LinedDict) else None)
        self.warnings: list[DescriptorWarning] = []
        runtime = entry.get("runtime")
        self.runtime: Mapping[Any, Any] = runtime if isinstance(runtime, Mapping) else {}
        tool = entry.get("tool")
        mono = self.runtime.get("monorepo_tool")
        self.tool: str | None = (mono if isinstance(mono, str) and mono else
                                 tool if isinstance(tool, str) and tool else None)
        self.file_dir = file.parent
        self.workdir = ctx.workdir

    # -- helpers ------------------------------------------------------------------------------
    def warn(self, key: str, line: int | None, message: str) -> None:
        self.warnings.append(DescriptorWarning(self.file, line, key, self.name, message))

    def put(self, target: LinedDict, key: str, value: Any, line: int | None) -> None:
        target[key] = value
        if line is not None:
            target.key_lines[key] = line

    def sub(self, key: str, line: int | None) -> LinedDict:
        """Our mapping ``key`` of the output (created at ``line`` when new)."""
        existing = self.out.get(key)
        if isinstance(existing, LinedDict) and existing is not self.entry.get(key):
            return existing  # made here already
        made = _lined(existing.line if isinstance(existing, LinedDict) else line)
        if isinstance(existing, Mapping):  # our own key, passed through: copied, not changed
            made.update(existing)
            if isinstance(existing, LinedDict):
                made.key_lines.update(existing.key_lines)
        self.put(self.out, key, made, _line(self.entry, key) if key in self.entry else line)
        return made

    def text(self, value: Any) -> tuple[str, str]:
        """``(ours, value)`` of a string field (may raise ``Unresolved``)."""
        return interpolate(str(value), self.environ, tool=self.tool, keep_env=self.ctx.keep_env)

    def ours_for(self, ours: str, text: str, final: str, moved: bool) -> str:
        """What to write for a path whose resolved value is ``final``."""
        if self.ctx.keep_env and not moved and (not text.startswith("~") or text == "~"
                                                or text.startswith("~/")):
            return ours
        return escape_dollars(final)

    def locate(self, path: str, base: Path, key: str, line: int | None,
               want_dir: bool = False) -> str | None:
        """``path`` (relative) found against ``base`` (vramd's way) or else the file's folder."""
        exists = os.path.isdir if want_dir else os.path.exists
        first = os.path.normpath(os.path.join(base, path))
        if exists(first):
            return first
        second = os.path.normpath(os.path.join(self.file_dir, path))
        if second != first and exists(second):
            self.warn(key, line, f"{path} is not in the working directory ({base}), where "
                      f"vramd looks: using the one in the file's folder, {second}")
            return second
        return None

    # -- the entry ----------------------------------------------------------------------------
    def run(self) -> None:
        entry = self.entry
        if "name" in entry:
            self.put(self.out, "name", entry["name"], _line(entry, "name"))
        passthrough = {k: v for k, v in entry.items()
                       if k in TOP_KEYS and k not in ("name", "vram")}
        for key, value in passthrough.items():
            self.put(self.out, str(key), value, _line(entry, key))
        for key in entry:
            if key not in VRAMD_KEYS and key not in TOP_KEYS:
                self.warn(str(key), _line(entry, key),
                          "not a vramd key vramtui knows: ignored")
        if "gpu_ids" in entry:
            self.put(self.out, "gpus", entry["gpu_ids"], _line(entry, "gpu_ids"))
        if "calibrate_request" in entry:
            line = _line(entry, "calibrate_request")
            self.put(self.sub("calibration", line), "request", entry["calibrate_request"], line)
        if "footprint_key" in entry:
            self.warn("footprint_key", _line(entry, "footprint_key"),
                      "vramd's table of model footprints is not used here: the backend is "
                      "sized from vram_mib (or its measured vram: block); measure it with "
                      f"`vramtui calibrate {self.name or 'NAME'}`")
        defines = self.translate_runtime()
        self.translate_vram(defines)
        self.translate_profile()
        self.translate_worker_settings()

    def translate_runtime(self) -> bool:
        """The worker's command, cwd, env and timeouts; True when this entry says what to run."""
        entry, runtime = self.entry, self.runtime
        line = _line(entry, "runtime")
        if "runtime" in entry and entry["runtime"] is not None \
                and not isinstance(entry["runtime"], Mapping):
            self.put(self.out, "command", Unusable(
                f"runtime: {brief(entry['runtime'])} is not a mapping (command, cwd, env, "
                "load_timeout_sec …)"), line)
            return True
        for key in runtime:
            if key not in RUNTIME_KEYS:
                self.warn(f"runtime.{key}", _line(runtime, key),
                          "not a vramd runtime key vramtui knows: ignored")
        base = self.translate_cwd()
        command = runtime.get("command")
        defines = bool(command) or self.tool is not None or any(
            k in entry for k in ("command", "script"))
        if command:
            self.translate_command(command, base, _line(runtime, "command"))
        elif self.tool is not None and "command" not in entry and "script" not in entry:
            tool_line = _line(runtime, "monorepo_tool") if "monorepo_tool" in runtime \
                else _line(entry, "tool")
            try:
                argv = tool_command(self.tool, self.environ)
            except Unresolved as exc:
                self.put(self.out, "command", Unusable(str(exc)), tool_line)
            else:
                self.put(self.out, "command", [escape_dollars(w) for w in argv], tool_line)
                self.protocol_for(argv, tool_line)
        elif "adapter" in entry and "command" not in entry and "script" not in entry:
            self.put(self.out, "command", Unusable(
                f"adapter {brief(entry['adapter'])} is vramd's in-process mode, which vramtui "
                "does not run: give runtime.command (a worker that calls vramd's "
                "run_worker_loop) or tool:"), _line(entry, "adapter"))
            return True
        elif "command" in entry or "script" in entry:
            words = entry.get("command")
            argv = [str(w) for w in words] if isinstance(words, list) else \
                str(words or "").split()
            self.protocol_for(argv, _line(entry, "command" if "command" in entry else "script"),
                              ours="script" in entry)
        if defines:
            self.protocol_for([], line)  # a command that could not be read: still vramd's
            if "cwd" not in self.out and base is not None:
                self.put(self.out, "cwd", escape_dollars(str(base)), line)
            if "env" in runtime:
                self.translate_env(runtime["env"], _line(runtime, "env"))
            self.translate_timeouts()
        elif "env" in runtime:
            self.translate_env(runtime["env"], _line(runtime, "env"))
        return defines

    def translate_cwd(self) -> Path | None:
        """vramd's worker cwd (runtime.cwd, else the working directory), put as our ``cwd``."""
        runtime = self.runtime
        if not runtime.get("cwd"):
            if self.workdir is None:
                self.warn("runtime", _line(self.entry, "runtime"),
                          "the working directory is unknown (removed?): relative paths are "
                          "taken from the file's folder")
                return self.file_dir
            return self.workdir
        line = _line(runtime, "cwd")
        raw = runtime["cwd"]
        try:
            ours, value = self.text(raw)
        except Unresolved as exc:
            self.put(self.out, "cwd", Unusable(f"runtime.cwd: {exc}"), line)
            return None
        value = expand_home(value, self.environ)
        if os.path.isabs(value):
            final = os.path.normpath(value)
            moved = False
        else:
            base = self.workdir or self.file_dir
            found = self.locate(value, base, "runtime.cwd", line, want_dir=True)
            final = found or os.path.normpath(os.path.join(base, value))
            moved = True
        self.put(self.out, "cwd", self.ours_for(ours, str(raw), final, moved), line)
        return Path(final)

    def translate_command(self, command: Any, base: Path | None, line: int | None) -> None:
        if isinstance(command, str):
            words: list[Any] = [command]  # vramd: a string is one word, not a command line
        elif isinstance(command, list):
            words = list(command)
        else:
            self.put(self.out, "command", Unusable(
                f"runtime.command: {brief(command)} is not a list of words"), line)
            return
        argv: list[str] = []
        resolved: list[str] = []
        for i, word in enumerate(words):
            if isinstance(word, bool) or not isinstance(word, str | int | float):
                self.put(self.out, "command", Unusable(
                    f"runtime.command: {brief(word)} is not a word of a command line"), line)
                return
            try:
                ours, value = self.text(word)
            except Unresolved as exc:
                self.put(self.out, "command", Unusable(f"runtime.command: {exc}"), line)
                return
            value = expand_home(value, self.environ)
            final, moved = value, False
            previous = str(words[i - 1]) if i else ""
            candidate = (i == 0 and "/" in value) or (
                i > 0 and not value.startswith("-") and previous not in ("-m", "-c")
                and ("/" in value or value.endswith(".py")))
            if candidate and not os.path.isabs(value) and base is not None:
                found = self.locate(value, base, "runtime.command", line)
                if found is not None:
                    final, moved = found, True
                elif i == 0 or value.endswith(".py"):
                    what = "program" if i == 0 else "worker script"
                    self.put(self.out, "command", Unusable(
                        f"{what} {value} does not exist (looked in the working directory "
                        f"{base}, as vramd does, and in the file's folder {self.file_dir})"),
                        line)
                    return
            argv.append(self.ours_for(ours, str(word), final, moved))
            resolved.append(final)
        self.put(self.out, "command", argv, line)
        self.protocol_for(resolved, line)

    def protocol_for(self, argv: list[str], line: int | None, ours: bool = False) -> None:
        if "protocol" in self.out:
            return
        ours = ours or is_our_worker(argv)
        self.put(self.out, "protocol", "vramtui" if ours else "vramd", line)

    def translate_env(self, env: Any, line: int | None) -> None:
        if not isinstance(env, Mapping):
            self.put(self.out, "env", Unusable(f"runtime.env: {brief(env)} is not a mapping of "
                                               "variable names to values"), line)
            return
        target = self.sub("env", line)
        for key, raw in env.items():
            key_line = _line(env, key)
            if raw is None:
                self.put(target, str(key), None, key_line)
                continue
            try:
                ours, value = self.text(raw)
            except Unresolved as exc:
                # vramd leaves such a variable out of the worker's environment.
                self.warn(f"runtime.env.{key}", key_line, f"{exc}: {key} is left out of the "
                          "worker's environment, as vramd does")
                continue
            final = expand_home(value, self.environ)
            self.put(target, str(key), self.ours_for(ours, str(raw), final, False), key_line)

    def translate_timeouts(self) -> None:
        runtime = self.runtime
        timeouts = self.sub("timeouts", _line(self.entry, "runtime"))
        if "start" in timeouts:
            return
        if runtime.get("load_timeout_sec") is not None:
            line = _line(runtime, "load_timeout_sec")
            self.put(timeouts, "start", _seconds(runtime["load_timeout_sec"]), line)
        else:
            timeouts["start"] = VRAMD_LOAD_TIMEOUT_S

    # -- memory -------------------------------------------------------------------------------
    def translate_vram(self, defines: bool) -> None:
        entry = self.entry
        vram = self.sub("vram", _line(entry, "vram") or _line(entry, "vram_mib")) \
            if ("vram" in entry or "vram_mib" in entry) else None
        estimate = entry.get("vram_mib")
        measured = entry.get("vram")
        safety_line = None
        safety: Any = None
        if isinstance(measured, Mapping):
            parts: dict[str, Any] = {}
            peak: Any = None
            admit_peak: Any = None
            for key, value in measured.items():
                key_line = _line(measured, key)
                if key in MEASURED_VRAM_KEYS:
                    parts[MEASURED_VRAM_KEYS[key]] = (_mib(value), key_line)
                elif key == "peak_mib":
                    peak = (value, key_line)
                elif key == "admit_peak_mib":
                    admit_peak = (value, key_line)
                elif key == "safety_mib":
                    safety, safety_line = value, key_line
                elif key in ("peak", "weights", "activation", "context"):
                    parts[key] = (value, key_line)  # our spelling, passed as written
                else:
                    self.warn(f"vram.{key}", key_line, "not a figure of vramd's measured vram: "
                              "block that vramtui knows: ignored")
            assert vram is not None
            for key, (value, key_line) in parts.items():
                self.put(vram, key, value, key_line)
            if "peak" not in parts:
                if peak is not None:
                    self.put(vram, "peak", self.floor_peak(peak[0], parts, peak[1]), peak[1])
                elif admit_peak is not None and isinstance(admit_peak[0], int) and \
                        isinstance(safety, int):
                    self.put(vram, "peak", max(0, admit_peak[0] - safety), admit_peak[1])
                elif "weights" in parts and "activation" in parts:
                    # weights + activation + context is the peak: a vram_mib of an earlier
                    # layer (or of this entry) must not win over the measured parts.
                    self.put(vram, "peak", None, _line(entry, "vram"))
                elif estimate is not None:
                    self.put(vram, "peak", estimate, _line(entry, "vram_mib"))
        elif measured is not None:
            assert vram is not None
            self.put(vram, "peak", measured, _line(entry, "vram"))  # "vram: 6GiB": the peak
        elif estimate is not None:
            assert vram is not None
            self.put(vram, "peak", estimate, _line(entry, "vram_mib"))
        if "safety" in self.out:
            return
        if safety is not None:
            self.put(self.out, "safety", safety, safety_line)
        elif defines:
            self.put(self.out, "safety", self.default_safety(), _line(entry, "runtime"))

    def floor_peak(self, peak: Any, parts: dict[str, Any], line: int | None) -> Any:
        """A measured peak below weights + context by rounding is raised to it."""
        weights = parts.get("weights", (None, None))[0]
        context = parts.get("context", (0, None))[0]
        if not all(isinstance(v, int) and not isinstance(v, bool)
                   for v in (peak, weights, context)):
            return peak
        floor = weights + context
        if peak < floor:
            if floor - peak > 16:
                self.warn("vram.peak_mib", line, f"{peak} MiB is below weights + context "
                          f"({floor} MiB): using {floor} MiB")
            return floor
        return peak

    def default_safety(self) -> int:
        raw = self.environ.get(SAFETY_ENV, "").strip()
        try:
            return max(0, int(raw)) if raw else VRAMD_SAFETY_MIB
        except ValueError:
            return VRAMD_SAFETY_MIB

    def translate_profile(self) -> None:
        profile = self.entry.get("peak_profile")
        if profile is None:
            return
        if not isinstance(profile, Mapping):
            self.warn("peak_profile", _line(self.entry, "peak_profile"),
                      f"{brief(profile)} is not a mapping: ignored")
            return
        for key, value in profile.items():
            line = _line(profile, key)
            if key == "unload_frees_vram":
                self.put(self.out, "unload_frees_vram", value, line)
            elif key == "quant_mode":
                if value not in (None, "none"):
                    self.warn("peak_profile.quant_mode", line,
                              f"the vram: figures were measured with quant_mode {value!r}; "
                              "vramtui uses them for every request, whatever quantization "
                              "it asks for")
            elif key not in PROFILE_RECORDS:
                self.warn(f"peak_profile.{key}", line, "a hint vramd adjusts its estimates "
                          "with; vramtui does not: ignored (the figures are used as written)")

    # -- the vramd worker ---------------------------------------------------------------------
    def translate_worker_settings(self) -> None:
        entry, runtime = self.entry, self.runtime
        settings: list[tuple[str, str, Any, int | None]] = []
        for key in ("load_keys", "shape_keys"):
            if entry.get(key):
                value = entry[key]
                value = [str(k) for k in value] if isinstance(value, list) else value
                settings.append((key, key, value, _line(entry, key)))
        if entry.get("calibrate_load_kwargs"):
            settings.append(("calibrate_load_kwargs", "load_kwargs",
                             entry["calibrate_load_kwargs"], _line(entry,
                                                                   "calibrate_load_kwargs")))
        if runtime.get("event_timeout_sec") is not None:
            settings.append(("runtime.event_timeout_sec", "event_timeout",
                             _seconds(runtime["event_timeout_sec"]),
                             _line(runtime, "event_timeout_sec")))
        elif self.out.get("protocol") == "vramd":
            raw = self.environ.get(EVENT_TIMEOUT_ENV, "").strip()
            try:
                seconds = float(raw) if raw else None
            except ValueError:
                seconds = None
            if seconds is not None and seconds > 0:
                settings.append((EVENT_TIMEOUT_ENV, "event_timeout", seconds, None))
        if not settings:
            return
        if self.out.get("protocol", "vramd") != "vramd":
            for vramd_key, _ours, _value, line in settings:
                if vramd_key != EVENT_TIMEOUT_ENV:
                    self.warn(vramd_key, line, "not used: this worker speaks vramtui's own "
                              "protocol, not vramd's")
            return
        target = self.sub("vramd", settings[0][3])
        for _vramd_key, ours, value, line in settings:
            self.put(target, ours, value, line)
