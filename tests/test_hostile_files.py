"""Hostile inputs that are files or a model's text, not requests: each is refused with one line,
quickly, before it is built in memory.

- a llama-swap ``config.yaml`` whose macros use each other many times over (each doubling
  the last: a command line of gigabytes);
- YAML aliases of aliases (a "billion laughs": a few hundred bytes that stand for millions of
  values, walked by every reader);
- a descriptor file of many megabytes;
- a model's tool-call arguments nested past what Python can parse (the Ollama translation);
- a descriptor another user could have written (its commands would run as the engine's user).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from supervisor.backends.errors import DescriptorError
from supervisor.backends.llama_swap import MAX_EXPANDED, from_llama_swap
from supervisor.backends.loader import load_backends
from supervisor.backends.yamlio import MAX_FILE_BYTES, load_documents
from supervisor.http.ollama_shapes import Reply
from supervisor.paths import private_group
from supervisor.textsafe import visible


def test_macros_that_explode_are_one_error_of_that_model(tmp_path: Path) -> None:
    lines = ["macros:", '  m0: "aaaaaaaaaaaaaaaa"']
    lines += [f'  m{i}: "${{m{i - 1}}}${{m{i - 1}}}"' for i in range(1, 40)]  # 2^39 × 16
    lines += ["models:", "  bomb:", '    cmd: "server --port ${PORT} ${m39}"',
              "  fine:", '    cmd: "server --port ${PORT} ${m2}"']
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    items = list(from_llama_swap(load_documents(path)[0], path, {}, tmp_path))
    assert time.monotonic() - started < 5
    errors = [i for i in items if isinstance(i, DescriptorError)]
    assert len(errors) == 1 and errors[0].field == "cmd" and errors[0].backend == "bomb"
    assert f"more than {MAX_EXPANDED:,}" in str(errors[0])
    entries = [i[0] for i in items if isinstance(i, tuple)]
    assert [e["name"] for e in entries] == ["fine"]
    assert entries[0]["command"][-1] == "a" * 64  # what stays small still expands


def test_aliases_of_aliases_are_refused_before_they_are_built(tmp_path: Path) -> None:
    lines = ["x0: &a0 [aaaaaaaaaa, aaaaaaaaaa]"]
    lines += [f"x{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 40)]
    lines += ["models:", "  a:", "    cmd: server --port ${PORT}", "    env: *a39"]
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    with pytest.raises(DescriptorError, match="aliases expand to more than"):
        load_documents(path)
    assert time.monotonic() - started < 5
    # aliases used a sane number of times are what YAML is for
    path.write_text("base: &b {keep_alive: 5m}\nbackends:\n"
                    + "".join(f"  - {{<<: *b, name: m{i}}}\n" for i in range(200)))
    assert len(load_documents(path)[0]["backends"]) == 200
    # an alias that contains itself is counted, not followed forever
    path.write_text("a: &r [1, *r]\n")
    assert load_documents(path)[0]["a"][0] == 1


def test_a_descriptor_of_many_megabytes_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with path.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(DescriptorError, match="more than a descriptor file may be"):
        load_documents(path)


def test_tool_arguments_nested_past_parsing_stay_text() -> None:
    deep = "[" * 100_000
    answer = {"choices": [{"message": {"content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": deep}}]}}]}
    out = Reply("chat", "m").whole(answer, 1)
    assert out["message"]["tool_calls"][0]["function"]["arguments"] == {"arguments": deep}
    streamed = Reply("chat", "m")
    streamed.chunk({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"name": "f", "arguments": deep}}]}}]})
    calls = streamed.done(1)[0]["message"]["tool_calls"]
    assert calls[0]["function"]["arguments"] == {"arguments": deep}


def _descriptor(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "backends.yaml"
    path.write_text("backends:\n  - name: planted\n    command: [touch, /tmp/planted]\n"
                    "    vram: {weights: 1MiB}\n")
    path.chmod(0o644)
    return path


def test_a_descriptor_someone_else_could_write_is_not_read(tmp_path: Path) -> None:
    """Whoever writes a descriptor runs commands as the engine's user."""
    mine = _descriptor(tmp_path / "mine")
    assert list(load_backends([mine], demo_fallback=False).backends) == ["planted"]
    mine.chmod(0o666)
    result = load_backends([mine], demo_fallback=False)
    assert not result.backends and "may be written by others (mode 0666)" in str(
        result.errors[0]) and "chmod go-w" in str(result.errors[0])
    mine.chmod(0o644)
    mine.parent.chmod(0o775)  # umask 002: its group is the user's own (if private), or not
    if private_group(mine.parent.stat().st_gid, os.geteuid()):
        assert list(load_backends([mine], demo_fallback=False).backends) == ["planted"]
    if os.geteuid() == 0:  # a group with others in it may replace it
        os.chown(mine.parent, -1, 65534)
        assert "its directory may be written by its group" in str(
            load_backends([mine], demo_fallback=False).errors[0])
        os.chown(mine.parent, -1, 0)
    mine.parent.chmod(0o1777)  # sticky, as /tmp: others cannot replace it
    assert list(load_backends([mine], demo_fallback=False).backends) == ["planted"]
    if os.geteuid() == 0:  # a file another user owns (and so may rewrite)
        os.chown(mine, 65534, 65534)
        result = load_backends([mine.parent], demo_fallback=False)
        assert not result.backends and "belongs to uid 65534" in str(result.errors[0])


def test_a_process_s_words_are_shown_with_nothing_that_acts() -> None:
    text = "a\x1b[2J\x07b\tc\u202ed\x9be\nf"
    assert visible(text) == "a\\x1b[2J\\x07b c\\u202ed\\x9be\\x0af"
    assert visible(text, lines=True).endswith("e\nf")
    assert visible("plain — ünïcode ✓") == "plain — ünïcode ✓"


def test_a_descriptor_through_a_link_is_judged_where_it_lies_and_never_blocks(
        tmp_path: Path) -> None:
    """A link in a directory of ours may lead to one others write in (they could swap the
    file it reaches); a FIFO would block the reader for good."""
    shared = tmp_path / "shared"
    target = _descriptor(shared)
    shared.chmod(0o777)  # not sticky: anyone may replace the file there
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "backends.yaml").symlink_to(target)
    result = load_backends([mine / "backends.yaml"], demo_fallback=False)
    assert not result.backends and "its target's directory may be written by others" in str(
        result.errors[0]), result.errors
    shared.chmod(0o755)  # a link to a file of ours in a directory of ours: read as it is
    assert list(load_backends([mine / "backends.yaml"], demo_fallback=False).backends) == [
        "planted"]
    fifo = mine / "fifo.yaml"
    os.mkfifo(fifo, 0o600)
    started = time.monotonic()
    result = load_backends([fifo], demo_fallback=False)
    assert time.monotonic() - started < 5
    assert "not read: it is not a regular file" in str(result.errors[0]), result.errors


def test_a_folder_says_what_it_holds_that_is_named_a_descriptor_but_is_none(
        tmp_path: Path) -> None:
    """In ``backends.d``, a dangling link, a folder and a FIFO named ``*.yaml`` were passed
    over without a word (a descriptor the user thinks is there, silently not in force): each
    is now an error of its own, the good file beside them loads, and the FIFO blocks nothing."""
    folder = tmp_path / "backends.d"
    _descriptor(folder)
    (folder / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    (folder / "dir.yaml").mkdir()
    os.mkfifo(folder / "pipe.yaml", 0o600)
    started = time.monotonic()
    result = load_backends([folder], demo_fallback=False)
    assert time.monotonic() - started < 5
    assert list(result.backends) == ["planted"]
    said = {Path(str(e.file)).name: str(e) for e in result.errors}
    assert set(said) == {"gone.yaml", "dir.yaml", "pipe.yaml"}, result.errors
    assert "no such file" in said["gone.yaml"] and "is a directory" in said["dir.yaml"]
    assert "not a regular file" in said["pipe.yaml"]
