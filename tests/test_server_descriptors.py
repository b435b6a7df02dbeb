"""The ``http:`` section of a descriptor: an HTTP model server as a backend (issue 24).

Its keys, their defaults, the macros kept for the engine to fill in at start, and one clear
line for each mistake.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from supervisor.admission import backend_info
from supervisor.backends import LoadResult, load_backends
from supervisor.backends.http import DEFAULT_URL, HttpCall, HttpSpec, fill
from supervisor.backends.schema import VramSpec
from supervisor.descriptors import spec_document
from supervisor.ledger import Learned
from supervisor.scheduler import GpuState, QueuedJob, Snapshot, WorkerInfo, plan


def _load(tmp_path: Path, text: str) -> LoadResult:
    path = tmp_path / "b.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return load_backends([path], environ={"HOME": "/home/t", "HF": "/hf"},
                         demo_fallback=False)


def test_a_llama_server_descriptor_loads_with_its_macros_kept(tmp_path: Path) -> None:
    result = _load(tmp_path, """
        name: qwen
        command: [llama-server, -m, $HF/q.gguf, --port, "${PORT}", -ngl, "99", -np, "4",
                  --fit-target, "${VRAM_MIB}"]
        env: {CUDA_DEVICE: "${GPU}", NAME: "${MODEL}", FRAC: "${VRAM_FRACTION}"}
        http: {health: /health}
        api: [chat, completions, embeddings, rerank, responses]
        concurrency: 4
        vram: 6GiB
        """)
    assert not result.errors, [str(e) for e in result.errors]
    spec = result.backends["qwen"]
    assert spec.server
    assert spec.http == HttpSpec(health="/health", url=DEFAULT_URL)
    assert spec.command == ("llama-server", "-m", "/hf/q.gguf", "--port", "${PORT}", "-ngl",
                            "99", "-np", "4", "--fit-target", "${VRAM_MIB}")
    assert spec.env == {"CUDA_DEVICE": "${GPU}", "NAME": "${MODEL}",
                        "FRAC": "${VRAM_FRACTION}"}
    assert spec.concurrency == 4 and spec.api[-2:] == ("rerank", "responses")
    values = {"PORT": "5801", "GPU": "1", "MODEL": "qwen"}
    assert [fill(w, values) for w in spec.command][4] == "5801"
    assert fill(spec.http.url, values) == "http://127.0.0.1:5801"
    assert fill("${VRAM_MIB}", values) == "${VRAM_MIB}"  # not given: left as it is


def test_every_http_key(tmp_path: Path) -> None:
    result = _load(tmp_path, """
        name: vllm
        command: vllm serve m --port 9000 --gpu-memory-utilization ${VRAM_FRACTION}
        http:
          health: none
          url: http://localhost:9000/
          model_name: Qwen/Qwen2.5-7B
          stop: docker stop ${MODEL}
          ready_timeout: 10m
          sleep: post /sleep?level=1
          wake: /wake_up
        """)
    spec = result.backends["vllm"]
    assert spec.http == HttpSpec(health=None, url="http://localhost:9000",
                                 model_name="Qwen/Qwen2.5-7B",
                                 stop=("docker", "stop", "${MODEL}"), ready_timeout_s=600.0,
                                 sleep=HttpCall("POST", "/sleep?level=1"),
                                 wake=HttpCall("POST", "/wake_up"))
    assert str(spec.http.sleep) == "POST /sleep?level=1" and spec.http.can_sleep
    shown = spec_document(spec)["http"]  # what `vramtui backends describe` shows
    assert (shown["sleep"], shown["wake"]) == ("POST /sleep?level=1", "POST /wake_up")
    assert spec.command[-1] == "${VRAM_FRACTION}"
    assert not _load(tmp_path, "name: a\ncommand: [s, --port, '${PORT}']\nhttp: true\n").errors


def test_without_http_a_port_is_still_an_environment_variable(tmp_path: Path) -> None:
    result = _load(tmp_path, "name: w\ncommand: [w, --port, '${PORT}']\n")
    assert "environment variable $PORT is not set" in str(result.errors[0])


@pytest.mark.parametrize(("body", "wanted"), [
    ("http: {health: health}", "field 'http.health': 'health' is not a path of the server"),
    ("http: {helth: /h}", "field 'http.helth'"),
    ("http: {url: 'ftp://x/'}", "field 'http.url': 'ftp://x/' is not an http:// URL"),
    ("http: {url: 'http://127.0.0.1:${PORT}/p/?q=1'}", "field 'http.url': "
     "'http://127.0.0.1:${PORT}/p/?q=1' has a query or a fragment: it is the base"),
    ("http: {url: 'http://127.0.0.1:${PORT}#f'}", "has a query or a fragment"),
    ("http: {url: 'http://127.0.0.1:${PORT}/?'}", "has a query or a fragment"),
    ("http: {ready_timeout: -1s}", "field 'http.ready_timeout'"),
    ("http: {stop: []}", "field 'http.stop'"),
    ("http: [1]", "field 'http': [1] is not a mapping of server settings"),
    ("http: {model_name: ''}", "field 'http.model_name'"),
    ("http: {sleep: POST /sleep, wake: 3}",
     "field 'http.wake': 3 is not a request: a method and a path, e.g. POST /wake_up"),
    ("http: {sleep: FETCH /sleep, wake: /w}", "field 'http.sleep': 'FETCH' is not an HTTP "
     "method (one of POST, PUT, PATCH, GET, DELETE), e.g. POST /sleep?level=1"),
    ("http: {sleep: POST sleep, wake: /w}", "field 'http.sleep': 'sleep' is not a path of "
     "the server (it starts with /)"),
    ("http: {sleep: POST /a b, wake: /w}", "field 'http.sleep': 'POST /a b' is not a request"),
    ("http: {sleep: POST /sleep?level=1}", "field 'http.sleep': http.wake is missing: a "
     "server put to sleep must be woken, so give both"),
    ("http: {wake: /wake_up}", "field 'http.wake': http.sleep is missing"),
])
def test_bad_http_settings_say_what_is_wrong(tmp_path: Path, body: str, wanted: str) -> None:
    result = _load(tmp_path, f"name: s\ncommand: [s, --port, '${{PORT}}']\n{body}\n")
    assert result.backends == {}
    (error,) = result.errors
    assert wanted in str(error) and "\n" not in str(error)


def test_a_server_that_never_gets_its_port_is_refused(tmp_path: Path) -> None:
    (error,) = _load(tmp_path, "name: s\ncommand: [s, -m, x]\nhttp: {}\n").errors
    assert "its command never gets it: pass it (e.g. --port '${PORT}')" in str(error)
    # A port given through the environment, or a fixed url, is fine.
    assert not _load(tmp_path, "name: s\ncommand: [s]\nenv: {P: '${PORT}'}\nhttp: {}\n").errors
    assert not _load(tmp_path, "name: s\ncommand: [s]\nhttp: {url: 'http://h:1'}\n").errors


def test_a_port_is_picked_only_where_the_engine_can_pick_one(tmp_path: Path) -> None:
    # ${PORT} is picked free at the url's host, so it must be an address of this host: one
    # that is not (192.0.2.1, TEST-NET) is refused at load, not at each start.
    (error,) = _load(tmp_path, "name: s\ncommand: [s, --port, '${PORT}']\n"
                               "http: {url: 'http://192.0.2.1:${PORT}'}\n").errors
    assert "field 'http.url'" in str(error) and "cannot at 192.0.2.1" in str(error)
    assert "http://[::1]:${PORT}" in str(error) and "\n" not in str(error)
    # IPv6 loopback: its port is picked there (an IPv4 socket cannot bind it).
    from supervisor.servers.launch import plan_launch

    result = _load(tmp_path, "name: s\ncommand: [s, --port, '${PORT}']\n"
                             "http: {url: 'http://[::1]:${PORT}'}\n")
    assert not result.errors, [str(e) for e in result.errors]
    launch = plan_launch(result.backends["s"], 0, {}, 8192)
    assert launch.url == f"http://[::1]:{launch.port}"
    # A fixed port names where the server is, wherever that is: nothing to pick.
    assert not _load(tmp_path, "name: s\ncommand: [s]\n"
                               "http: {url: 'http://192.0.2.1:80'}\n").errors


def test_a_server_is_no_worker_script_nor_a_vramd_worker(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text("")
    (error,) = _load(tmp_path, "name: s\nscript: w.py\nhttp: {url: 'http://h:1'}\n").errors
    assert "an http: backend runs a server: give its 'command'" in str(error)
    (error,) = _load(tmp_path, "name: s\ncommand: [s]\nprotocol: vramd\n"
                               "http: {url: 'http://h:1'}\n").errors
    assert "field 'protocol': an http: backend speaks HTTP" in str(error)


def test_a_start_fills_in_the_macros_and_picks_a_free_port(tmp_path: Path) -> None:
    from supervisor.servers.launch import plan_launch
    from supervisor.servers.request import upstream_of

    spec = _load(tmp_path, """
        name: vllm
        command: [serve, --port, "${PORT}", --util, "${VRAM_FRACTION}", --mib, "${VRAM_MIB}"]
        env: {WHERE: "gpu ${GPU} of ${MODEL}"}
        http: {model_name: Qwen/Q, stop: [kill-it, "${PORT}"]}
        api: [embeddings]
        vram: 6GiB
        """).backends["vllm"]
    launch = plan_launch(spec, 1, {"PATH": "/bin"}, gpu_total_mib=24576)
    measured = plan_launch(spec, 1, {}, gpu_total_mib=24576, budget_mib=12288)
    assert measured.argv[4:] == ("0.500", "--mib", "12288")  # the peak it is admitted at
    alone = plan_launch(dataclasses.replace(spec, vram=VramSpec()), 0, {}, 24576)
    assert alone.argv[4:] == ("1.000", "--mib", "24576")  # unmeasured: it runs alone
    port = str(launch.port)
    assert launch.argv == ("serve", "--port", port, "--util", "0.250", "--mib", "6144")
    assert launch.env == {"PATH": "/bin", "WHERE": "gpu 1 of vllm"}
    assert launch.url == f"http://127.0.0.1:{port}" and launch.stop == ("kill-it", port)
    # A job from elsewhere (the CLI, a calibration) goes to its first API's route, and the
    # server is sent its own model name; /upstream passes the body as it came.
    up = upstream_of(spec, b"", None)
    assert (up.method, up.path) == ("POST", "/v1/embeddings")
    assert b'"model": "Qwen/Q"' in up.body
    body = b'{"model": "mine",  "input": "x"}'
    assert upstream_of(spec, body, {"http": {"path": "/v1/embeddings"}}).body == \
        b'{"model":"Qwen/Q","input":"x"}'
    assert upstream_of(spec, body, {"api": "upstream", "http": {"path": "/x"}}).body == body


def test_the_engine_sends_the_key_the_server_was_given(tmp_path: Path) -> None:
    """llama-server and vLLM ask every caller for the key they were given (``--api-key``,
    else their variable): the engine's requests carry it, the first of a list."""
    from supervisor.servers.launch import plan_launch

    def key(command: str, env: str = "{}", base: dict[str, str] | None = None) -> dict[str, str]:
        spec = _load(tmp_path, f"name: s\ncommand: {command}\nenv: {env}\nhttp: {{}}\n"
                               "api: [chat]\nvram: 1GiB\n").backends["s"]
        return plan_launch(spec, 0, base or {}, 8192).auth_headers

    assert key('[llama-server, --port, "${PORT}", --api-key, "k1,k2"]') == \
        {"Authorization": "Bearer k1"}
    assert key('[vllm, serve, m, --port, "${PORT}", "--api-key=k3"]', "{VLLM_API_KEY: other}") == \
        {"Authorization": "Bearer k3"}  # the flag wins, as there
    assert key('[llama-server, --port, "${PORT}"]', "{LLAMA_API_KEY: k4}") == \
        {"Authorization": "Bearer k4"}
    assert key('[llama-server, --port, "${PORT}"]', base={"VLLM_API_KEY": "k5"}) == \
        {"Authorization": "Bearer k5"}  # inherited: the server reads it all the same
    drawn = key('[llama-server, --port, "${PORT}"]', '{LLAMA_API_KEY: "${API_KEY}"}')
    assert len(drawn["Authorization"]) > 40  # a secret of this start
    assert key('[llama-server, --port, "${PORT}"]') == {}


def test_the_key_of_a_server_a_shell_starts_is_read_from_its_script(tmp_path: Path) -> None:
    """``sh -c "exec llama-server … --api-key K"`` (or a multi-line llama-swap ``cmd`` given
    to ``bash -c``) hides the key from a reading of the argv alone: the engine's requests had
    none, and the server answered each with 401."""
    from supervisor.servers.launch import plan_launch, server_key

    assert server_key(["sh", "-c", "exec llama-server --port 1 --api-key k1,k2"], {}) == "k1"
    assert server_key(["/bin/bash", "-lc", "cd /m && llama-server --api-key=k2#;"], {}) == "k2#"
    multi = "set -e\n# --api-key not-this\nexec llama-server \\\n  --api-key 'k3' \\\n  -ngl 99"
    assert server_key(["bash", "-e", "-c", multi], {}) == "k3"
    assert server_key(["sh", "-o", "pipefail", "-c", "llama-server --api-key k4 | tee l"],
                      {}) == "k4"
    assert server_key(["sh", "-c", 'exec vllm serve m --api-key "${MINE}"'],
                      {"MINE": "k5"}) == "k5"  # the shell's variable, from its environment
    assert server_key(["sh", "-c", "export LLAMA_API_KEY=k6\nexec llama-server"],
                      {"LLAMA_API_KEY": "old"}) == "k6"
    assert server_key(["sh", "-c", "VLLM_API_KEY=k7 exec vllm serve m"], {}) == "k7"
    # what only running the script would tell, a script that does not split, no shell: none
    assert server_key(["sh", "-c", "exec llama-server --api-key $(cat key)"],
                      {"LLAMA_API_KEY": "not-the-flag's"}) is None
    assert server_key(["sh", "-c", "exec llama-server --api-key 'k8"], {}) is None
    assert server_key(["sh", "-c", "exec llama-server --api-key 'k8"],
                      {"LLAMA_API_KEY": "k9"}) == "k9"  # the environment still counts
    assert server_key(["python", "-c", "print('--api-key x')"], {}) is None
    assert server_key(["sh", "-x", "run.sh", "--api-key", "k10"], {}) == "k10"  # as before
    spec = _load(tmp_path, "name: s\ncommand: sh -c 'exec llama-server --port ${PORT} "
                           "--api-key k11'\nhttp: {}\napi: [chat]\nvram: 1GiB\n").backends["s"]
    assert plan_launch(spec, 0, {}, 8192).auth_headers == {"Authorization": "Bearer k11"}


def test_the_example_servers_load() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "servers" / "backends.yaml"
    result = load_backends([example], environ={"HOME": "/home/t"}, demo_fallback=False)
    assert not result.errors, [str(e) for e in result.errors]
    assert all(spec.server for spec in result.backends.values())
    assert len(result.backends) == 3


def test_a_servers_answer_has_an_idle_limit(tmp_path: Path) -> None:
    from supervisor.backends.schema import DEFAULT_IDLE_TIMEOUT_S

    head = "name: s\ncommand: [s, --port, '${PORT}']\nhttp: true\n"
    assert _load(tmp_path, head).backends["s"].timeouts.idle_s == DEFAULT_IDLE_TIMEOUT_S >= 120
    spec = _load(tmp_path, head + "timeouts: {idle: 10m}\n").backends["s"]
    assert spec.timeouts.idle_s == 600.0
    assert spec_document(spec)["timeouts"]["idle"] == "600s"
    assert _load(tmp_path, head + "timeouts: {idle: never}\n").backends["s"].timeouts.idle_s \
        is None
    (error,) = _load(tmp_path, head + "timeouts: {idle: 0s}\n").errors
    assert "field 'timeouts.idle': '0s' must be more than 0 (or 'never')" in str(error)
    # A worker is no server: its silence is timeouts.ping's.
    (error,) = _load(tmp_path, "name: w\ncommand: [w]\ntimeouts: {idle: 1m}\n").errors
    assert "field 'timeouts.idle'" in str(error) and "timeouts.ping" in str(error)


def test_a_servers_one_vram_figure_is_all_of_it_its_slots_included(tmp_path: Path) -> None:
    """llama-server (vLLM, SGLang) takes the memory of every slot as it starts: its one
    ``vram:`` figure is what it holds with all its slots busy, so each of its ``concurrency``
    requests adds nothing. Taken per request (a worker's unknown split, ``jobs x peak``), 6
    GiB and 4 slots let 3 requests run at once on 24 GiB. A worker's one figure stays per job
    (the safe side: each job may take that much); parts given are kept as they are."""
    result = _load(tmp_path, """
        backends:
          - {name: srv, command: [llama-server, --port, "${PORT}"], http: true,
             concurrency: 4, vram: 6GiB, safety: 0MiB}
          - {name: parts, command: [llama-server, --port, "${PORT}"], http: true,
             concurrency: 4, vram: {weights: 5GiB, activation: 1GiB}, safety: 0MiB}
          - {name: wrk, command: [python3, w.py], concurrency: 4, vram: 6GiB, safety: 0MiB}
        """)
    assert not result.errors, [str(e) for e in result.errors]
    srv, parts, wrk = (backend_info(result.backends[n], Learned())
                       for n in ("srv", "parts", "wrk"))
    assert [srv.holds_mib(n) for n in range(5)] == [6144] * 5
    assert [parts.holds_mib(n) for n in (0, 1, 4)] == [5120, 6144, 9216]
    assert wrk.holds_mib(2) == 2 * 6144
    # The plan: four requests start at once on the server's live worker on 24 GiB.
    snap = Snapshot(gpus=[GpuState(0, 24 * 1024, None)], backends={"srv": srv},
                    workers={"srv": WorkerInfo("srv", 0, "ready", 0, srv.holds_mib(0))},
                    queue=[QueuedJob(f"j{i}", "srv", 0, i, 0.0) for i in range(5)])
    assert [s.job_id for s in plan(snap, 1.0).starts] == ["j0", "j1", "j2", "j3"]
