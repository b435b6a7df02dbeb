"""Reading descriptor YAML so that every mapping remembers its line numbers.

A safe loader whose mappings are ``LinedDict``: a plain ``dict`` that also knows the line it
starts on and the line of each of its keys (1-based); sequences are ``LinedList`` likewise.
Duplicate keys are an error (PyYAML would silently keep the last). Syntax errors become a
``DescriptorError`` with the line.  A file is bounded before it is built: its size
(:data:`MAX_FILE_BYTES`) and what its aliases expand to (:data:`MAX_VALUES`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from yaml.constructor import ConstructorError

from ..paths import Untrusted, read_bounded, read_own
from .errors import DescriptorError

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class Origin(NamedTuple):
    """Where a value was written."""

    file: Path
    line: int | None


class LinedDict(dict[Any, Any]):
    """A mapping read from YAML, with ``line`` (its first line) and ``key_lines``; a file's
    top-level mapping also keeps the file's ``text`` (read once: see :func:`load_core`)."""

    __slots__ = ("line", "key_lines", "text")

    def __init__(self, *args: Any, line: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line = line
        self.key_lines: dict[Any, int] = {}
        self.text: str | None = None

    def key_line(self, key: Any) -> int | None:
        return self.key_lines.get(key, self.line)


class LinedList(list[Any]):
    """A sequence read from YAML, with ``line`` and the first line of each item (``lines``)."""

    __slots__ = ("line", "lines")

    def __init__(self, *args: Any, line: int | None = None) -> None:
        super().__init__(*args)
        self.line = line
        self.lines: list[int] = []


_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: At most this many values once every alias is expanded, and this many bytes of file: a
#: file of aliases of aliases (a "billion laughs") is refused before it is built or walked.
MAX_VALUES = 100_000
MAX_FILE_BYTES = 4 << 20


class _LineLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """SafeLoader (the C one when available) building ``LinedDict`` mappings."""

    def construct_document(self, node: Any) -> Any:
        if expanded_size(node, MAX_VALUES) > MAX_VALUES:
            raise ConstructorError(None, None, f"its aliases expand to more than {MAX_VALUES:,} "
                                   "values; write the values out, or use fewer aliases",
                                   node.start_mark)
        return super().construct_document(node)


def expanded_size(root: Any, limit: int) -> int:
    """How many values a node stands for with every alias expanded (each node is counted
    once per use); counting stops past ``limit``.  Linear in the nodes, never recursive."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes and not children_done:
            continue
        kids = _children(node)
        if not children_done:
            sizes[key] = 1  # a node met again while open (a recursive alias) counts once
            stack.append((node, True))
            stack.extend((kid, False) for kid in kids if id(kid) not in sizes)
            continue
        sizes[key] = min(limit + 1, 1 + sum(sizes.get(id(kid), 1) for kid in kids))
    return sizes[id(root)]


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _construct_mapping(loader: Any, node: yaml.MappingNode) -> Any:
    data = LinedDict(line=node.start_mark.line + 1)
    yield data
    own_count = sum(1 for key_node, _ in node.value if key_node.tag != _MERGE_TAG)
    loader.flatten_mapping(node)  # resolves "<<: *anchor"; merged pairs come first
    first_own = len(node.value) - own_count
    own_lines: dict[Any, int] = {}
    for index, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=False)
        try:
            hash(key)
        except TypeError:
            raise ConstructorError(
                "while reading a mapping",
                node.start_mark,
                "found a key that is not a plain value",
                key_node.start_mark,
            ) from None
        line = key_node.start_mark.line + 1
        if index >= first_own:
            if key in own_lines:
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {own_lines[key]})",
                    key_node.start_mark,
                )
            own_lines[key] = line
        data[key] = loader.construct_object(value_node, deep=False)
        data.key_lines[key] = line


def _construct_sequence(loader: Any, node: yaml.SequenceNode) -> Any:
    data = LinedList(line=node.start_mark.line + 1)
    yield data
    for item_node in node.value:
        data.append(loader.construct_object(item_node, deep=False))
        data.lines.append(item_node.start_mark.line + 1)


_LineLoader.add_constructor(_MAP_TAG, _construct_mapping)
_LineLoader.add_constructor(_SEQ_TAG, _construct_sequence)


class _CoreLoader(_LineLoader):
    """As ``_LineLoader``, its plain scalars read as Go's yaml.v3 (llama-swap's) reads them:
    YAML 1.2's booleans (``on``/``yes``/``no`` are text), a number as Go's ``ParseInt`` of
    base 0 takes it (``0x1F``, ``0b11``, ``0o17`` and ``017`` octal, ``_`` ignored; past 64
    bits a float, past a float's range text), ``1e3`` a number, a float out of range text,
    and no timestamps."""

    yaml_implicit_resolvers: dict[Any, Any] = {}


def _resolve(tag: str, pattern: str, first: str) -> None:
    _CoreLoader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(pattern),
                                      list(first))


_resolve("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF")
_resolve("int", r"^[-+]?(?:0[bB][01_]+|0[oO][0-7_]+|0[xX][0-9a-fA-F_]+|[0-9][0-9_]*)$",
         "-+0123456789")
_resolve("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
         r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", "-+.0123456789")
_resolve("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""])
_resolve("merge", r"^(?:<<)$", "<")


def _core_int(loader: Any, node: yaml.ScalarNode) -> int | float | str:
    text = loader.construct_scalar(node)
    digits = text.replace("_", "").lstrip("+-").lower()
    sign = -1 if text.startswith("-") else 1
    try:
        if digits[:2] in ("0x", "0o", "0b"):
            value = int(digits, 0)
        elif len(digits) > 1 and digits.startswith("0"):
            value = int(digits, 8)  # (Go's base 0: a leading 0 is octal)
        else:
            value = int(digits, 10)
    except ValueError:  # (017 with an 8 or 9 in it, or past Python's digits limit)
        return text
    value *= sign
    if -(2**63) <= value < 2**63:
        return value
    try:
        return float(value)  # (past int64: a float)
    except OverflowError:  # (past a float's range too: text, as a float out of range is)
        return text


def _core_float(loader: Any, node: yaml.ScalarNode) -> float | str:
    text = loader.construct_scalar(node)
    low = text.lower()
    if low.endswith(".inf"):
        return float("-inf") if low.startswith("-") else float("inf")
    if low == ".nan":
        return float("nan")
    value = float(text)
    return text if math.isinf(value) else value  # (Go keeps 1e400 as it is written)


def _core_bool(loader: Any, node: yaml.ScalarNode) -> bool:
    return bool(loader.construct_scalar(node).lower() == "true")


_CoreLoader.add_constructor("tag:yaml.org,2002:int", _core_int)
_CoreLoader.add_constructor("tag:yaml.org,2002:float", _core_float)
_CoreLoader.add_constructor("tag:yaml.org,2002:bool", _core_bool)


def load_core(document: Any) -> Any:
    """The one document of the file ``document`` was read from (by :func:`load_documents`,
    whose text it keeps: the file is not read again), read as Go's yaml.v3 reads it (see
    ``_CoreLoader``); None when it cannot be (no text kept, bad YAML, not one document: the
    caller has told or will tell why, from :func:`load_documents`)."""
    text = getattr(document, "text", None)
    if text is None:
        return None
    try:
        documents = list(yaml.load_all(text, Loader=_CoreLoader))
    except (yaml.YAMLError, ValueError):
        return None
    return documents[0] if len(documents) == 1 else None


def load_documents(path: Path, stakes: str | None = None) -> list[Any]:
    """All YAML documents of ``path``; raise ``DescriptorError`` for unreadable or bad YAML.
    With ``stakes`` (what whoever writes it gets), the file is one the engine acts on: read
    only if no one else could have written it, through the descriptor checked
    (:func:`supervisor.paths.read_own`)."""
    try:
        if stakes is None:  # (a file to convert: a link, a FIFO, /dev/stdin will do)
            raw = read_bounded(path, MAX_FILE_BYTES)
        else:
            raw = read_own(path, stakes, MAX_FILE_BYTES)
        size = len(raw)
    except Untrusted as exc:
        raise DescriptorError(path, None, None, None, f"not read: {exc}") from None
    except FileNotFoundError:
        raise DescriptorError(path, None, None, None, "no such file") from None
    except IsADirectoryError:
        raise DescriptorError(path, None, None, None,
                              "is a directory: name a file in it") from None
    except OSError as exc:
        raise DescriptorError(path, None, None, None, f"cannot read: {exc.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise DescriptorError(path, None, None, None, f"is over {MAX_FILE_BYTES:,} bytes, "
                              "more than a descriptor file may be; is it the right file?")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DescriptorError(path, line, None, None, "not UTF-8 text") from None
    try:
        documents = list(yaml.load_all(text, Loader=_LineLoader))
        for document in documents:
            if isinstance(document, LinedDict):
                document.text = text
        return documents
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or "invalid YAML"
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        from .yamlhint import explain

        hint = explain(problem, text.splitlines(), line,
                       mark.column if mark is not None else None)
        message = f"YAML error: {hint} ({problem}{context})" if hint else \
            f"YAML error: {problem}{context}"
        raise DescriptorError(path, line, None, None, message) from None
    except yaml.YAMLError as exc:
        message = " ".join(str(exc).split())
        raise DescriptorError(path, None, None, None, f"YAML error: {message}") from None


def core_scalar(text: str) -> Any:
    """``text`` as YAML 1.2's core schema reads it as a plain scalar (``42`` a number,
    ``true`` a bool, ``on`` text); text that is no single plain scalar stays text."""
    try:
        value = yaml.load(text, Loader=_CoreLoader)
    except (yaml.YAMLError, ValueError, OverflowError):
        return text
    return value if isinstance(value, str | int | float | bool) else text
