"""``vramtui yield`` / ``resume`` for real: the CLI over the control socket and HTTP over TCP,
on one engine with two simulated GPUs and real worker processes.  Whether a worker of ours is
on a GPU is read from the simulated device's own ledger, never from the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from engine_support import engine, sim_backend
from http_support import Front, serve_http
from serve_support import cli, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

from supervisor.engine import EngineConfig
from supervisor.engine.rules import parse_rules
from supervisor.gpu.sim import SimulatedProbe

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]
GPUS = "sim:8GiB,sim:8GiB"


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    backends = [sim_backend("m", 1024, 256, gpus=[0])]
    with serve_http(backends, gpus=GPUS, control=True,
                    engine_config=EngineConfig(reserve_mib=0, tick_s=0.1)) as f:
        yield f


def on_gpu0(front: Front) -> set[int]:
    probe = SimulatedProbe(GPUS, front.sup.paths.sim_dir)
    return {p.pid for p in probe.processes() if p.gpu_index == 0}


def test_yield_and_resume_over_the_cli(front: Front) -> None:
    front.sup.preload("m")
    wait_until(lambda: on_gpu0(front), 30, "m loaded on GPU0")
    done = cli(front.env, "yield", "0")
    assert done.returncode == 0 and "GPU0 is yielded" in done.stdout, done.stderr
    t0 = time.monotonic()
    wait_until(lambda: not on_gpu0(front), 5, "no worker of ours on GPU0")
    print(f"GPU0 empty {time.monotonic() - t0:.2f} s after vramtui yield")
    status = json.loads(cli(front.env, "status", "--json").stdout)
    assert status["gpus"][0]["yielded_by"].endswith("(cli)")
    table = cli(front.env, "status").stdout
    assert "yielded to" in table and "until resumed" in table, table
    job = cli(front.env, "submit", "m", "--data", "{}").stdout.strip()
    assert json.loads(cli(front.env, "result", job, "--json").stdout)["state"] == "queued"
    assert not on_gpu0(front)
    resumed = cli(front.env, "resume", "0")
    assert resumed.returncode == 0 and "GPU0 resumed" in resumed.stdout
    result = cli(front.env, "result", job, "--wait", "--json")
    assert json.loads(result.stdout)["state"] == "succeeded"


def test_bad_yields_are_one_line_errors_with_their_exit_codes(front: Front) -> None:
    for args, code, words in ((("yield", "7"), 4, "unknown GPU 7: there is no GPU7 (present: "
                                                  "GPU0, GPU1)"),
                              (("yield", "0", "--for=-1s"), 2, "--for: '-1s' is"),
                              (("yield", "0", "--for", "-1s"), 2, "--for: '-1s' is"),
                              # said by the CLI, not as the API's "yield_gpus: argument
                              # 'for_s' must be ... (got 3599999999996400.0)"
                              (("yield", "0", "--for", "999999999999h"), 2,
                               "--for: a yield lasts more than 0 s and at most a year")):
        done = cli(front.env, *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == code and len(lines) == 1 and words in lines[0], done.stderr
    assert not any(g.yielded_by for g in front.sup.snapshot().gpus)


def test_a_resume_of_a_gpu_not_yielded_has_nothing_to_do(front: Front) -> None:
    # exit 7, as evict of a backend not loaded: said on stdout, no error (not 5: refused)
    done = cli(front.env, "resume", "1")
    assert (done.returncode, done.stderr) == (7, ""), done
    assert done.stdout == "GPU1 is not yielded (yielded now: none); nothing to resume\n"
    done = cli(front.env, "resume", "--json")
    assert done.returncode == 7 and json.loads(done.stdout) == {
        "resumed": [], "nothing_to_do": True, "message": "no GPU is yielded: nothing to resume"}
    reply = front.post("/v1/gpus/1/resume")
    assert reply.status == 409 and reply.error["code"] == "nothing_to_do", reply.body


def test_ending_a_drain_on_a_yielded_gpu_says_it_stays_yielded(front: Front) -> None:
    assert cli(front.env, "drain", "1").returncode == 0
    assert cli(front.env, "yield", "1").returncode == 0
    try:
        done = cli(front.env, "drain", "1", "--off")
        assert done.returncode == 0, done.stderr
        assert done.stdout == ("GPU1 no longer drains; it stays yielded (vramtui resume 1 "
                               "admits work there again)\n"), done.stdout
    finally:
        cli(front.env, "resume", "1")
    done = cli(front.env, "drain", "1", "--off")
    assert done.stdout == "GPU1 admits work again\n", done.stdout


def test_yield_over_http_for_a_while_resumes_by_itself(front: Front) -> None:
    bad = front.post("/v1/gpus/0/yield", {"for": "-1s"})
    assert bad.status == 400 and "is not a duration" in bad.error["message"]
    bad = front.post("/v1/gpus/0/yield", {"for": -1})
    assert bad.status == 400 and "negative" in bad.error["message"]
    assert front.post("/v1/gpus/7/yield").status == 404  # no such GPU, as for drain
    assert front.post("/v1/gpus/1/resume").status == 409  # not yielded: nothing to do
    front.sup.preload("m")
    wait_until(lambda: on_gpu0(front), 30, "m loaded on GPU0")
    r = front.post("/v1/gpus/0/yield", {"for": "1.5s", "by": "ada"})
    assert r.status == 200, r.json()
    wait_until(lambda: not on_gpu0(front), 5, "no worker of ours on GPU0")
    y = r.json()["yielded"][0]
    assert y["gpu"] == 0 and y["by"] == "ada" and 1.0 < y["until"] - y["since"] <= 1.5
    gpu = front.get("/v1/gpus").json()
    gpu0 = (gpu["data"] if isinstance(gpu, dict) else gpu)[0]
    assert gpu0["yielded"]["by"] == "ada"
    metrics = front.get("/metrics").body.decode()
    assert any(line.startswith("vramtui_gpu_yielded{") and 'gpu="0"' in line
               and line.endswith(" 1.0") for line in metrics.splitlines()), metrics[-2000:]
    assert "vramtui_gpu_memory_others_held_back_bytes{" in metrics
    job = front.sup.submit("m", b"{}")
    assert front.sup.job(job).state == "queued"
    assert front.sup.wait(job, 15).state == "succeeded"  # it resumed by itself
    assert front.sup.snapshot().gpus[0].yielded_by is None
    assert front.post("/v1/gpus/0/yield").status == 200
    assert front.post("/v1/gpus/0/resume").json() == {"resumed": [0]}


def test_a_yielded_gpu_stays_yielded_across_a_restart_of_vramtui_serve() -> None:
    root = new_root()
    env = make_env(root, [sim_backend("m", 1024, 256)])
    served = start_serve(env, root)
    try:
        assert cli(env, "yield", "--for", "1h").returncode == 0
        served.proc.terminate()
        assert served.wait_exit() == 0
        served = start_serve(env, root)
        gpu = json.loads(cli(env, "status", "--json").stdout)["gpus"][0]
        assert gpu["yielded_by"].endswith("(cli)") and gpu["yielded_until"] > time.time()
        job = cli(env, "submit", "m", "--data", "{}").stdout.strip()
        assert json.loads(cli(env, "result", job, "--json").stdout)["state"] == "queued"
        assert cli(env, "resume").returncode == 0
        assert json.loads(cli(env, "result", job, "--wait", "--json").stdout)["state"] \
            == "succeeded"
    finally:
        reap(served)


# A program on the simulated GPU that names itself (PR_SET_NAME, as a game's binary is named)
# and holds memory there until its stdin closes.
PROGRAM = r"""
import ctypes, sys
from worker_sdk import sim
ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
sim.allocate(int(sys.argv[2]))
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_rule_finds_its_program_beside_more_others_than_are_named() -> None:
    """steam holds the least of ten programs on the GPU: the faces name the largest eight,
    but the rule that follows steam must see it there all the same."""
    cfg = EngineConfig(reserve_mib=0, tick_s=0.1, others_arrive_s=0.2, others_leave_s=0.2,
                       yield_when=parse_rules(["steam"], "test"))
    with engine([sim_backend("m", 512, 128)], gpus="sim:16GiB", config=cfg) as sup:
        env = dict(os.environ, VRAMTUI_SIM_DIR=str(sup.paths.sim_dir))
        programs = [subprocess.Popen([sys.executable, "-c", PROGRAM, name, str(mib)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                    for name, mib in [*((f"desktop{i}", 300 + i) for i in range(9)),
                                      ("steam", 100)]]
        try:
            for p in programs:
                assert p.stdout is not None and p.stdout.readline() == b"holding\n"
            wait_until(lambda: len(sup.engine.others.strangers.get(0, ())) == 8, 10,
                       "the programs seen on GPU0 (the largest eight named)")
            wait_until(lambda: sup.snapshot().gpus[0].yielded_by == "while steam runs", 10,
                       "GPU0 yielded while steam runs")
            steam = programs.pop()
            assert steam.stdin is not None
            steam.stdin.close()
            steam.wait(10)
            wait_until(lambda: sup.snapshot().gpus[0].yielded_by is None, 10,
                       "GPU0 resumed once steam left, the others still there")
        finally:
            for p in programs:
                assert p.stdin is not None
                p.stdin.close()
            for p in programs:
                p.wait(10)
