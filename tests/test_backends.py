"""supervisor.backends: descriptor fields, units, layers, extends, vramd files and errors."""

from __future__ import annotations

import json
import math
import os
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.backends import (
    BackendSpec,
    DescriptorError,
    LoadResult,
    Timeouts,
    VramSpec,
    default_layers,
    demo_backends_dir,
    load_backends,
    packaged_defaults_dir,
    write_overlay,
)
from supervisor.backends import loader as loader_module


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Error messages show paths relative to the working directory.
    monkeypatch.chdir(tmp_path)


def write(base: Path, relpath: str, text: str) -> Path:
    path = base / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load(*paths: Path, environ: dict[str, str] | None = None) -> LoadResult:
    env = {"HOME": "/home/test"} if environ is None else environ
    return load_backends(list(paths), environ=env, demo_fallback=False)


def only(result: LoadResult) -> BackendSpec:
    assert not result.errors, [str(e) for e in result.errors]
    assert len(result.backends) == 1
    return next(iter(result.backends.values()))


def errors(result: LoadResult) -> list[str]:
    return [str(e) for e in result.errors]


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    return write(tmp_path, "w/main.py", "print('hi')\n")


# -- fields ----------------------------------------------------------------------------------


def test_minimal_script_backend_gets_defaults(tmp_path: Path, worker: Path) -> None:
    file = write(tmp_path, "w/b.yaml", "name: echo\nscript: main.py\nvram: 1GiB\n")
    spec = only(load(file))
    assert spec.name == "echo"
    assert spec.command == (sys.executable, "-m", "worker_sdk", str(worker))
    assert spec.cwd == worker.parent
    assert spec.env == {}
    assert spec.vram == VramSpec(peak_mib=1024)
    assert spec.safety_mib == 512
    assert spec.priority == 0
    assert spec.gpus is None
    assert spec.keep_alive_s == 300.0
    assert (spec.pinned, spec.stream, spec.simulated) == (False, False, False)
    assert spec.concurrency == 1
    assert spec.timeouts == Timeouts(start_s=120.0, request_s=None, stop_grace_s=10.0)
    assert spec.calibration_request is None
    assert spec.reload_cost_s is None
    assert spec.description == ""
    assert spec.source == str(tmp_path / "w" / "b.yaml")  # absolute


def test_every_field(tmp_path: Path, worker: Path) -> None:
    (tmp_path / "w" / "data").mkdir()
    file = write(
        tmp_path,
        "w/full.yaml",
        """
        name: sdxl-turbo
        description: |
          Fast SDXL.
        script: main.py
        cwd: data
        env: {HF_HOME: ~/hf, STEPS: 4, RATIO: 1.5}
        vram: {weights: 6GiB, activation: 1536MiB, context: 400MB}
        safety: 1GiB
        priority: -3
        gpus: [1, 0]
        keep_alive: 1h30m
        pinned: true
        stream: true
        concurrency: 2
        timeouts: {start: 2m, request: 90s, stop_grace: 2.5}
        calibration: {request: {prompt: a cat, steps: 1}}
        reload_cost: 40s
        target_wait: 1.5s
        simulated: true
        """,
    )
    spec = only(load(file))
    assert spec.description == "Fast SDXL."
    assert spec.cwd == tmp_path / "w" / "data"
    assert spec.env == {"HF_HOME": "/home/test/hf", "STEPS": "4", "RATIO": "1.5"}
    assert spec.vram == VramSpec(None, 6144, 1536, 382)  # 400 MB = 381.5 MiB, rounded up
    assert spec.peak == 6144 + 1536 + 382
    assert spec.resident == 6144 + 382
    assert not spec.unmeasured
    assert spec.safety_mib == 1024
    assert spec.priority == -3
    assert spec.gpus == (1, 0)
    assert spec.keep_alive_s == 5400.0
    assert spec.pinned and spec.stream and spec.simulated
    assert spec.concurrency == 2
    assert spec.timeouts == Timeouts(120.0, 90.0, 2.5)
    assert json.loads(spec.calibration_request or b"") == {"prompt": "a cat", "steps": 1}
    assert spec.reload_cost_s == 40.0
    assert spec.target_wait_s == 1.5


def test_python_field_keeps_the_venv_symlink(tmp_path: Path, worker: Path) -> None:
    venv_python = tmp_path / "w" / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)
    file = write(tmp_path, "w/b.yaml", "name: a\nscript: main.py\npython: venv/bin/python\n")
    spec = only(load(file))
    assert spec.command == (str(venv_python), "-m", "worker_sdk", str(worker))


def test_command_as_list_and_as_string(tmp_path: Path) -> None:
    tool = write(tmp_path, "d/bin/serve", "")
    file = write(
        tmp_path,
        "d/b.yaml",
        """
        - name: listed
          command: [bin/serve, --port, 8080]
        - name: line
          command: python -m my.worker --prompt 'a b'
        """,
    )
    result = load(file)
    assert not result.errors
    assert result.backends["listed"].command == (str(tool), "--port", "8080")
    assert result.backends["line"].command == ("python", "-m", "my.worker", "--prompt", "a b")
    assert result.backends["line"].cwd == tmp_path / "d"
    assert result.backends["line"].unmeasured
    assert result.backends["line"].peak is None and result.backends["line"].resident is None


def test_environment_expansion(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        name: a
        command: ["$TOOLS/run", "${MODEL}", "cost $$5"]
        env: {P: "${MODEL}:x"}
        """,
    )
    write(tmp_path, "tools/run", "")
    result = load(file, environ={"HOME": "/h", "TOOLS": str(tmp_path / "tools"), "MODEL": "m"})
    spec = only(result)
    assert spec.command == (str(tmp_path / "tools" / "run"), "m", "cost $5")
    assert spec.env == {"P": "m:x"}
    missing = load(file, environ={"HOME": "/h"})
    assert missing.backends == {}
    assert "environment variable $TOOLS is not set" in errors(missing)[0]


@pytest.mark.parametrize(
    ("vram", "expected", "peak", "resident"),
    [
        ("6GiB", VramSpec(peak_mib=6144), 6144, 6144),
        ("{peak: 8GiB}", VramSpec(peak_mib=8192), 8192, 8192),
        ("{peak: 8GiB, activation: 2GiB}", VramSpec(8192, None, 2048, None), 8192, 6144),
        ("{weights: 4096, activation: 1024}", VramSpec(None, 4096, 1024, None), 5120, 4096),
        ("{weights: 4096}", VramSpec(None, 4096, None, None), None, 4096),
        ("{context: 300}", VramSpec(None, None, None, 300), None, None),
    ],
)
def test_vram_forms(
    tmp_path: Path, vram: str, expected: VramSpec, peak: int | None, resident: int | None
) -> None:
    file = write(tmp_path, "b.yaml", f"name: a\ncommand: python\nvram: {vram}\n")
    spec = only(load(file))
    assert spec.vram == expected
    assert (spec.peak, spec.resident, spec.unmeasured) == (peak, resident, peak is None)


# -- file shapes -----------------------------------------------------------------------------


def test_file_shapes(tmp_path: Path) -> None:
    write(tmp_path, "d/1.yaml", "name: single\ncommand: x\n")
    write(tmp_path, "d/2.yaml", "- {name: l1, command: x}\n- {name: l2, command: x}\n")
    write(tmp_path, "d/3.yml", "backends:\n  - {name: b1, command: x}\n")
    write(tmp_path, "d/4.yaml", "backends:\n  m1: {command: x}\n  m2: {command: y}\n")
    write(tmp_path, "d/5.yaml", "name: doc1\ncommand: x\n---\nname: doc2\ncommand: x\n")
    write(tmp_path, "d/6.yaml", "")  # empty: nothing, no error
    write(tmp_path, "d/ignored.txt", "name: nope\ncommand: x\n")
    write(tmp_path, "d/.hidden.yaml", "name: nope2\ncommand: x\n")
    result = load(tmp_path / "d")
    assert not result.errors, errors(result)
    assert list(result.backends) == ["single", "l1", "l2", "b1", "m1", "m2", "doc1", "doc2"]
    assert [p.name for p in result.layers] == [
        "1.yaml", "2.yaml", "3.yml", "4.yaml", "5.yaml", "6.yaml"
    ]  # fmt: skip


def test_yaml_merge_keys(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        - &base {name: a, command: x, priority: 3}
        - <<: *base
          name: b
          priority: 5
        """,
    )
    result = load(file)
    assert not result.errors
    assert (result.backends["a"].priority, result.backends["b"].priority) == (3, 5)


def test_vramd_v2_file(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "vramd.yaml",
        """
        version: 2
        backends:
          - name: my-model
            adapter: my_package.adapter
            vram_mib: 4200
            priority: 20
            runtime:
              command: ["/usr/bin/env", "-m", "my_package.worker"]
              env: { HF_HOME: ~/hf-cache }
            load_keys: [device, compute_type]
            shape_keys: [device]
            calibrate_request: { mesh_path: test-mesh.glb }
            calibrate_load_kwargs: { compute_type: fp16 }
            gpu_ids: [0]
            keep_alive: 10m
        """,
    )
    spec = only(load(file))
    assert spec.name == "my-model"
    assert spec.vram == VramSpec(peak_mib=4200)
    assert spec.priority == 20
    assert spec.command == ("/usr/bin/env", "-m", "my_package.worker")
    assert spec.env == {"HF_HOME": "/home/test/hf-cache"}
    assert spec.calibration_request == b'{"mesh_path":"test-mesh.glb"}'
    assert spec.gpus == (0,)
    assert spec.keep_alive_s == 600.0


def test_vramd_errors_keep_lines(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "vramd.yaml",
        """
        version: 2
        backends:
          - name: m
            vram_mib: lots
            runtime: {command: [x]}
        """,
    )
    assert errors(load(file)) == [
        "vramd.yaml:4: backend 'm': field 'vram.peak': "
        "'lots' is not a size (use e.g. 12GiB or 12288)"
    ]


# -- layers ----------------------------------------------------------------------------------


def test_layers_override_single_keys(tmp_path: Path, worker: Path) -> None:
    base = write(
        tmp_path,
        "w/base.yaml",
        """
        name: sd
        script: main.py
        priority: 1
        keep_alive: 5m
        env: {A: "1", B: "2"}
        vram: {weights: 4GiB, activation: 2GiB}
        timeouts: {start: 60}
        """,
    )
    write(
        tmp_path,
        "conf/backends.d/50-sd.yaml",
        """
        name: sd
        priority: 7
        env: {B: null, C: "3"}
        vram: {peak: 7GiB}
        timeouts: {request: 10m}
        keep_alive: null
        """,
    )
    result = load(base, tmp_path / "conf" / "backends.d")
    spec = only(result)
    assert spec.command[-1] == str(worker)  # still from the base
    assert spec.priority == 7
    assert spec.keep_alive_s == 300.0  # null: back to the default
    assert spec.env == {"A": "1", "C": "3"}
    assert spec.vram == VramSpec(7168, 4096, 2048, None)
    assert spec.peak == 7168 and spec.resident == 4096
    assert spec.timeouts == Timeouts(start_s=60.0, request_s=600.0, stop_grace_s=10.0)
    assert spec.source == f"{tmp_path}/w/base.yaml + {tmp_path}/conf/backends.d/50-sd.yaml"


def test_bare_vram_in_an_overlay_sets_only_the_peak(tmp_path: Path) -> None:
    base = write(
        tmp_path, "a.yaml", "name: a\ncommand: x\nvram: {weights: 1GiB, activation: 1GiB}\n"
    )
    over = write(tmp_path, "b.yaml", "name: a\nvram: 3GiB\n")
    assert only(load(base, over)).vram == VramSpec(3072, 1024, 1024, None)


def test_relative_paths_follow_the_file_that_wrote_them(tmp_path: Path) -> None:
    write(tmp_path, "base/main.py", "")
    other = write(tmp_path, "over/other.py", "")
    base = write(tmp_path, "base/b.yaml", "name: a\nscript: main.py\n")
    over = write(tmp_path, "over/o.yaml", "name: a\nscript: other.py\n")
    spec = only(load(base, over))
    assert spec.command[-1] == str(other)
    assert spec.cwd == other.parent


def test_command_in_overlay_over_script_needs_a_null(tmp_path: Path, worker: Path) -> None:
    base = write(tmp_path, "w/b.yaml", "name: a\nscript: main.py\n")
    clash = write(tmp_path, "o1.yaml", "name: a\ncommand: python -m x\n")
    assert "not both" in errors(load(base, clash))[0]
    fixed = write(tmp_path, "o2.yaml", "name: a\ncommand: python -m x\nscript: null\n")
    assert only(load(base, fixed)).command == ("python", "-m", "x")


def test_extends_inherits_and_abstract_is_hidden(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        - name: sd-base
          abstract: true
          command: python -m sd
          env: {MODEL: base, DEVICE: cuda}
          vram: {weights: 4GiB, activation: 2GiB}
          priority: 2
        - name: sd-xl
          extends: sd-base
          env: {MODEL: xl}
          vram: {weights: 7GiB}
        - name: sd-xl-fast
          extends: sd-xl
          priority: 9
        """,
    )
    result = load(file)
    assert not result.errors, errors(result)
    assert list(result.backends) == ["sd-xl", "sd-xl-fast"]
    xl = result.backends["sd-xl"]
    assert xl.command == ("python", "-m", "sd")
    assert xl.env == {"MODEL": "xl", "DEVICE": "cuda"}
    assert xl.vram == VramSpec(None, 7168, 2048, None)
    assert xl.priority == 2
    fast = result.backends["sd-xl-fast"]
    assert fast.priority == 9 and fast.env == xl.env


def test_extends_sees_later_layers_of_the_parent(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "- {name: p, command: x, priority: 1}\n- {name: c, extends: p}\n")
    b = write(tmp_path, "b.yaml", "name: p\npriority: 5\n")
    assert load(a, b).backends["c"].priority == 5


def test_extends_cycle_and_missing_parent(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        - {name: a, command: x, extends: b}
        - {name: b, command: x, extends: a}
        - {name: c, command: x, extends: a}
        - {name: d, command: x, extends: sd-bse}
        - {name: sd-base, command: x}
        - {name: ok, command: x}
        """,
    )
    result = load(file)
    assert list(result.backends) == ["sd-base", "ok"]
    assert errors(result) == [
        "b.yaml:1: backend 'a': field 'extends': 'extends' loops: a -> b -> a",
        "b.yaml:2: backend 'b': field 'extends': 'extends' loops: a -> b -> a",
        "b.yaml:3: backend 'c': field 'extends': backend 'a' could not be resolved",
        "b.yaml:4: backend 'd': field 'extends': there is no backend 'sd-bse' "
        "(did you mean 'sd-base'?)",
    ]


def test_null_in_a_child_drops_what_the_parent_set(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        - {name: p, command: x, gpus: [1], env: {A: "1", B: "2"}, timeouts: {request: 1m}}
        - {name: c, extends: p, gpus: null, env: {A: null}, timeouts: {request: null}}
        """,
    )
    child = load(file).backends["c"]
    assert child.gpus is None and child.env == {"B": "2"} and child.timeouts.request_s is None


def test_backends_mapping_form_reports_item_lines(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        backends:
          good: {command: x}
          broken: 7
          empty:
        """,
    )
    result = load(file)
    assert list(result.backends) == ["good"]
    assert errors(result) == [
        "b.yaml:3: a backend must be a mapping with 'name:', not 7",
        "b.yaml:4: backend 'empty': field 'command': nothing to run: give 'command' or 'script'",
    ]


def test_enabled_false_hides_a_backend(tmp_path: Path) -> None:
    base = write(tmp_path, "a.yaml", "- {name: a, command: x}\n- {name: b, command: x}\n")
    over = write(tmp_path, "b.yaml", "name: a\nenabled: false\n")
    result = load(base, over)
    assert list(result.backends) == ["b"] and not result.errors


# -- errors ----------------------------------------------------------------------------------


def test_bad_size_error_line(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "backends.d/foo.yaml",
        """
        name: sdxl
        command: python -m sdxl
        vram:
          weights: 6GiB
          peak: 12 GB x
        """,
    )
    result = load(file)
    assert result.backends == {}
    (error,) = result.errors
    assert isinstance(error, DescriptorError)
    assert (error.file, error.line, error.field, error.backend) == (file, 5, "vram.peak", "sdxl")
    assert str(error) == (
        "backends.d/foo.yaml:5: backend 'sdxl': field 'vram.peak': "
        "'12 GB x' is not a size (use e.g. 12GiB or 12288)"
    )


def test_several_mistakes_are_all_reported_with_lines(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        name: sdxl
        command: python -m sdxl
        priorty: 3
        keep_alive: 5 mins
        concurrency: 0
        pinned: yes please
        gpus: [0, 0]
        timeouts: {start: 1m, stop_grace_s: 3}
        """,
    )
    assert errors(load(file)) == [
        "b.yaml:3: backend 'sdxl': field 'priorty': unknown key 'priorty' "
        "(did you mean 'priority'?)",
        "b.yaml:4: backend 'sdxl': field 'keep_alive': "
        "'5 mins' is not a duration (use e.g. 30s, 5m, 1h30m or a number of seconds)",
        "b.yaml:5: backend 'sdxl': field 'concurrency': 0 is too small (the least is 1)",
        "b.yaml:6: backend 'sdxl': field 'pinned': 'yes please' is not true or false",
        "b.yaml:7: backend 'sdxl': field 'gpus': GPU 0 is listed twice",
        "b.yaml:8: backend 'sdxl': field 'timeouts.stop_grace_s': unknown key 'stop_grace_s' "
        "(did you mean 'stop_grace'?)",
    ]


def test_wrong_types(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        name: a
        command: {not: a command}
        priority: high
        env: [A, B]
        """,
    )
    assert errors(load(file)) == [
        "b.yaml:2: backend 'a': field 'command': "
        "{'not': 'a command'} is not a list of words or a command line",
        "b.yaml:3: backend 'a': field 'priority': 'high' is not a whole number",
        "b.yaml:4: backend 'a': field 'env': "
        "['A', 'B'] is not a mapping of variable names to values",
    ]


def test_vramd_keys_in_our_format_get_a_hint(tmp_path: Path) -> None:
    file = write(tmp_path, "b.yaml", "name: a\ncommand: x\nvram_mib: 4000\n")
    (message,) = errors(load(file))
    assert message.startswith("b.yaml:3: backend 'a': field 'vram_mib': unknown key 'vram_mib'")
    assert "version: 2" in message


def test_yaml_syntax_error_has_a_line(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "bad.yaml",
        """
        name: a
        command: x
        env: {A: 1
        priority: 3
        """,
    )
    good = write(tmp_path, "good.yaml", "name: fine\ncommand: x\n")
    result = load(file, good)
    assert list(result.backends) == ["fine"]
    (error,) = result.errors
    assert error.file == file and error.line is not None and 3 <= error.line <= 5
    assert str(error).startswith(f"bad.yaml:{error.line}: YAML error: ")
    assert "\n" not in str(error)


def test_duplicate_keys_and_names(tmp_path: Path) -> None:
    dup_key = write(tmp_path, "k.yaml", "name: a\ncommand: x\npriority: 1\npriority: 2\n")
    dup_name = write(tmp_path, "n.yaml", "- {name: b, command: x}\n- {name: b, command: y}\n")
    result = load(dup_key, dup_name)
    assert list(result.backends) == ["b"]
    assert result.backends["b"].command == ("x",)
    assert errors(result) == [
        "k.yaml:4: YAML error: duplicate key 'priority' (first at line 3)",
        "n.yaml:2: backend 'b': defined twice in this file (first at line 1); this one is ignored",
    ]


def test_one_bad_backend_does_not_stop_the_others(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        "b.yaml",
        """
        backends:
          - {name: one, command: x}
          - {name: two, command: x, vram: huge}
          - 42
          - {command: x}
          - {name: "bad name!", command: x}
          - {name: three, command: x}
        """,
    )
    result = load(file)
    assert list(result.backends) == ["one", "three"]
    assert errors(result) == [
        "b.yaml:4: a backend must be a mapping with 'name:', not 42",
        "b.yaml:5: field 'name': a backend needs a 'name:'",
        "b.yaml:6: field 'name': 'bad name!' is not a backend name (letters, digits, . _ -; "
        "up to 64; starting with a letter or digit)",
        "b.yaml:3: backend 'two': field 'vram.peak': 'huge' is not a size "
        "(use e.g. 12GiB or 12288)",
    ]


def test_bad_shapes(tmp_path: Path) -> None:
    scalar = write(tmp_path, "s.yaml", "just text\n")
    version = write(tmp_path, "v.yaml", "version: 3\nbackends: []\n")
    extra = write(tmp_path, "e.yaml", "backend: []\nbackends: []\n")
    binary = tmp_path / "x.yaml"
    binary.write_bytes(b"name: a\n\xff\xfe\n")
    assert errors(load(scalar, version, extra, binary)) == [
        "s.yaml: expected a backend (a mapping with 'name:'), a list of backends, "
        "or 'backends: [...]'",
        "v.yaml:1: field 'version': unsupported version 3: vramtui reads its own format "
        "(no 'version:') and vramd's 'version: 2'",
        "e.yaml:1: field 'backend': unknown key 'backend' (did you mean 'backends'?) at the top "
        "of a file with 'backends:'",
        "x.yaml:2: not UTF-8 text",
    ]


def test_missing_script_and_nothing_to_run(tmp_path: Path) -> None:
    file = write(tmp_path, "b.yaml", "- {name: a, script: nope.py}\n- {name: b, priority: 1}\n")
    assert errors(load(file)) == [
        f"b.yaml:1: backend 'a': field 'script': worker script {tmp_path}/nope.py does not exist",
        "b.yaml:2: backend 'b': field 'command': nothing to run: give 'command' or 'script'",
    ]


# -- where layers come from ------------------------------------------------------------------


def test_missing_layer_is_an_error_not_an_exception(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", "name: a\ncommand: x\n")
    result = load(tmp_path / "missing.yaml", good)
    assert list(result.backends) == ["a"]
    assert errors(result) == ["missing.yaml: no such file or directory"]


def test_default_layers_order(tmp_path: Path) -> None:
    config = tmp_path / "config"
    (config / "backends.d").mkdir(parents=True)
    env = {
        "HOME": str(tmp_path),
        "VRAMTUI_BACKENDS": os.pathsep.join(["~/one.yaml", "", str(tmp_path / "two")]),
    }
    layers = default_layers(config, extra=["three.yaml", tmp_path / "four"], environ=env)
    expected = [tmp_path / "one.yaml", tmp_path / "two", Path("three.yaml"), tmp_path / "four"]
    if packaged_defaults_dir().is_dir():
        expected.insert(0, packaged_defaults_dir())
    assert layers == [*expected, config / "backends.d"]
    # without a backends.d, nothing is added for it
    assert default_layers(tmp_path / "nowhere", environ={})[-1:] != [
        tmp_path / "nowhere" / "backends.d"
    ]


def test_vramtui_backends_env_end_to_end(tmp_path: Path) -> None:
    write(tmp_path, "extra/a.yaml", "name: a\ncommand: x\npriority: 1\n")
    write(tmp_path, "config/backends.d/a.yaml", "name: a\npriority: 2\n")
    env = {"HOME": str(tmp_path), "VRAMTUI_BACKENDS": str(tmp_path / "extra")}
    layers = default_layers(tmp_path / "config", environ=env)
    result = load_backends(layers, environ=env, demo_fallback=False)
    assert only(result).priority == 2
    env["VRAMTUI_BACKENDS"] = str(tmp_path / "gone.yaml")
    result = load_backends(default_layers(tmp_path / "config", environ=env), environ=env)
    assert result.backends == {}
    assert errors(result) == [
        "gone.yaml: no such file or directory",
        # the overlay alone has nothing to run
        "config/backends.d/a.yaml:1: backend 'a': field 'command': "
        "nothing to run: give 'command' or 'script'",
    ]


def test_demo_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = tmp_path / "demo"
    write(demo, "demo.yaml", "name: demo-echo\ncommand: x\nsimulated: true\n")
    monkeypatch.setattr(loader_module, "demo_backends_dir", lambda: demo)
    empty = tmp_path / "empty"
    empty.mkdir()
    result = load_backends([empty], environ={})
    assert result.demo and list(result.backends) == ["demo-echo"]
    assert result.backends["demo-echo"].simulated
    # no fallback when something is configured, or when something is wrong
    write(tmp_path, "conf/a.yaml", "name: a\ncommand: x\n")
    assert not load_backends([tmp_path / "conf"], environ={}).demo
    assert not load_backends([tmp_path / "missing"], environ={}).demo
    assert not load_backends([empty], environ={}, demo_fallback=False).demo
    # a calibration of a demo backend alone (an overlay) keeps the demo, and goes on it
    write(tmp_path, "cal/zz.yaml", "name: demo-echo\noverlay: true\nvram: 3GiB\n")
    result = load_backends([tmp_path / "cal"], environ={})
    assert result.demo and result.errors == () and list(result.backends) == ["demo-echo"]
    assert result.backends["demo-echo"].vram.peak_mib == 3072
    # a broken file is not nothing: it is reported, and the demo does not stand in for it
    write(tmp_path, "cal/broken.yaml", "name: [\n")
    assert not load_backends([tmp_path / "cal"], environ={}).demo


def test_demo_backends_dir_points_into_the_repository() -> None:
    import supervisor

    demo = demo_backends_dir()
    expected = Path(supervisor.__file__).parents[1] / "examples" / "demo"
    assert demo == (expected if expected.is_dir() else None)


# -- overlays --------------------------------------------------------------------------------


def test_write_overlay_round_trip(tmp_path: Path) -> None:
    base = write(tmp_path, "a.yaml", "name: a\ncommand: x\nvram: 1GiB\n")
    overlay = tmp_path / "conf" / "backends.d" / "a.calibrated.yaml"
    write_overlay(
        overlay,
        "a",
        {"vram": {"peak": 5000, "weights": 4000, "activation": 1000}, "keep_alive": math.inf},
        comment="measured by vramtui calibrate",
    )
    text = overlay.read_text()
    assert text.startswith("# measured by vramtui calibrate\nname: a\n")
    spec = only(load(base, overlay.parent))
    assert spec.vram == VramSpec(5000, 4000, 1000, None)
    assert spec.keep_alive_s == math.inf
    write_overlay(overlay, "a", {"priority": 4})  # replaces the file
    assert only(load(base, overlay.parent)).vram == VramSpec(peak_mib=1024)
    assert sorted(p.name for p in overlay.parent.iterdir()) == ["a.calibrated.yaml"]
    with pytest.raises(ValueError, match="did you mean 'priority'"):
        write_overlay(overlay, "a", {"priorty": 1})


@pytest.mark.parametrize(("text", "line", "hint"), [
    ("backends:\n  - name: a\n\tscript: x.py\n", 3, "a tab at column 1"),
    ("name: a\ndescription: a: b\n", 2, "put the value in quotes"),
    ("name: a\nscript: x.py\n  priority: 3\n", 3, "indented deeper than the one above"),
    ('name: "a\n', 2, "not closed"),
])
def test_a_yaml_syntax_error_says_what_is_probably_wrong(tmp_path: Path, text: str, line: int,
                                                        hint: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    result = load_backends([f], demo_fallback=False)
    (error,) = result.errors
    assert error.line == line and hint in str(error) and "bad.yaml" in str(error)
    assert "YAML error: " in str(error) and "(" in str(error)  # PyYAML's words stay too


def test_listed_as_names_one_of_its_own_names(tmp_path: Path, worker: Path) -> None:
    """``listed_as``: the name the model lists show in place of the backend's own (a
    llama-swap ID such as ``qwen2.5:7b``, which no backend name can be): one of its names."""
    good = write(tmp_path, "good.yaml", """
        name: qwen
        script: w/main.py
        api: [chat]
        aliases: ["qwen2.5:7b"]
        listed_as: "qwen2.5:7b"
    """)
    assert only(load(good)).listed_as == "qwen2.5:7b"
    bad = write(tmp_path, "bad.yaml", """
        name: qwen
        script: w/main.py
        api: [chat]
        listed_as: "qwen2.5:7b"
    """)
    (said,) = errors(load(bad))
    assert "listed_as" in said and "add it to aliases" in said
