"""Loading backend descriptors from layers of files into validated ``BackendSpec`` objects.

A layer is a file or a directory (its ``*.yaml``/``*.yml`` in name order). Later layers override
single keys of earlier ones; ``extends: other`` inherits from another backend once all layers
are merged. An entry marked ``overlay: true`` (what calibration writes) only changes a backend
that another entry defines: it never counts as configuration of its own, so it layers over
the demo backends as over any others, and one whose backend is gone is reported, not run.
Every problem becomes a ``DescriptorError`` in ``LoadResult.errors`` (the faulty
backend is left out, the others load); nothing here raises for bad configuration.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import brief
from ..paths import backends_dir_of
from .errors import DescriptorError, DescriptorWarning
from .raw import RawBackend, entries_of, entry_name
from .schema import BackendSpec, InvalidBackend, build_spec
from .vramd import VramdContext
from .yamlio import load_documents

BACKENDS_ENV = "VRAMTUI_BACKENDS"
YAML_SUFFIXES = (".yaml", ".yml")
# What whoever writes a descriptor gets (a file another user could have written is not read).
STAKES = "runs commands as you (a descriptor says what the engine runs)"
# Read here, never inherited nor validated there.
_LOADER_KEYS = ("extends", "abstract", "enabled", "overlay")


@dataclass(frozen=True)
class LoadResult:
    """The backends that loaded, every error met, the files read (in order), and warnings:
    what loaded but is not honoured (vramd keys vramtui has no use for, a path found only in
    the file's folder)."""

    backends: dict[str, BackendSpec] = field(default_factory=dict)
    errors: tuple[DescriptorError, ...] = ()
    layers: tuple[Path, ...] = ()
    demo: bool = False  # the configuration was empty and the demo backends were loaded instead
    warnings: tuple[DescriptorWarning, ...] = ()


def packaged_defaults_dir() -> Path:
    """Descriptors shipped inside the package (the first layer); may be empty or missing."""
    return Path(__file__).resolve().parent / "defaults"


def demo_backends_dir() -> Path | None:
    """The repository's ``examples/demo/`` (simulated demo backends), or ``None`` if absent."""
    import supervisor

    package_file = getattr(supervisor, "__file__", None)
    root = Path(package_file).parents[1] if package_file else Path(__file__).resolve().parents[2]
    demo = root / "examples" / "demo"
    return demo if demo.is_dir() else None


def _expand_user(path: str | Path, environ: Mapping[str, str]) -> Path:
    text = os.fspath(path)
    if text == "~" or text.startswith("~/"):
        home = environ.get("HOME") or os.path.expanduser("~")
        text = home + text[1:]
    return Path(text)


def default_layers(
    config_dir: str | Path,
    extra: Sequence[str | Path] = (),
    environ: Mapping[str, str] = os.environ,
) -> list[Path]:
    """The standard layer list, lowest first.

    Packaged defaults (if present), then each path of ``$VRAMTUI_BACKENDS`` (``os.pathsep``
    separated), then ``extra`` (the ``backends=`` argument), then ``config_dir/backends.d``
    (if present). Paths named explicitly are kept even when missing, so that loading reports them.
    """
    layers: list[Path] = []
    defaults = packaged_defaults_dir()
    if defaults.is_dir():
        layers.append(defaults)
    layers.extend(named_layers(extra, environ))
    user_dir = backends_dir_of(config_dir)
    if user_dir.is_dir():
        layers.append(user_dir)
    return layers


def named_layers(extra: Sequence[str | Path] = (),
                 environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The layers the user named: each path of ``$VRAMTUI_BACKENDS``, then ``extra`` (the
    ``--backends`` files). Only when there is none may an empty configuration be replaced
    by the demo backends: a file named and empty means no backends."""
    named = [_expand_user(item.strip(), environ)
             for item in environ.get(BACKENDS_ENV, "").split(os.pathsep) if item.strip()]
    return named + [_expand_user(item, environ) for item in extra]


def folder_files(folder: Path) -> list[Path]:
    """The descriptor files of a folder layer: its ``*.yaml``/``*.yml`` entries in name order,
    dotfiles left out (an editor's swap file is none); OSError when it cannot be listed.
    Whatever is so named is one, a file or not: a dangling link, a folder or a FIFO named
    ``x.yaml`` is then said to be no descriptor file, where it was passed over unsaid."""
    return [child for child in sorted(folder.iterdir(), key=lambda p: p.name)
            if child.suffix in YAML_SUFFIXES and not child.name.startswith(".")]


def working_directory() -> Path | None:
    """The process's working directory (where vramd resolves relative paths), None if gone."""
    try:
        return Path(os.getcwd())
    except OSError:
        return None


def load_backends(
    paths: Sequence[str | Path],
    *,
    environ: Mapping[str, str] = os.environ,
    demo_fallback: bool = True,
    workdir: Path | None = None,
    keep_demo: bool = False,
) -> LoadResult:
    """Load and validate the backends of ``paths`` (layers, lowest first).

    When nothing at all was found (no backend entry, no error) and ``demo_fallback`` is set,
    the demo backends of ``demo_backends_dir()`` are loaded instead and ``demo`` is true
    (callers set it only when no layer was named, ``named_layers``, at start, or while the
    demo runs: a reload never brings it in).
    ``keep_demo`` (a reload while the demo runs): also when the files have errors and not one
    backend of theirs loads, every path named being there — a first file that fails to load
    never takes the demo away (its errors are still reported).
    ``workdir`` is where relative paths of vramd files resolve (default: the working directory).
    """
    vramd = VramdContext(environ=environ, workdir=workdir or working_directory())
    collector = _Collector(environ, vramd)
    for path in paths:
        collector.add_path(path)
    # read before finish(): an overlay alone (a calibration of a demo backend) is no error yet
    nothing_read = collector.entries == 0 and not collector.errors
    result = collector.finish()
    broken_only = keep_demo and bool(result.errors) and not result.backends \
        and not collector.missing
    if demo_fallback and (nothing_read or broken_only):
        demo_dir = demo_backends_dir()
        if demo_dir is not None:
            # The demo is the base layer; overlays (calibrations of demo backends) go on it.
            demo = _Collector(environ, vramd)
            demo.add_path(demo_dir)
            for path in paths:
                demo.add_path(path)
            return demo.finish(demo=True)
    return result


class _Collector:
    """Reads layers into raw backends, then resolves ``extends`` and validates."""

    def __init__(self, environ: Mapping[str, str], vramd: VramdContext | None = None) -> None:
        self.environ = environ
        self.vramd = vramd or VramdContext(environ=environ, workdir=working_directory())
        self.raws: dict[str, RawBackend] = {}
        self.errors: list[DescriptorError] = []
        self.warnings: list[DescriptorWarning] = []
        self.resolved: dict[str, RawBackend] = {}  # after finish(): each backend's mapping
        self.files: list[Path] = []
        self.entries = 0  # entries that define a backend (overlays do not count)
        self.defined: set[str] = set()
        self.missing = False  # a layer named explicitly could not be read at all

    # -- reading -----------------------------------------------------------------------------
    def add_path(self, path: str | Path) -> None:
        layer = Path(os.path.abspath(_expand_user(path, self.environ)))
        if layer.is_dir():
            try:
                children = folder_files(layer)
            except OSError as exc:
                self.missing = True
                self.errors.append(
                    DescriptorError(layer, None, None, None, f"cannot list: {exc.strerror}")
                )
                return
            for child in children:
                self.add_file(child)
        elif layer.exists():
            self.add_file(layer)
        else:
            self.missing = True
            self.errors.append(
                DescriptorError(layer, None, None, None, "no such file or directory")
            )

    def add_file(self, file: Path) -> None:
        self.files.append(file)
        try:
            documents = load_documents(file, STAKES)
        except DescriptorError as exc:
            self.errors.append(exc)
            return
        first_line: dict[str, int | None] = {}
        for document in documents:
            for item in entries_of(document, file, self.vramd):
                if isinstance(item, DescriptorWarning):
                    self.warnings.append(item)
                    continue
                if isinstance(item, DescriptorError):
                    self.errors.append(item)
                    continue
                entry, line = item
                name = entry_name(entry, file, line)
                if isinstance(name, DescriptorError):
                    self.entries += 1
                    self.errors.append(name)
                    continue
                if entry.get("overlay") is not True:
                    self.entries += 1
                    self.defined.add(name)
                if name in first_line:
                    self.errors.append(
                        DescriptorError(
                            file,
                            line,
                            None,
                            name,
                            f"defined twice in this file (first at line {first_line[name]}); "
                            f"this one is ignored",
                        )
                    )
                    continue
                first_line[name] = line
                layer = RawBackend.from_entry(name, entry, file)
                earlier = self.raws.get(name)
                self.raws[name] = earlier.merged_with(layer) if earlier else layer

    # -- resolving and validating ------------------------------------------------------------
    def finish(self, *, demo: bool = False) -> LoadResult:
        resolved: dict[str, RawBackend] = {}
        failed: set[str] = set()
        for name in self.raws:
            self._resolve(name, [], resolved, failed)
        self.resolved = resolved
        backends: dict[str, BackendSpec] = {}
        for name in self.raws:
            raw = resolved.get(name)
            if raw is None:
                continue
            if name not in self.defined:
                self._error(raw, "overlay", "only an overlay mentions this backend: the backend "
                            "it changes is not configured (any more); remove the file or "
                            "configure the backend")
                continue
            spec = self._build(raw)
            if spec is not None:
                backends[name] = spec
        return LoadResult(backends, tuple(self.errors), tuple(self.files), demo,
                          tuple(self.warnings))

    def _error(self, raw: RawBackend, key: str, message: str) -> None:
        origin = raw.origin_of(key)
        self.errors.append(DescriptorError(origin.file, origin.line, key, raw.name, message))

    def _resolve(
        self, name: str, chain: list[str], resolved: dict[str, RawBackend], failed: set[str]
    ) -> RawBackend | None:
        if name in resolved:
            return resolved[name]
        if name in failed:
            return None
        raw = self.raws[name]
        parent_name = raw.data.get("extends")
        if parent_name is None:
            resolved[name] = raw
            return raw
        if not isinstance(parent_name, str):
            self._error(raw, "extends", f"{parent_name!r} is not a backend name")
            failed.add(name)
            return None
        path = [*chain, name]
        if parent_name in path:
            cycle = [*path[path.index(parent_name) :], parent_name]
            text = " -> ".join(cycle)
            for member in cycle[:-1]:
                self._error(self.raws[member], "extends", f"'extends' loops: {text}")
                failed.add(member)
            return None
        if parent_name not in self.raws:
            close = difflib.get_close_matches(parent_name, list(self.raws), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self._error(raw, "extends", f"there is no backend {parent_name!r}{hint}")
            failed.add(name)
            return None
        parent = self._resolve(parent_name, path, resolved, failed)
        if parent is None:
            if name not in failed:
                self._error(raw, "extends", f"backend {parent_name!r} could not be resolved")
                failed.add(name)
            return None
        base = RawBackend(
            name=parent.name,
            data={k: v for k, v in parent.data.items() if k not in _LOADER_KEYS},
            origins={
                k: o for k, o in parent.origins.items() if k.partition(".")[0] not in _LOADER_KEYS
            },
            origin=parent.origin,
            files=list(parent.files),
        )
        result = base.merged_with(raw, inherit=True)
        resolved[name] = result
        return result

    def _build(self, raw: RawBackend) -> BackendSpec | None:
        flags: dict[str, bool] = {"abstract": False, "enabled": True}
        ok = True
        for key in flags:
            value = raw.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool):
                flags[key] = value
            else:
                self._error(raw, key, f"{brief(value)} is not true or false")
                ok = False
        if not ok or flags["abstract"] or not flags["enabled"]:
            return None
        data = {k: v for k, v in raw.data.items() if k not in _LOADER_KEYS}
        try:
            return build_spec(
                raw.name,
                data,
                base_dir=lambda key: raw.origin_of(key).file.parent,
                environ=self.environ,
                source=" + ".join(str(f) for f in raw.files),  # absolute: cwd-free
            )
        except InvalidBackend as exc:
            found = []
            for error in exc.errors:
                origin = raw.origin_of(error.field)
                found.append(
                    DescriptorError(origin.file, origin.line, error.field, raw.name, error.message)
                )
            order = {file: index for index, file in enumerate(raw.files)}
            found.sort(key=lambda e: (order.get(e.file, len(order)), e.line or 0))
            self.errors.extend(found)
            return None
