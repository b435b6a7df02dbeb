"""vramd's descriptor files as vramd 0.3.9 reads them: interpolations, tool:, the measured
vram: block, where relative paths resolve, a warning for each key we cannot honour, and
``vramtui import-vramd``."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.backends import BackendSpec, LoadResult, VramSpec, load_backends
from supervisor.backends.schema import VramdSettings
from supervisor.backends.vramd_import import import_vramd, vramd_sources
from vramtui.cli import main

PY = sys.executable

# The shape of vramd's example data/backends.yaml (vramd 0.3.0 shipped these two examples).
EXAMPLE = """
version: 2
backends:
  - name: example-whisper
    adapter: my_whisper.adapter
    vram_mib: 4200
    priority: 20
    runtime:
      command: ["${env:WHISPER_PYTHON}", "-m", "my_whisper.worker"]
      cwd: ~/models/whisper
      env:
        HF_HOME: ~/hf-cache
      load_timeout_sec: 180
    load_keys: [device, compute_type, beam_size]
    shape_keys: [device, compute_type]

  - name: example-diffusion
    adapter: my_diffusion.adapter
    vram_mib: 6000
    priority: 40
    tool: my_diffusion
    footprint_key: flux-dev-uint4
    peak_profile:
      memory_efficient_with_quant: true
      group_offload_with_memory_efficient: true
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def venv_python(root: Path, folder: str) -> Path:
    python = root / folder / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(PY)
    return python


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # messages show paths relative to the working directory


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / "models" / "whisper").mkdir(parents=True)
    return home


def load(*paths: Path, env: dict[str, str], workdir: Path | None = None) -> LoadResult:
    return load_backends(list(paths), environ=env, demo_fallback=False, workdir=workdir)


def ok(result: LoadResult) -> dict[str, BackendSpec]:
    assert not result.errors, [str(e) for e in result.errors]
    return result.backends


def test_the_example_file_loads_with_a_warning_for_each_key_we_cannot_honour(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    tools = tmp_path / "tools"
    python = venv_python(tools, "My_diffusion")  # the tool's name, Capitalized
    file = write(tmp_path / "backends.yaml", EXAMPLE)
    env = {"HOME": str(home), "WHISPER_PYTHON": PY, "VRAMD_TOOLS_ROOT": str(tools)}
    result = load(file, env=env, workdir=tmp_path)
    specs = ok(result)
    whisper, diffusion = specs["example-whisper"], specs["example-diffusion"]
    assert whisper.command == (PY, "-m", "my_whisper.worker")
    assert whisper.cwd == home / "models" / "whisper"
    assert whisper.env == {"HF_HOME": f"{home}/hf-cache"}
    assert whisper.timeouts.start_s == 180  # runtime.load_timeout_sec
    assert whisper.protocol == "vramd"
    assert whisper.vramd == VramdSettings(load_keys=("device", "compute_type", "beam_size"),
                                          shape_keys=("device", "compute_type"))
    assert whisper.vram == VramSpec(peak_mib=4200) and whisper.priority == 20
    assert whisper.safety_mib == 384  # vramd's margin, which its numbers were tuned against
    # tool: → $VRAMD_TOOLS_ROOT/<Tool>/.venv/bin/python -m <tool> serve --ums-worker
    assert diffusion.command == (str(python), "-m", "my_diffusion", "serve", "--ums-worker")
    assert diffusion.cwd == tmp_path  # vramd's workers run where it was started
    assert diffusion.timeouts.start_s == 300  # vramd's default load timeout
    assert [str(w) for w in result.warnings] == [
        "backends.yaml:21: backend 'example-diffusion': field 'footprint_key': vramd's table "
        "of model footprints is not used here: the backend is sized from vram_mib (or its "
        "measured vram: block); measure it with `vramtui calibrate example-diffusion`",
        "backends.yaml:23: backend 'example-diffusion': field "
        "'peak_profile.memory_efficient_with_quant': a hint vramd adjusts its estimates with; "
        "vramtui does not: ignored (the figures are used as written)",
        "backends.yaml:24: backend 'example-diffusion': field "
        "'peak_profile.group_offload_with_memory_efficient': a hint vramd adjusts its "
        "estimates with; vramtui does not: ignored (the figures are used as written)",
    ]


def test_what_cannot_be_resolved_is_an_error_at_its_line(tmp_path: Path, home: Path) -> None:
    file = write(tmp_path / "backends.yaml", EXAMPLE)
    result = load(file, env={"HOME": str(home)}, workdir=tmp_path)
    assert result.backends == {}
    assert [str(e) for e in result.errors] == [
        "backends.yaml:8: backend 'example-whisper': field 'command': runtime.command: "
        "${env:WHISPER_PYTHON}: environment variable WHISPER_PYTHON is not set; set it (or "
        "write the value)",
        "backends.yaml:20: backend 'example-diffusion': field 'command': tool 'my_diffusion': "
        "VRAMD_TOOLS_ROOT is not set, so its venv cannot be found; set VRAMD_TOOLS_ROOT to the "
        "folder holding <tool>/.venv, or give runtime.command",
    ]
    tools = tmp_path / "tools"
    tools.mkdir()
    result = load(file, env={"HOME": str(home), "WHISPER_PYTHON": PY,
                             "VRAMD_TOOLS_ROOT": str(tools)}, workdir=tmp_path)
    (error,) = result.errors
    assert "no {my_diffusion/My_diffusion/MY_DIFFUSION/my-diffusion}/.venv/bin/python under " \
           f"VRAMD_TOOLS_ROOT ({tools})" in str(error)


def test_relative_paths_resolve_like_vramd_and_else_from_the_file_folder(
        tmp_path: Path) -> None:
    work, conf = tmp_path / "work", tmp_path / "conf"
    write(work / "examples" / "echo-backend" / "worker.py", "")
    write(conf / "worker.py", "")
    file = write(conf / "b.yaml", """
        version: 2
        backends:
          - name: from-cwd
            runtime: {command: ["${env:P}", "examples/echo-backend/worker.py", "--x", "a/b"]}
          - name: from-file-folder
            runtime: {command: ["${env:P}", "worker.py"]}
          - name: nowhere
            runtime: {command: ["${env:P}", "missing.py"]}
          - name: program
            runtime: {command: ["./bin/run"]}
        """)
    result = load(file, env={"P": PY, "HOME": str(tmp_path)}, workdir=work)
    specs = result.backends
    assert specs["from-cwd"].command == (PY, str(work / "examples/echo-backend/worker.py"),
                                         "--x", "a/b")  # a/b exists nowhere: a model id
    assert specs["from-file-folder"].command == (PY, str(conf / "worker.py"))
    assert specs["from-cwd"].cwd == specs["from-file-folder"].cwd == work
    assert [str(w) for w in result.warnings] == [
        f"conf/b.yaml:6: backend 'from-file-folder': field 'runtime.command': worker.py is not "
        f"in the working directory ({work}), where vramd looks: using the one in the file's "
        f"folder, {conf}/worker.py"]
    assert [str(e) for e in result.errors] == [
        f"conf/b.yaml:8: backend 'nowhere': field 'command': worker script missing.py does not "
        f"exist (looked in the working directory {work}, as vramd does, and in the file's "
        f"folder {conf})",
        f"conf/b.yaml:10: backend 'program': field 'command': program ./bin/run does not exist "
        f"(looked in the working directory {work}, as vramd does, and in the file's folder "
        f"{conf})",
    ]


def test_the_measured_vram_block_and_unload_frees_vram(tmp_path: Path) -> None:
    base = write(tmp_path / "a.yaml", """
        version: 2
        backends:
          - name: m
            adapter: x
            vram_mib: 9000
            runtime: {command: ["/bin/true"]}
            gpu_ids: [1]
        """)
    # vramd calibrate's output, as an overlay: the measured block wins over vram_mib
    measured = write(tmp_path / "b.yaml", """
        version: 2
        backends:
          - name: m
            vram:
              weights_gib: 3.42
              activation_gib: 1.5
              context_gib: 0.3
              peak_mib: 5240
              safety_mib: 200
              admit_peak_mib: 5440
            peak_profile: {quant_mode: none, unload_frees_vram: false, staged_load: true,
                           load_kwargs: {device: cuda}}
            measured: {confidence: high, repeats: 3}
        """)
    result = load(base, measured, env={"HOME": str(tmp_path)}, workdir=tmp_path)
    spec = ok(result)["m"]
    assert spec.vram == VramSpec(peak_mib=5240, weights_mib=3503, activation_mib=1536,
                                 context_mib=308)
    assert spec.resident == 3503 + 308  # weights + context stay; activation comes on top
    assert spec.safety_mib == 200 and spec.unload_frees_vram is False and spec.gpus == (1,)
    assert spec.protocol == "vramd" and spec.command == ("/bin/true",)  # kept from a.yaml
    assert result.warnings == ()  # records of the measurement are read without complaint
    # without peak_mib, the parts are the peak (the lower layer's vram_mib does not win)
    parts = write(tmp_path / "c.yaml", """
        version: 2
        backends:
          - {name: m, vram: {weights_gib: 1, activation_gib: 0.5}}
        """)
    spec = ok(load(base, parts, env={"HOME": str(tmp_path)}, workdir=tmp_path))["m"]
    assert spec.peak == 1536 and spec.resident == 1024


def test_protocol_interpolations_and_unknown_keys(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    text2icon = venv_python(tools, "Text2Icon")  # CamelCase at digits
    script = write(tmp_path / "w.py", "")
    file = write(tmp_path / "b.yaml", f"""
        version: 2
        backends:
          - name: ours
            runtime: {{command: ["${{env:P}}", "-m", "worker_sdk", "{script}"]}}
          - name: mono
            tool: text2icon
            runtime:
              command: ["${{monorepo:python}}", "-m", "text2icon", "--port=$5"]
              env: {{A: "${{env:UNSET}}", B: "${{monorepo:text2icon}}", C: 1}}
              event_timeout_sec: 30
              retries: 3
            calibrate_load_kwargs: {{compute_type: fp16}}
            peak_profile: {{quant_mode: sdnq-int4}}
            colour: blue
          - name: two
            protocol: vramd
            concurrency: 2
            runtime: {{command: ["/bin/true"]}}
        """)
    env = {"HOME": str(tmp_path), "P": PY, "VRAMD_TOOLS_ROOT": str(tools)}
    result = load(file, env=env, workdir=tmp_path)
    ours, mono = result.backends["ours"], result.backends["mono"]
    assert ours.protocol == "vramtui" and ours.command == (PY, "-m", "worker_sdk", str(script))
    assert mono.protocol == "vramd"
    assert mono.command == (str(text2icon), "-m", "text2icon", "--port=$5")  # $ is literal
    assert mono.env == {"B": str(text2icon), "C": "1"}  # A: unset, left out as vramd does
    assert mono.vramd == VramdSettings(load_kwargs={"compute_type": "fp16"},
                                       event_timeout_s=30.0)
    assert [(w.field, w.message.split(":")[0]) for w in result.warnings] == [
        ("colour", "not a vramd key vramtui knows"),
        ("runtime.retries", "not a vramd runtime key vramtui knows"),
        ("runtime.env.A", "${env"),
        ("peak_profile.quant_mode", "the vram"),
    ]
    assert [str(e) for e in result.errors] == [
        "b.yaml:17: backend 'two': field 'concurrency': a vramd worker runs one request at a "
        "time: leave 'concurrency' out (or 1)"]


def test_our_own_format_can_say_protocol_vramd(tmp_path: Path) -> None:
    file = write(tmp_path / "b.yaml", """
        - name: v
          command: /bin/true
          protocol: vramd
          unload_frees_vram: false
          vramd: {load_keys: [device], load_kwargs: {device: cpu}, event_timeout: never}
        - {name: w, command: /bin/true, vramd: {load_keys: [a]}}
        - {name: x, command: /bin/true, protocol: jsonrpc}
        """)
    result = load(file, env={"HOME": str(tmp_path)}, workdir=tmp_path)
    spec = result.backends["v"]
    assert (spec.protocol, spec.unload_frees_vram) == ("vramd", False)
    assert spec.vramd == VramdSettings(load_keys=("device",), load_kwargs={"device": "cpu"},
                                       event_timeout_s=None)
    assert [str(e) for e in result.errors] == [
        "b.yaml:6: backend 'w': field 'vramd': settings for a vramd worker: they go with "
        "'protocol: vramd'",
        "b.yaml:7: backend 'x': field 'protocol': 'jsonrpc' is not a worker protocol (one of: "
        "vramtui, vramd)",
    ]


def test_import_vramd_writes_our_spelling_that_loads_back_the_same(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    tools = tmp_path / "tools"
    venv_python(tools, "my_diffusion")
    file = write(tmp_path / "backends.yaml", EXAMPLE.replace(
        "HF_HOME: ~/hf-cache", "HF_HOME: ~/hf-cache\n        HF_TOKEN: ${env:TOKEN}"))
    for key, value in {"HOME": str(home), "WHISPER_PYTHON": PY, "TOKEN": "s3cret",
                       "VRAMD_TOOLS_ROOT": str(tools)}.items():
        monkeypatch.setenv(key, value)
    imported = import_vramd([file], environ=dict(os.environ), workdir=tmp_path)
    assert "s3cret" not in imported.text and "${TOKEN}" in imported.text
    assert "${WHISPER_PYTHON}" in imported.text
    assert imported.names == ("example-whisper", "example-diffusion")
    assert len(imported.warnings) == 3 and imported.errors == ()

    out = tmp_path / "cfg" / "from-vramd.yaml"
    assert main(["import-vramd", str(file), "--out", str(out)]) == 0
    written = out.read_text()
    direct = load(file, env=dict(os.environ), workdir=tmp_path).backends
    back = load(out, env=dict(os.environ), workdir=tmp_path).backends
    assert {n: s.__class__(**{**s.__dict__, "source": ""}) for n, s in back.items()} == \
        {n: s.__class__(**{**s.__dict__, "source": ""}) for n, s in direct.items()}
    err = capsys.readouterr().err
    assert err.count("vramtui: warning: ") == 3 and "footprint_key" in err
    # an existing file is not replaced; a backend that cannot be converted writes nothing
    assert main(["import-vramd", str(file), "--out", str(out)]) == 2
    monkeypatch.delenv("WHISPER_PYTHON")
    assert main(["import-vramd", str(file), "--out", str(out), "--force"]) == 2
    assert out.read_text() == written
    err = capsys.readouterr().err
    assert "exists: pass --force" in err and "WHISPER_PYTHON is not set" in err
    assert "nothing written" in err


def test_import_vramd_finds_the_files_vramd_reads(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "home" / ".config" / "vramd" / "backends.d"
    write(conf / "b.yaml", "version: 2\nbackends: [{name: a, runtime: {command: [/bin/true]}}]")
    write(conf / "a.yml", "version: 2\nbackends: []")
    listed = write(tmp_path / "x.yaml", "version: 2\nbackends: []")
    env = {"HOME": str(tmp_path / "home"), "VRAMD_BACKENDS_FILE": str(listed)}
    assert vramd_sources(env) == [listed, conf / "a.yml", conf / "b.yaml"]
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.delenv("VRAMD_BACKENDS_FILE", raising=False)
    monkeypatch.delenv("VRAMD_BACKENDS_DIR", raising=False)
    assert main(["import-vramd"]) == 2


@pytest.mark.process
def test_the_warnings_reach_the_engine_log_and_doctor(tmp_path: Path, home: Path) -> None:
    from supervisor import Supervisor
    from supervisor.paths import Paths
    from vramtui.cli.doctor import WARN, Report, check_backends

    tools = tmp_path / "tools"
    venv_python(tools, "my_diffusion")
    file = write(tmp_path / "backends.yaml", EXAMPLE)
    env = {"HOME": str(home), "WHISPER_PYTHON": PY, "VRAMD_TOOLS_ROOT": str(tools),
           "VRAMTUI_RUNTIME_DIR": str(tmp_path / "run"),
           "VRAMTUI_STATE_DIR": str(tmp_path / "state"),
           "VRAMTUI_CONFIG_DIR": str(tmp_path / "cfg")}
    paths = Paths.from_env(env)
    sup = Supervisor.from_config(gpus="sim:8GiB", backends=[file], environ=env, paths=paths)
    sup.start_in_thread()
    try:
        logged = [(line.level, line.backend, line.text) for line in sup.snapshot().log
                  if line.text.startswith("descriptor warning")]
    finally:
        sup.stop(timeout=30)
    assert [(level, backend) for level, backend, _ in logged] == \
        [("warning", "example-diffusion")] * 3
    assert all(text.startswith("descriptor warning: backends.yaml:") for *_, text in logged)
    report = Report()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        check_backends(report, paths, [str(file)])
    warned = [c["detail"] for c in report.checks if c["status"] == WARN]
    assert len(warned) == 3 and "footprint_key" in warned[0]


def test_import_vramd_anchors_our_own_relative_paths_at_the_files_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys of ours in a vramd file (script:, python:, a command's ./program) are relative to
    the file's folder: the converted file, written elsewhere, says them absolute. Its own
    load-back check ran in a scratch folder and died as an internal error (exit 70)."""
    src = tmp_path / "src $x"
    sim = Path(__file__).resolve().parents[1] / "examples" / "demo" / "simmodel.py"
    write(src / "simmodel.py", sim.read_text())
    venv_python(src, "tool")
    write(src / "bin" / "serve.sh", "#!/bin/sh\n").chmod(0o755)
    file = write(src / "v.yaml", """
        version: 2
        backends:
          - name: v1
            script: simmodel.py
            python: tool/.venv/bin/python
          - name: v2
            command: ./bin/serve.sh --port 1
            protocol: vramd
        """)
    monkeypatch.chdir(tmp_path)  # not the file's folder
    out = tmp_path / "cfg" / "from-vramd.yaml"
    assert main(["import-vramd", str(file.relative_to(tmp_path)), "--out", str(out)]) == 0
    written = out.read_text()
    assert f"script: {tmp_path}/src $$x/simmodel.py" in written  # $$: a literal $
    direct = ok(load(file, env=dict(os.environ), workdir=tmp_path))
    back = ok(load(out, env=dict(os.environ), workdir=tmp_path))
    assert {n: s.__class__(**{**s.__dict__, "source": ""}) for n, s in back.items()} == \
        {n: s.__class__(**{**s.__dict__, "source": ""}) for n, s in direct.items()}
    assert direct["v1"].command[-1] == str(src / "simmodel.py")
    assert direct["v2"].command[0] == str(src / "bin" / "serve.sh")


def test_import_vramd_reads_a_folder_as_vramd_reads_its_backends_d(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder said '/tmp: no such file', though the default it reads is a folder."""
    conf = tmp_path / "backends.d"
    write(conf / "b.yaml", "version: 2\nbackends: [{name: b, runtime: {command: [/bin/true]}}]")
    write(conf / "a.yml", "version: 2\nbackends: [{name: a, runtime: {command: [/bin/true]}}]")
    write(conf / "notes.txt", "not read")
    assert main(["import-vramd", str(conf), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backends"] == ["a", "b"]
    assert out["files"] == [str(conf / "a.yml"), str(conf / "b.yaml")]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["import-vramd", str(empty)]) == 2
    assert capsys.readouterr().err == (f"vramtui: error: {empty}: a folder with no *.yaml or "
                                       "*.yml file in it: name the vramd file\n")
    assert main(["import-vramd", str(tmp_path / "gone")]) == 2
    assert "gone: no such file or folder\n" in capsys.readouterr().err
