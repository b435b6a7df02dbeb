"""llama-swap's config.yaml read as our descriptors: macros, multi-line cmd, groups, hooks, and a
one-line report for everything that is not mapped (never silent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.backends.errors import DescriptorError, DescriptorWarning
from supervisor.backends.llama_swap import from_llama_swap, is_llama_swap
from supervisor.backends.yamlio import load_documents

CONFIG = """\
# a llama-swap config, as its users write them
healthCheckTimeout: 300
startPort: 10001
logLevel: info
apiKeys: [sk-local]
globalTTL: 600

macros:
  "llama": >
    /opt/llama.cpp/llama-server
    --host 127.0.0.1 --port ${PORT}
  "ctx": 16384
  "gguf": "/models/${MODEL_ID}.gguf"

models:
  "qwen2.5-7b":
    name: Qwen 2.5 7B
    description: "general chat"
    cmd: |
      ${llama}
      # the model file, from a macro that uses another
      -m ${gguf}
      -c ${ctx} \\
        -np 4
      --alias "${MODEL_ID}" --api-key '$SECRET'
    aliases: [gpt-4o-mini, "qwen"]
    env:
      - "CUDA_DEVICE_ORDER=PCI_BUS_ID"
      - "HF_TOKEN=${env.HF_TOKEN}"
    ttl: 120
    concurrencyLimit: 2
    filters:
      stripParams: "temperature, top_p"

  "org/embed:v1":
    macros:
      ctx: 2048
    cmd: ${llama} -m /models/embed.gguf -c ${ctx} --embeddings
    checkEndpoint: none
    useModelName: nomic-embed
    unlisted: true
    ttl: 0

  "vllm":
    cmd: >
      docker run --name ${MODEL_ID} --rm -p 9000:8000 vllm/vllm-openai
      --model Qwen/Qwen2.5-1.5B
    cmdStop: docker stop ${MODEL_ID}
    proxy: http://127.0.0.1:9000
    checkEndpoint: /v1/models
    unloadTimeout: 30
    healthCheckTimeout: 600

groups:
  "chat":
    swap: true
    exclusive: false
    members: ["qwen2.5-7b", "vllm", "nonesuch"]
  "always":
    persistent: true
    members: ["org/embed:v1"]

hooks:
  on_startup:
    preload: ["qwen"]   # an alias names a model here too
"""


def _read(tmp_path: Path, text: str = CONFIG, environ: dict[str, str] | None = None):
    file = tmp_path / "config.yaml"
    file.write_text(text)
    (doc,) = load_documents(file)
    assert is_llama_swap(doc)
    items = list(from_llama_swap(doc, file, environ or {}, tmp_path / "wd"))
    entries = {e["name"]: e for e, _ in (i for i in items if isinstance(i, tuple))}
    warnings = [i for i in items if isinstance(i, DescriptorWarning)]
    errors = [i for i in items if isinstance(i, DescriptorError)
              and not isinstance(i, DescriptorWarning)]
    return entries, warnings, errors


def test_models_become_server_backends(tmp_path: Path) -> None:
    entries, warnings, errors = _read(tmp_path)
    assert errors == []
    assert set(entries) == {"qwen2.5-7b", "org-embed-v1", "vllm"}
    qwen = entries["qwen2.5-7b"]
    # the multi-line cmd: macros in macros, a comment line, a backslash-newline, quotes,
    # and a literal $ (llama-swap starts no shell) written $$ in our spelling
    assert qwen["command"] == [
        "/opt/llama.cpp/llama-server", "--host", "127.0.0.1", "--port", "${PORT}",
        "-m", "/models/qwen2.5-7b.gguf", "-c", "16384", "-np", "4",
        "--alias", "qwen2.5-7b", "--api-key", "$$SECRET"]
    assert qwen["env"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "HF_TOKEN": "${HF_TOKEN}"}
    assert qwen["http"] == {"ready_timeout": "300s"}  # the default proxy and /health
    assert qwen["keep_alive"] == "120s"
    assert qwen["concurrency"] == 2
    assert qwen["aliases"] == ["gpt-4o-mini", "qwen"]
    assert qwen["description"] == "Qwen 2.5 7B — general chat"
    assert qwen["api"] == ["chat", "completions", "embeddings"]
    assert qwen["preload"] is True and "pinned" not in qwen
    # each key keeps the line it came from, so a bad value is reported where it was written
    assert qwen.key_line("command") == CONFIG.splitlines().index("    cmd: |") + 1

    embed = entries["org-embed-v1"]
    assert embed["command"][-3:] == ["-c", "2048", "--embeddings"]  # the model's own macro
    assert embed["http"]["health"] == "none"
    assert embed["http"]["model_name"] == "nomic-embed"
    assert embed["aliases"] == ["org/embed:v1"]  # its ID still reaches it
    assert embed["unlisted"] is True and embed["pinned"] is True
    assert embed["keep_alive"] == "never"

    vllm = entries["vllm"]
    # (a model's own healthCheckTimeout: llama-swap sets every model's to the top-level one)
    assert vllm["http"] == {"url": "http://127.0.0.1:9000", "health": "/v1/models",
                            "stop": ["docker", "stop", "vllm"], "ready_timeout": "300s"}
    assert vllm["timeouts"] == {"stop_grace": "30s"}
    assert vllm["keep_alive"] == "600s"  # globalTTL
    assert vllm["concurrency"] == 10  # llama-swap's default concurrencyLimit


def test_what_is_not_mapped_is_said_once_each(tmp_path: Path) -> None:
    _, warnings, _ = _read(tmp_path)
    text = [str(w) for w in warnings]
    assert all("\n" not in t for t in text)
    for needle in ("'logLevel' is not used", "'apiKeys' is not used", "startPort",
                   "'filters' is not used", "model 'org/embed:v1' is backend 'org-embed-v1'",
                   "'nonesuch' is not a model of this file",
                   "group 'chat' (qwen2.5-7b, vllm; swap: true, exclusive: false)",
                   "persistent: its members are pinned"):
        assert sum(needle in t for t in text) == 1, (needle, text)
    assert any(t.startswith("config.yaml:") or "/config.yaml:" in t for t in text)


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"cmd": "${nope} -m x"}, "cmd", "unknown macro '${nope}'"),
    ({"cmd": "server --port 9", "proxy": "http://localhost:${PORT}"}, "proxy",
     "proxy uses ${PORT} but cmd does not"),
    ({"cmd": "server --port ${PORT}", "ttl": "soon"}, "ttl", "not a whole number of seconds"),
    ({"cmd": "server --port 9"}, "cmd", "cmd does not take ${PORT}"),
    ({}, "cmd", "a model needs 'cmd'"),
    ({"cmd": ["s", "${PORT}"]}, "cmd", "is not a command line"),
    ({"cmd": "server --port ${PORT}", "unlisted": "yes"}, "unlisted", "not true or false"),
])
def test_a_bad_model_is_one_error_and_the_others_load(tmp_path: Path, change: dict,
                                                      field: str, message: str) -> None:
    import yaml

    bad = {"models": {"bad": change, "good": {"cmd": "server --port ${PORT}"}}}
    entries, _, errors = _read(tmp_path, yaml.safe_dump(bad))
    assert set(entries) == {"good"}
    assert len(errors) == 1 and errors[0].field == field and message in errors[0].message
    assert errors[0].backend == "bad"


def test_reserved_and_self_referring_macros_are_refused(tmp_path: Path) -> None:
    for macros, message in (({"PORT": 1}, "reserved"), ({"a": "x${a}"}, "refers to itself")):
        import yaml

        text = yaml.safe_dump({"macros": macros, "models": {"m": {"cmd": "s ${PORT}"}}})
        entries, _, errors = _read(tmp_path, text)
        assert entries == {} and message in errors[0].message
    # a model's own bad macro: one line, the model left out
    text = yaml.safe_dump({"models": {"m": {"cmd": "s ${PORT}", "macros": {"a": "${a}"}}}})
    entries, _, errors = _read(tmp_path, text)
    assert entries == {} and [e.message for e in errors] == ["macro 'a' refers to itself"]


def test_env_macros_outside_cmd_are_read_now(tmp_path: Path) -> None:
    text = ("models:\n  m:\n    cmd: s --port ${PORT}\n"
            "    proxy: http://${env.HOST_X}:${PORT}\n")
    entries, _, errors = _read(tmp_path, text, {"HOST_X": "10.0.0.2"})
    assert errors == [] and entries["m"]["http"]["url"] == "http://10.0.0.2:${PORT}"
    _, _, errors = _read(tmp_path, text, {})
    assert "HOST_X is not set" in errors[0].message


def test_odd_groups_and_hooks_are_said_and_ignored(tmp_path: Path) -> None:
    text = ("models:\n  m:\n    cmd: s --port ${PORT}\ngroups: [a]\nhooks: nope\n")
    entries, warnings, errors = _read(tmp_path, text)
    assert errors == [] and set(entries) == {"m"}
    assert sorted(w.field for w in warnings) == ["groups", "hooks"]


def test_other_files_are_not_taken_for_llama_swap() -> None:
    assert not is_llama_swap({"name": "x", "models": {}})
    assert not is_llama_swap({"backends": [], "models": {}})
    assert not is_llama_swap({"models": ["a"]})


def test_backends_flag_loads_the_file_unchanged(tmp_path: Path) -> None:
    """What --backends config.yaml does: the loader takes the file as it is."""
    import math
    import sys

    from supervisor.backends.loader import load_backends

    file = tmp_path / "config.yaml"
    file.write_text(CONFIG.replace("/opt/llama.cpp/llama-server", sys.executable))
    result = load_backends([file], environ={"HF_TOKEN": "hf-1", "HOME": str(tmp_path)},
                           demo_fallback=False)
    assert [str(e) for e in result.errors] == []
    assert set(result.backends) == {"qwen2.5-7b", "org-embed-v1", "vllm"}
    qwen = result.backends["qwen2.5-7b"]
    assert qwen.server and qwen.http is not None and qwen.http.health == "/health"
    assert qwen.command[3:5] == ("--port", "${PORT}")  # filled in by the engine at start
    assert qwen.command[-1] == "$SECRET" and qwen.env["HF_TOKEN"] == "hf-1"
    assert (qwen.keep_alive_s, qwen.concurrency, qwen.preload) == (120.0, 2, True)
    assert qwen.http.ready_timeout_s == 300.0
    embed = result.backends["org-embed-v1"]
    assert embed.http is not None and embed.http.health is None
    assert embed.http.model_name == "nomic-embed" and embed.aliases == ("org/embed:v1",)
    assert embed.unlisted and embed.pinned and math.isinf(embed.keep_alive_s)
    vllm = result.backends["vllm"]
    assert vllm.http is not None and vllm.http.stop == ("docker", "stop", "vllm")
    assert vllm.http.url == "http://127.0.0.1:9000" and vllm.timeouts.stop_grace_s == 30.0
    assert any("'logLevel' is not used" in str(w) for w in result.warnings)


def test_a_gpu_pinned_by_cuda_visible_devices_is_our_gpus(tmp_path: Path) -> None:
    text = ("models:\n  one:\n    cmd: s --port ${PORT}\n"
            "    env: [CUDA_VISIBLE_DEVICES=1, A=b]\n"
            "  two:\n    cmd: s --port ${PORT}\n    env: ['CUDA_VISIBLE_DEVICES=0,1']\n")
    entries, warnings, errors = _read(tmp_path, text)
    assert errors == []
    assert entries["one"]["gpus"] == [1] and entries["one"]["env"] == {"A": "b"}
    assert entries["two"]["env"] == {"CUDA_VISIBLE_DEVICES": "0,1"} and "gpus" not in entries["two"]
    assert any("CUDA_VISIBLE_DEVICES=0,1 is kept" in str(w) for w in warnings)


def test_cmd_stop_on_the_pid_is_left_to_the_engine(tmp_path: Path) -> None:
    text = ("models:\n  m:\n    cmd: s --port ${PORT}\n    cmdStop: kill -TERM ${PID}\n")
    entries, warnings, errors = _read(tmp_path, text)
    assert errors == [] and "stop" not in entries["m"]["http"]
    assert any("signals ${PID}" in str(w) for w in warnings)


def test_import_writes_one_descriptor_per_model_that_loads_back_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from supervisor.backends.loader import load_backends
    from vramtui.cli import main

    monkeypatch.setenv("HF_TOKEN", "s3cret")
    file = tmp_path / "llama-swap" / "config.yaml"
    file.parent.mkdir()
    file.write_text(CONFIG.replace("/opt/llama.cpp/llama-server", sys.executable))
    out = tmp_path / "backends.d"
    assert main(["import-llama-swap", str(file), "-o", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["org-embed-v1.yaml", "qwen2.5-7b.yaml", "vllm.yaml"]
    qwen = (out / "qwen2.5-7b.yaml").read_text()
    assert "s3cret" not in qwen and "${HF_TOKEN}" in qwen
    err = capsys.readouterr().err
    assert "vramtui: note: " in err and "'apiKeys' is not used" in err
    assert f"vramtui reads them with `--backends {out}`" in err  # not read at start
    direct = load_backends([file], demo_fallback=False).backends
    back = load_backends([out], demo_fallback=False).backends
    assert {n: s.__class__(**{**s.__dict__, "source": ""}) for n, s in back.items()} == \
        {n: s.__class__(**{**s.__dict__, "source": ""}) for n, s in direct.items()}
    # nothing is replaced without --force, and then every file is
    (out / "vllm.yaml").write_text("# mine\n")
    assert main(["import-llama-swap", str(file), "-o", str(out)]) == 2
    assert (out / "vllm.yaml").read_text() == "# mine\n"
    assert "exist(s) already: pass --force" in capsys.readouterr().err
    assert main(["import-llama-swap", str(file), "-o", str(out), "--force"]) == 0
    assert (out / "vllm.yaml").read_text().startswith("# vllm: converted")
    # a folder that cannot be written, or a folder in the way of one file: one line, and
    # nothing is written (not the files before it)
    capsys.readouterr()
    fresh = tmp_path / "fresh"
    (fresh / "vllm.yaml").mkdir(parents=True)
    for where in (fresh, file):  # (the second: a file where the folder would be)
        assert main(["import-llama-swap", str(file), "-o", str(where), "--force"]) == 2
        err = capsys.readouterr().err
        assert "nothing written" in err and "internal error" not in err, err
        errors = [line for line in err.splitlines() if not line.startswith("vramtui: note:")]
        assert len(errors) == 1, err
    assert [p.name for p in fresh.iterdir()] == ["vllm.yaml"]  # no temporary left either
    # a model that cannot be read: named with the reason, and nothing is written
    broken = tmp_path / "broken.yaml"
    broken.write_text("models:\n  ok:\n    cmd: s --port ${PORT}\n  bad:\n    cmd: ${nope}\n")
    assert main(["import-llama-swap", str(broken), "-o", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "not converted" in err and "unknown macro '${nope}'" in err
    assert "nothing written" in err and not (tmp_path / "none").exists()
    # not a llama-swap file: one line, no traceback
    other = tmp_path / "other.yaml"
    other.write_text("name: x\ncommand: [x]\n")
    assert main(["import-llama-swap", str(other), "-o", str(out)]) == 2
    assert "not a llama-swap config" in capsys.readouterr().err


def test_values_llama_swap_reads_its_own_way_are_said(tmp_path: Path) -> None:
    text = """
healthCheckTimeout: 0
models:
  null:
    cmd: server --port ${PORT}
  quick:
    cmd: llama-server --port ${PORT} -np 3
    concurrencyLimit: 0
"""
    entries, warnings, errors = _read(tmp_path, text)
    assert [e.message for e in errors] == [
        "a model ID is null, not text: quote it, or name the model"]
    quick = entries["quick"]
    assert quick["http"]["ready_timeout"] == "15s"  # llama-swap's minimum, as there
    assert quick["concurrency"] == 3  # 0 is llama-swap's default: -np says it
    said = {w.field: w.message for w in warnings}
    assert "under llama-swap's minimum" in said["healthCheckTimeout"]
    assert "0 is llama-swap's default" in said["concurrencyLimit"]


# -- as llama-swap reads them (each case below was read otherwise once) -----------------------
def _warned(warnings: list, needle: str) -> bool:
    return any(needle in str(w) for w in warnings)


def test_an_id_keeps_its_name_and_wins_over_an_alias(tmp_path: Path) -> None:
    """llama-swap looks a model up by its ID first: a name made of another ID ("a/b") must
    not take "a-b", nor may another model's alias take an ID."""
    entries, warnings, errors = _read(tmp_path, """\
models:
  "a/b": {cmd: "s --port ${PORT}"}
  "a-b": {cmd: "s --port ${PORT}"}
  beta: {cmd: "s --port ${PORT}", aliases: ["org/m:7b", gamma]}
  "org/m:7b": {cmd: "s --port ${PORT}"}
  delta: {cmd: "s --port ${PORT}", aliases: [gamma, "a-b-2"]}
""")
    assert errors == []
    assert entries["a-b"]["command"][0] == "s" and "aliases" not in entries["a-b"]
    assert entries["a-b-3"]["aliases"] == ["a/b"]  # (a-b-2 is delta's alias)
    assert entries["beta"]["aliases"] == ["gamma"]  # org/m:7b is a model's own ID
    assert entries["org-m-7b"]["aliases"] == ["org/m:7b"]
    assert entries["delta"]["aliases"] == ["a-b-2"]  # gamma is beta's already
    assert _warned(warnings, "alias 'org/m:7b' is left out: it is another model's ID")
    assert _warned(warnings, "alias 'gamma' is left out: model 'beta' has it already")


def test_a_null_alias_is_left_out_not_named_none(tmp_path: Path) -> None:
    """``aliases: [1, null]`` gave the model an alias "None"; a number is its text, as Go's
    yaml reads it into a string."""
    entries, warnings, errors = _read(tmp_path, """\
models:
  m: {cmd: "s --port ${PORT}", aliases: [1, null, [x]]}
""")
    assert errors == [] and entries["m"]["aliases"] == ["1"]
    assert _warned(warnings, "an alias that is empty or not a name")

def test_macro_values_are_written_as_llama_swap_writes_them(tmp_path: Path) -> None:
    entries, _, errors = _read(tmp_path, """\
macros: {fa: on, mmap: no, temp: 1.0, base: 1000000.0, x: 1e3, n: 017, t: true}
models:
  m:
    cmd: |
      s --port ${PORT} --fa ${fa} --mmap ${mmap} --temp ${temp}
      --rope ${base} --x ${x} -n ${n} --t ${t}
""")
    assert errors == []
    assert entries["m"]["command"][3:] == ["--fa", "on", "--mmap", "no", "--temp", "1",
                                           "--rope", "1e+06", "--x", "1000", "-n", "15",
                                           "--t", "true"]
    _, _, errors = _read(tmp_path, "macros:\n  draft:\nmodels:\n  m: {cmd: 's ${PORT}'}\n")
    assert len(errors) == 1 and "has no value" in errors[0].message
    # a model ID YAML reads as a number keeps its own macros; a macro may be named "on";
    # an empty globalTTL is its default (0: never), as in llama-swap
    entries, _, errors = _read(tmp_path, """\
macros: {on: "--flash-attn on"}
globalTTL:
models:
  7: {macros: {a: x}, cmd: "s --port ${PORT} --x ${a} ${on}"}
""")
    assert errors == [] and entries["7"]["command"][3:] == ["--x", "x", "--flash-attn", "on"]
    assert entries["7"]["keep_alive"] == "never"


def test_env_macros_are_read_in_every_value(tmp_path: Path) -> None:
    environ = {"SERVED": "qwen", "TTL": "120", "CHK": "/ready", "PORT": "9999", "HF": "tok"}
    entries, _, errors = _read(tmp_path, """\
models:
  m:
    cmd: s --port ${PORT} --upstream ${env.PORT} --token ${env.HF}
    useModelName: "${env.SERVED}"
    ttl: ${env.TTL}
    checkEndpoint: "${env.CHK}"
    aliases: ["${env.SERVED}-chat"]
""", environ)
    assert errors == []
    m = entries["m"]
    # ${env.PORT} is the user's PORT, read now, not the engine's ${PORT}; other env macros
    # in cmd stay ours, read each time the file is loaded
    assert m["command"] == ["s", "--port", "${PORT}", "--upstream", "9999", "--token", "${HF}"]
    assert m["http"]["model_name"] == "qwen" and m["http"]["health"] == "/ready"
    assert m["keep_alive"] == "120s" and m["aliases"] == ["qwen-chat"]
    # a value of several words is several words, as llama-swap splits the text it read in
    # (it was one word, "-ngl 99 -c 4096", which llama-server refused)
    entries, warnings, errors = _read(tmp_path, """\
models:
  m:
    cmd: s --port ${PORT} ${env.ARGS} --token ${env.HF} --say "${env.QUOTED}"
""", {"ARGS": "-ngl 99 -c '4 096'", "HF": "tok", "QUOTED": "two words"})
    assert errors == []
    assert entries["m"]["command"] == ["s", "--port", "${PORT}", "-ngl", "99", "-c", "4 096",
                                       "--token", "${HF}", "--say", "two words"]
    # (said: their values are in the descriptor now, where a one-word token stays ${HF})
    said = [w.message for w in warnings if w.field == "cmd"]
    assert len(said) == 1 and "${env.ARGS}, ${env.QUOTED} holds several words" in said[0]
    for odd in ("!!int abc", "7" * 5000, "[1"):  # one line each, never a traceback
        _, _, errors = _read(tmp_path, "models:\n  m: {cmd: 's ${PORT}', ttl: '${env.T}'}\n",
                             {"T": odd})
        assert len(errors) == 1 and "not a whole number" in errors[0].message, errors


def test_top_level_values_get_the_global_macros(tmp_path: Path) -> None:
    entries, _, errors = _read(tmp_path, """\
macros: {gttl: 300, hct: 600, first: m}
globalTTL: ${gttl}
healthCheckTimeout: ${hct}
hooks: {on_startup: {preload: [" ${first} "]}}
models:
  m: {cmd: "s --port ${PORT}"}
""")
    assert errors == []
    m = entries["m"]
    assert m["keep_alive"] == "300s" and m["http"]["ready_timeout"] == "600s"
    assert m["preload"] is True


def test_commands_split_as_llama_swap_splits_them(tmp_path: Path) -> None:
    entries, _, errors = _read(tmp_path, r"""
macros:
  extra: |
    --no-mmap
    # --flash-attn on
models:
  m:
    cmd: |
      s --port ${PORT}
      ${extra}
      --model "\$HOME/m.gguf" --say "a \q b" 'single \$' --open "runs to the end
""")
    assert errors == []
    assert entries["m"]["command"] == ["s", "--port", "${PORT}", "--no-mmap", "--model",
                                       "$$HOME/m.gguf", "--say", "a \\q b", "single \\$$",
                                       "--open", "runs to the end\n"]


def test_timeouts_take_llama_swaps_defaults(tmp_path: Path) -> None:
    entries, warnings, errors = _read(tmp_path, """\
globalTTL: 60
unloadTimeout: 0
models:
  a: {cmd: "s --port ${PORT}"}
  b: {cmd: "s --port ${PORT}", unloadTimeout: 0, ttl: -1, healthCheckTimeout: 900}
  c: {cmd: "s --port ${PORT}", unloadTimeout: 5, ttl: 0, checkEndpoint: ready}
  d: {cmd: "s --port ${PORT}", env: [NOEQUALS, "A=1"]}
""")
    assert errors == []
    for name in ("a", "b"):
        assert entries[name]["timeouts"] == {"stop_grace": "10s"}
        assert entries[name]["keep_alive"] == "60s"
        assert entries[name]["http"]["ready_timeout"] == "120s"
    assert entries["c"]["timeouts"] == {"stop_grace": "5s"}
    assert entries["c"]["keep_alive"] == "never" and entries["c"]["http"]["health"] == "/ready"
    assert entries["d"]["env"] == {"A": "1"}
    assert _warned(warnings, "a model's own is not read by llama-swap")
    assert _warned(warnings, "'NOEQUALS' is not K=V: left out")


def test_what_llama_swap_refuses_is_said(tmp_path: Path) -> None:
    _, warnings, _ = _read(tmp_path, """\
groups:
  g1: {members: [m, n, n]}
  g2: {members: [n]}
models:
  m:
    cmd: s --port ${PORT}
    filters: {setParamsByID: {"m:high": {reasoning: high}}}
  n: {cmd: "s --port ${PORT}"}
""")
    assert _warned(warnings, "'n' is in it twice")
    assert _warned(warnings, "'n' is in group 'g1' too")
    assert _warned(warnings, "setParamsByID ('m:high') are not served")


def test_import_names_a_concurrency_limit_it_cannot_map_and_a_huge_ttl_is_never(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """They became keep_alive 99999999999999999999999s and concurrency 99999999999999999999,
    which the engine then loaded; now the concurrency is one 'not converted' line at its
    line, and a ttl of more than a year (a config llama-swap runs) is keep_alive never."""
    from vramtui.cli import main

    file = tmp_path / "config.yaml"
    file.write_text("models:\n  big:\n    cmd: /bin/true --port ${PORT}\n"
                    "    ttl: 99999999999999999999999\n"
                    "    concurrencyLimit: 99999999999999999999\n"
                    "  ok:\n    cmd: /bin/true --port ${PORT}\n")
    out = tmp_path / "out"
    assert main(["import-llama-swap", str(file), "-o", str(out)]) == 2
    assert not out.exists()
    errors = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("vramtui: error: not converted")]
    assert len(errors) == 1, errors
    assert ":5: backend 'big': field 'concurrency'" in errors[0]
    assert "too large (the most is 65536)" in errors[0]
    file.write_text("models:\n  big:\n    cmd: /bin/true --port ${PORT}\n"
                    "    ttl: 99999999999999999999999\n  year:\n"
                    "    cmd: /bin/true --port ${PORT}\n    ttl: 99999999\n")
    assert main(["import-llama-swap", str(file), "-o", str(out)]) == 0, capsys.readouterr()
    written = "\n".join(f.read_text() for f in sorted(out.iterdir()))
    assert written.count("keep_alive: never") == 2 and "99999" not in written, written


def test_import_of_a_folder_says_it_is_one(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """It said '/tmp: no such file'."""
    from vramtui.cli import main

    assert main(["import-llama-swap", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"vramtui: error: {tmp_path}: is a directory: name a file in it\n"
    assert main(["import-llama-swap", str(tmp_path / "gone.yaml")]) == 2
    assert "gone.yaml: no such file\n" in capsys.readouterr().err


def test_a_llama_swap_file_is_read_once(tmp_path: Path) -> None:
    # Its Go-style reading comes from the text its check was made on, never a second read by
    # name (a file swapped in between would have given its values to the checked one).
    file = tmp_path / "config.yaml"
    file.write_text("macros: {fa: on}\nmodels:\n  m: {cmd: 's --port ${PORT} --fa ${fa}'}\n")
    (doc,) = load_documents(file)
    file.write_text("macros: {fa: evil}\nmodels:\n  m: {cmd: 's --port ${PORT} --fa ${fa}'}\n")
    items = list(from_llama_swap(doc, file, {}))
    entries = {e["name"]: e for e, _ in (i for i in items if isinstance(i, tuple))}
    assert entries["m"]["command"][3:] == ["--fa", "on"]


def test_a_model_id_of_any_printable_text_reaches_its_model(tmp_path: Path) -> None:
    """llama-swap's model IDs are any YAML key: ``My Model``, ``模型``. The ID became a
    backend name and was kept as an alias only when it was ASCII without blanks, so a
    client asking for the model by its own ID got "model not found"."""
    entries, _, errors = _read(tmp_path, """\
models:
  "My Model": {cmd: "s --port ${PORT}", aliases: ["другое имя", " padded", "tab\\there"]}
  "模型": {cmd: "s --port ${PORT}"}
""")
    assert errors == []
    mine = entries["My-Model"]
    # its ID and its printable alias; one with a blank at its end or a tab is left out, said
    assert mine["aliases"] == ["My Model", "другое имя"]
    assert entries["model"]["aliases"] == ["模型"]


def test_the_routing_block_is_read(tmp_path: Path) -> None:
    """llama-swap keeps its groups under ``routing.router.settings`` now, and its FIFO's
    priorities under ``routing.scheduler``: the whole block was 'not used', so a persistent
    group there was lost and every model ran at one priority."""
    entries, warnings, errors = _read(tmp_path, """\
models:
  chat: {cmd: "s --port ${PORT}"}
  embed: {cmd: "s --port ${PORT}", aliases: [emb]}
routing:
  router:
    use: group
    settings:
      groups:
        always: {persistent: true, members: [emb]}
  scheduler:
    use: fifo
    settings:
      fifo:
        priority: {chat: 10, emb: -5, nobody: 1, embed2: yes}
  extra: 1
""")
    assert errors == []
    assert entries["embed"]["pinned"] is True and "pinned" not in entries["chat"]
    assert (entries["chat"]["priority"], entries["embed"]["priority"]) == (10, -5)
    said = " | ".join(w.message for w in warnings)
    assert "'nobody' is not a model of this file" in said and "not a part of routing" in said
    assert "group 'always'" in said


def test_servers_run_in_the_working_directory_as_llama_swaps_do(tmp_path: Path) -> None:
    """llama-swap starts a model's server in its own working directory: ``./llama-server``
    and ``-m models/x.gguf`` are read from there. They were read from the file's folder,
    which differs under ``--config /etc/llama-swap/config.yaml``."""
    entries, _, errors = _read(tmp_path, """\
models:
  m: {cmd: "./bin/llama-server --port ${PORT} -m models/x.gguf"}
  p: {cmd: "llama-server --port ${PORT}"}
""")
    assert errors == []
    wd = str(tmp_path / "wd")
    assert entries["m"]["cwd"] == wd and entries["m"]["command"][0] == f"{wd}/bin/llama-server"
    assert entries["m"]["command"][-1] == "models/x.gguf"  # (read by the server, in its cwd)
    assert entries["p"]["command"][0] == "llama-server"  # (a program on the PATH)
    file = tmp_path / "config.yaml"
    (doc,) = load_documents(file)
    said = [w.message for w in from_llama_swap(doc, file, {}, None)
            if isinstance(w, DescriptorWarning)]
    assert any("working directory is unknown" in m for m in said), said
