"""Backends before validation: the mapping as written, plus where each key came from.

``entries_of`` turns one YAML document into backend entries (one mapping with ``name:``, a
list, ``backends: [...]`` or ``backends: {name: {...}}``, vramd's ``version: 2`` file, or
llama-swap's ``config.yaml``: ``models:`` by ID).
``RawBackend.merged_with`` lays a later layer over an earlier one key by key (the mappings
``vram``, ``env``, ``timeouts`` and ``calibration`` merge one level down). A ``null`` value is
kept and wins like any other, and validation reads ``null`` as "not set": that is how a layer
(or an ``extends`` child) drops what an earlier one set. ``origins`` maps dotted keys
(``vram.peak``) to ``Origin(file, line)`` so that errors point at the line that wrote the value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import brief
from .errors import DescriptorError, unknown_key_message
from .llama_swap import from_llama_swap, is_llama_swap
from .schema import MERGED_MAPPINGS, NAME_RE
from .vramd import VRAMD_VERSION, VramdContext, from_vramd
from .yamlio import LinedDict, LinedList, Origin

_FILE_KEYS = frozenset({"backends"})
_SHAPE_HELP = (
    "expected a backend (a mapping with 'name:'), a list of backends, or 'backends: [...]'"
)


@dataclass
class RawBackend:
    """One backend's descriptor mapping so far, with the origin of every key."""

    name: str
    data: dict[str, Any]
    origins: dict[str, Origin]
    origin: Origin  # where the backend was first written (its entry)
    files: list[Path] = field(default_factory=list)

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[Any, Any], file: Path) -> RawBackend:
        line = entry.line if isinstance(entry, LinedDict) else None
        data: dict[str, Any] = {}
        origins: dict[str, Origin] = {}
        for key, value in entry.items():
            if key == "name":
                continue
            key_line = entry.key_line(key) if isinstance(entry, LinedDict) else line
            origins[str(key)] = Origin(file, key_line)
            if key == "vram" and value is not None and not isinstance(value, Mapping):
                value = _lined({"peak": value}, key_line)  # "vram: 6GiB" is the peak
            if isinstance(value, Mapping):
                for sub in value:
                    sub_line = value.key_line(sub) if isinstance(value, LinedDict) else key_line
                    origins[f"{key}.{sub}"] = Origin(file, sub_line)
            data[key] = value
        return cls(name=name, data=data, origins=origins, origin=Origin(file, line), files=[file])

    def merged_with(self, over: RawBackend, *, inherit: bool = False) -> RawBackend:
        """This backend with ``over`` laid on top (``over`` wins key by key).

        With ``inherit`` (``extends``), ``self`` is the parent: the result takes the child's
        name and origin, and the parent's files come first in ``files``.
        """
        data = {
            k: (dict(v) if k in MERGED_MAPPINGS and isinstance(v, Mapping) else v)
            for k, v in self.data.items()
        }
        origins = dict(self.origins)
        for key, value in over.data.items():
            base = data.get(key)
            if key in MERGED_MAPPINGS and isinstance(value, Mapping) and isinstance(base, dict):
                for sub, sub_value in value.items():
                    _forget(origins, f"{key}.{sub}")
                    base[sub] = sub_value
                    origins[f"{key}.{sub}"] = over.origin_of(f"{key}.{sub}")
                origins[key] = over.origin_of(key)
                continue
            _forget(origins, str(key))
            data[key] = (
                dict(value) if key in MERGED_MAPPINGS and isinstance(value, Mapping) else value
            )
            for okey, origin in over.origins.items():
                if okey == str(key) or okey.startswith(f"{key}."):
                    origins[okey] = origin
        files = list(self.files)
        files += [f for f in over.files if f not in files]
        if inherit:
            return RawBackend(over.name, data, origins, over.origin, files)
        return RawBackend(
            self.name, data, origins, self.origin if self.files else over.origin, files
        )

    def origin_of(self, dotted: str) -> Origin:
        """The origin of a key, else of its enclosing key, else of the backend itself."""
        key = dotted
        while key:
            if key in self.origins:
                return self.origins[key]
            key = key.rpartition(".")[0]
        return self.origin


def _forget(origins: dict[str, Origin], key: str) -> None:
    for okey in [k for k in origins if k == key or k.startswith(key + ".")]:
        del origins[okey]


def _lined(values: dict[str, Any], line: int | None) -> LinedDict:
    out = LinedDict(values, line=line)
    if line is not None:
        out.key_lines.update(dict.fromkeys(values, line))
    return out


def _line_of(node: Any, fallback: int | None) -> int | None:
    return node.line if isinstance(node, LinedDict | LinedList) else fallback


def entries_of(
    document: Any, file: Path, vramd_context: VramdContext | None = None
) -> Iterator[tuple[Mapping[Any, Any], int | None] | DescriptorError]:
    """Each backend entry of one YAML document (vramd ones already translated), or errors.

    The entries of a vramd file are translated with ``vramd_context`` (the environment and the
    working directory), and each warning about them comes as a ``DescriptorWarning``.
    """
    if document is None:
        return
    vramd = False
    line = _line_of(document, None)
    if isinstance(document, list):
        items: Any = document
    elif isinstance(document, Mapping) and "version" in document:
        version = document["version"]
        version_line = document.key_line("version") if isinstance(document, LinedDict) else line
        if version != VRAMD_VERSION:
            yield DescriptorError(
                file,
                version_line,
                "version",
                None,
                f"unsupported version {brief(version)}: vramtui reads its own format "
                f"(no 'version:') and vramd's 'version: 2'",
            )
            return
        vramd = True
        items = document.get("backends")
        if items is None:
            return
        if not isinstance(items, list):
            yield DescriptorError(
                file,
                document.key_line("backends") if isinstance(document, LinedDict) else line,
                "backends",
                None,
                "a vramd 'version: 2' file needs 'backends:' to be a list",
            )
            return
    elif isinstance(document, Mapping) and "backends" in document:
        for key in document:
            if key not in _FILE_KEYS:
                key_line = document.key_line(key) if isinstance(document, LinedDict) else line
                yield DescriptorError(
                    file,
                    key_line,
                    str(key),
                    None,
                    unknown_key_message(key, _FILE_KEYS) + " at the top of a file with 'backends:'",
                )
        items = document["backends"]
        if items is None:
            return
        if isinstance(items, Mapping):  # backends: {name: {fields}}
            by_name = items
            items = LinedList(line=_line_of(by_name, line))
            for name, body in by_name.items():
                items.append(_named(name, body, by_name))
                items.lines.append(
                    by_name.key_line(name) if isinstance(by_name, LinedDict) else line
                )
        elif not isinstance(items, list):
            yield DescriptorError(
                file,
                document.key_line("backends") if isinstance(document, LinedDict) else line,
                "backends",
                None,
                "'backends' must be a list of backends or a mapping by name",
            )
            return
    elif is_llama_swap(document):
        context = vramd_context or VramdContext()
        yield from from_llama_swap(document, file, context.environ, context.workdir)
        return
    elif isinstance(document, Mapping) and "name" in document:
        items = [document]
    else:
        yield DescriptorError(file, line, None, None, _SHAPE_HELP)
        return
    for index, item in enumerate(items):
        item_line = items.lines[index] if isinstance(items, LinedList) else line
        if not isinstance(item, Mapping):
            yield DescriptorError(
                file,
                item_line,
                None,
                None,
                f"a backend must be a mapping with 'name:', not {brief(item)}",
            )
            continue
        if vramd:
            translated, warnings = from_vramd(item, file, vramd_context or VramdContext())
            yield from warnings
            yield translated, _line_of(item, item_line)
        else:
            yield item, _line_of(item, item_line)


def _named(name: Any, body: Any, parent: Mapping[Any, Any]) -> Any:
    """``backends: {sdxl: {...}}`` → the entry ``{name: sdxl, ...}``, keeping lines."""
    line = parent.key_line(name) if isinstance(parent, LinedDict) else None
    if body is None:
        body = LinedDict(line=line)
    if not isinstance(body, Mapping):
        return body
    entry = LinedDict(line=line)
    entry["name"] = name
    if line is not None:
        entry.key_lines["name"] = line
    for key, value in body.items():
        if key == "name":  # the mapping key is the name
            continue
        entry[key] = value
        if isinstance(body, LinedDict) and key in body.key_lines:
            entry.key_lines[key] = body.key_lines[key]
    return entry


def entry_name(entry: Mapping[Any, Any], file: Path, line: int | None) -> str | DescriptorError:
    """The entry's backend name, or an error saying what is wrong with it."""
    if "name" not in entry:
        return DescriptorError(file, line, "name", None, "a backend needs a 'name:'")
    name = entry["name"]
    name_line = entry.key_line("name") if isinstance(entry, LinedDict) else line
    if not isinstance(name, str) or not NAME_RE.match(name):
        return DescriptorError(
            file,
            name_line,
            "name",
            None,
            f"{brief(name)} is not a backend name (letters, digits, . _ -; up to 64; "
            f"starting with a letter or digit)",
        )
    return name
