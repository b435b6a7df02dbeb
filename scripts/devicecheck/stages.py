"""The device check's stages, each run as ``python -m devicecheck.stages STAGE CONFIG.json``.

Run by the project's venv (they import vramtui).  Each stage writes its rows (and the facts
later stages need) to the config's ``rows_path`` after every row, so a stage killed at its
time limit still leaves what it found.  Every wait has a deadline.

- ``doctor``: ``vramtui doctor --json`` — NVML, the driver, the GPUs (and every other check);
- ``probe``: one cuda_alloc worker (lazy, so each phase is clean) driven over the wire
  protocol, its memory read independently (``readers``): the context alone, + the weights,
  + the activation, and everything back after it exits;
- ``engine``: ``vramtui --serve``; ``vramtui calibrate`` of a cuda_alloc backend against the
  truth; an HTTP model server (``examples/cuda_alloc/server.py``, its memory held by a child)
  reached through ``--http``: its tree measured, a request's activation, gone after an evict,
  then calibrated; a trace of backends whose peaks sum to twice the card, watched at ≥ 20 Hz; the
  dashboard's screenshot taken during the trace.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import compare
from .main import process_alive
from .plan import CALIBRATE_NAME, SERVER_NAME, SIM_CONTEXT_MIB, Plan, Sizes
from .readers import open_reader
from .table import FAIL, STAGE_ROWS, Row, fail, info, verdict
from .watcher import Watcher

OOM = "CUDA_ERROR_OUT_OF_MEMORY"
POLL_S = 0.05


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


class Results:
    """The stage's rows and facts, rewritten to ``path`` after each change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[Row] = []
        self.facts: dict[str, Any] = {}
        self.save()

    def add(self, row: Row) -> None:
        self.rows.append(row)
        log(f"row {row.check}: {row.status} — {row.measured}" + (f" ({row.why})" if
                                                                 row.status == FAIL else ""))
        self.save()

    def fact(self, **facts: Any) -> None:
        self.facts.update(facts)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"rows": [r.to_json() for r in self.rows],
                                   "facts": self.facts}, indent=1))
        os.replace(tmp, self.path)


def base_env(cfg: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(cfg["vramtui_env"])
    env["VRAMTUI_DEVICE_CHECK"] = cfg["work"]  # a mark on every process below us (clean-up)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def vramtui_cmd(cfg: dict[str, Any], *args: str, timeout: float
                ) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "vramtui", *args]
    log("$ vramtui " + " ".join(args))
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**base_env(cfg), "COLUMNS": "200"})


def _json_out(text: str) -> Any:
    start = text.find("{")
    return json.loads(text[start:]) if start >= 0 else None


# -- doctor ------------------------------------------------------------------------------------


def stage_doctor(cfg: dict[str, Any], res: Results) -> None:
    check = "doctor"
    expected = ("NVML absent: SIMULATED GPU said" if cfg["simulated"]
                else "NVML found, a driver version, ≥ 1 GPU")
    try:
        done = vramtui_cmd(cfg, "--backends", cfg["backends_file"], "doctor", "--json",
                           timeout=60)
    except subprocess.TimeoutExpired:
        res.add(fail(check, "no answer in 60 s", expected, "vramtui doctor hung"))
        return
    print(done.stdout[-4000:], done.stderr[-2000:], sep="\n", flush=True)
    try:
        doc = _json_out(done.stdout)
        checks = list(doc["checks"])
    except (ValueError, TypeError, KeyError):
        res.add(fail(check, f"exit {done.returncode}, no JSON", expected,
                     f"vramtui doctor printed no report: {done.stderr.strip()[-300:]}"))
        return
    by_name = {c.get("check"): c for c in checks}
    nvml = by_name.get("NVML") or {}
    driver = by_name.get("driver") or {}
    others = [c for c in checks if c.get("status") == "fail"]
    problems = [f"{c.get('check')}: {c.get('detail')} (fix: {c.get('fix')})" for c in others]
    if cfg["simulated"]:
        nvml_ok = nvml.get("status") == "warn" and "SIMULATED" in str(nvml.get("detail"))
        measured = f"NVML: {nvml.get('detail')}"
        if not nvml_ok:
            problems.insert(0, f"without NVML doctor should warn of a SIMULATED GPU; it said "
                               f"{nvml.get('status')}: {nvml.get('detail')}")
    else:
        nvml_ok = nvml.get("status") == "ok" and driver.get("status") == "ok"
        measured = f"{nvml.get('detail')}; driver {driver.get('detail')}"
        if not nvml_ok:
            problems.insert(0, f"NVML {nvml.get('status')}: {nvml.get('detail')}; driver "
                               f"{driver.get('status')}: {driver.get('detail')}")
    res.add(verdict(check, nvml_ok and not others, measured, expected, "; ".join(problems)))


# -- probe -------------------------------------------------------------------------------------


def worker_env(cfg: dict[str, Any], extra: dict[str, str]) -> dict[str, str]:
    env = base_env(cfg)
    env.update(cfg["worker_env"])
    env.update(extra)
    if cfg["simulated"]:
        env["VRAMTUI_SIM_DIR"] = cfg["sim_dir"]
        env["VRAMTUI_SIM_GPU"] = str(cfg["gpu"])
    else:
        env["CUDA_VISIBLE_DEVICES"] = str(cfg["gpu"])
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def readings_of(reader: Any, pid: int, seconds: float) -> list[int]:
    """The pid's memory, read every POLL_S for ``seconds`` (only readings with a number)."""
    out: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        mib = reader.processes().get(pid)
        if mib is not None:
            out.append(mib)
        time.sleep(POLL_S)
    return out


def find_pid(reader: Any, pid: int, before: set[int], deadline: float
             ) -> tuple[int | None, str]:
    """The pid NVML shows for the worker: its own, or (another PID namespace) the one new pid.

    Returns (pid or None, a note: empty when the worker's own pid was seen)."""
    while time.monotonic() < deadline:
        procs = reader.processes()
        if pid in procs and procs[pid] is not None:
            return pid, ""
        new = sorted(set(procs) - before - {pid})
        if len(new) == 1 and procs[new[0]] is not None:
            return new[0], (f"NVML does not list the worker's pid {pid} but one new pid "
                            f"{new[0]}: its pids are another PID namespace's, so the engine "
                            "cannot attribute memory to its workers here")
        time.sleep(POLL_S)
    procs = reader.processes()
    if pid in procs:
        return None, (f"NVML lists the worker's pid {pid} but gives no memory figure for it "
                      "(per-process memory not available here)")
    note = f"NVML lists {sorted(procs)}" if procs else "NVML lists no process"
    return None, f"the worker's pid {pid} never showed on the GPU ({note})"


def stage_probe(cfg: dict[str, Any], res: Results) -> None:
    from worker_sdk.testing import WireServer

    plan = Plan.from_json(cfg["plan"])
    sizes = plan.probe
    work = Path(cfg["work"])
    names = STAGE_ROWS["probe"]
    reader = open_reader(cfg)
    res.fact(gpu_name=reader.name, total_mib=reader.total_mib, source=reader.source)
    baseline, total = reader.device()
    before = set(reader.processes())
    folder = work / "probe"
    folder.mkdir(exist_ok=True)
    server = WireServer(folder).start()
    log_path = folder / "worker.log"
    env = worker_env(cfg, {**sizes.env(), "CUDA_ALLOC_LAZY": "1", "VRAMTUI_BACKEND": "dc-probe"})
    with open(log_path, "wb") as wlog:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker_sdk", cfg["script"], "--control-socket",
             server.control_path, "--data-socket", server.data_path, "--name", "dc-probe"],
            stdin=subprocess.DEVNULL, stdout=wlog, stderr=subprocess.STDOUT, env=env,
            cwd=str(Path(cfg["script"]).parent))
    log(f"probe worker pid {proc.pid}: {sizes}")
    done: list[Row] = []

    def add(row: Row) -> None:
        done.append(row)
        res.add(row)

    def give_up(why: str) -> None:
        for name in names:
            if name not in {r.check for r in done}:
                add(fail(name, "not measured", "", why))

    try:
        try:
            link = server.wait_worker("dc-probe", timeout=90)
        except TimeoutError:
            code = proc.poll()
            give_up(f"the cuda_alloc worker did not become ready (exit code {code}); its log: "
                    f"{tail(log_path)}")
            return
        pid, note = find_pid(reader, proc.pid, before, time.monotonic() + 15)
        if pid is None:
            give_up(note)
            return
        steady = readings_of(reader, pid, 0.5)
        context = compare.level(steady)
        if context is None:
            give_up(f"no reading of pid {pid} with a memory figure")
            return
        ctx_mib, spread = context
        truth = SIM_CONTEXT_MIB if cfg["simulated"] else None
        passed = (not note and (compare.within(ctx_mib, truth) if truth is not None
                                else 0 < ctx_mib < 8192))
        add(verdict(names[0], passed, f"{ctx_mib} MiB before any allocation ({len(steady)} "
                                      f"readings, spread {spread})",
                    f"{truth} MiB (the simulated context)" if truth is not None
                    else "the worker's pid, with its CUDA context (0 < x < 8 GiB)",
                    note or f"a context of {ctx_mib} MiB is not believable"))
        res.fact(context_mib=ctx_mib)
        request = json.dumps({"steps": sizes.steps, "step_s": sizes.step_s}).encode()
        box: dict[str, Any] = {}

        def ask() -> None:
            try:
                box["reply"] = link.request(request, timeout=60)
            except Exception as exc:  # noqa: BLE001 - reported in the row
                box["error"] = exc

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        during: list[int] = []
        while asker.is_alive():
            mib = reader.processes().get(pid)
            if mib is not None:
                during.append(mib)
            time.sleep(POLL_S)
        reply = box.get("reply")
        if reply is None or reply.kind == "error":
            why = box.get("error") or (reply.error if reply is not None else "no reply")
            give_up(f"the request failed: {why}")
            return
        body = json.loads(reply.data)
        settled = compare.level(readings_of(reader, pid, 0.5))
        if settled is None or not during:
            give_up("no reading of the worker during or after its request")
            return
        resident = settled[0]
        weights = resident - ctx_mib
        activation = max(during) - resident
        w_true, a_true = int(body["weights_mib"]), int(body["activation_mib"])
        add(verdict(names[1], compare.within(weights, w_true),
                    f"+{weights} MiB after the first request (resident {resident})",
                    compare.expect_text(w_true, "allocated"),
                    f"NVML's per-process figure grew by {weights} MiB for {w_true} MiB taken "
                    "with cuMemAlloc"))
        add(verdict(names[2], compare.within(activation, a_true),
                    f"+{activation} MiB at the request's peak ({len(during)} readings)",
                    compare.expect_text(a_true, "allocated"),
                    f"the request's peak was {activation} MiB above the resident for "
                    f"{a_true} MiB taken"))
        try:
            health = link.health(timeout=10)
        except Exception as exc:  # noqa: BLE001 - an info row only
            health = {"error": str(exc)}
        used_now, _ = reader.device()
        if isinstance(health, dict) and "free_mib" in health:
            cuda_used = int(health["total_mib"]) - int(health["free_mib"])
            res.add(info("probe: NVML vs CUDA", f"device used: {reader.source} {used_now} MiB, "
                                               f"CUDA total-free {cuda_used} MiB",
                         "about the same (NVML may count reserved memory)"))
        link.shutdown()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            give_up("the worker did not exit within 30 s of SHUTDOWN")
            return
        deadline = time.monotonic() + 15
        while True:
            used, _ = reader.device()
            gone = pid not in reader.processes()
            back = used is not None and baseline is not None and used <= baseline + 64
            if (gone and back) or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        add(verdict(names[3], gone and back,
                    f"pid {'gone' if gone else 'still listed'}; device used {used} MiB "
                    f"(before the worker: {baseline})",
                    "pid gone, used ≤ before + 64 MiB, within 15 s of exit",
                    "memory was not returned after the worker exited"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        server.close()
        reader.close()
        print(f"--- probe worker log ---\n{log_path.read_text(errors='replace')[-6000:]}",
              flush=True)


# -- engine: serve, calibrate, trace, screenshot -----------------------------------------------


class Serve:
    """``vramtui --serve`` in its own session; stopped with SIGTERM, then killed."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        work = Path(cfg["work"])
        self.log_path = work / "serve.log"
        gpus = cfg["sim_spec"] if cfg["simulated"] else "nvml"
        env = base_env(cfg)
        env.update(cfg["worker_env"])
        argv = [sys.executable, "-m", "vramtui", "--serve", "--gpus", gpus,
                "--backends", cfg["backends_file"]]
        if "server" in cfg["parts"]:
            argv += ["--http", "127.0.0.1:0"]  # the model server is reached through it
        log("$ vramtui " + " ".join(argv[3:]))
        with open(self.log_path, "ab") as f:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=f,
                                         env=env, start_new_session=True)
        (work / "serve.pid").write_text(str(self.proc.pid))
        self.socket = Path(_socket_path(cfg))

    def client(self, timeout: float) -> Any:
        from supervisor.client import Client

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vramtui --serve exited (code {self.proc.returncode}): "
                                   f"{tail(self.log_path, 4)}")
            try:
                return Client(self.socket)
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vramtui --serve did not answer in {timeout:g} s: "
                                       f"{exc}") from exc
            time.sleep(0.1)

    def http_base(self, timeout: float) -> str:
        """The HTTP front door's base URL, as ``--serve`` printed it."""
        from vramtui.http_serve import front_door_url

        deadline = time.monotonic() + timeout
        while True:
            url = front_door_url(self.log_path.read_text(errors="replace"))
            if url is not None:
                return url
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vramtui --serve --http printed no address: "
                                   f"{tail(self.log_path, 4)}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(45)
            except subprocess.TimeoutExpired:
                log("vramtui --serve did not stop in 45 s: killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        print(f"--- vramtui --serve log (end) ---\n"
              f"{self.log_path.read_text(errors='replace')[-20000:]}", flush=True)


def _socket_path(cfg: dict[str, Any]) -> str:
    from supervisor.paths import Paths

    return str(Paths.from_env(cfg["vramtui_env"]).control_socket)


def stage_engine(cfg: dict[str, Any], res: Results) -> None:
    plan = Plan.from_json(cfg["plan"])
    parts = cfg["parts"]
    names = [n for part in parts for n in STAGE_ROWS[part]]
    serve = Serve(cfg)
    try:
        try:
            client = serve.client(60)
        except RuntimeError as exc:
            for name in names:
                res.add(fail(name, "not measured", "", str(exc)))
            return
        snap = client.snapshot()
        gpu = next((g for g in snap.gpus if g.index == plan.gpu), None)
        res.fact(engine_source=snap.source, engine_simulated=snap.simulated,
                 engine_gpu=gpu.name if gpu else None)
        wrong = (snap.simulated != cfg["simulated"]) or gpu is None
        if wrong:
            why = (f"the engine reads {snap.source} GPUs {[g.index for g in snap.gpus]}, not "
                   f"{'a simulated' if cfg['simulated'] else 'the NVML'} GPU {plan.gpu}")
            for name in names:
                res.add(fail(name, "not measured", "", why))
            return
        if "calibrate" in parts:
            calibrate(cfg, plan, res)
        if "server" in parts:
            model_server(cfg, plan, res, client, serve)
        if "trace" in parts:
            trace(cfg, plan, res, client)
        client.close()
    finally:
        serve.stop()


TRACE_ROWS = STAGE_ROWS["trace"][:3]


def calibrate(cfg: dict[str, Any], plan: Plan, res: Results, *, backend: str = CALIBRATE_NAME,
              sizes: Sizes | None = None, prefix: str = "calibrate") -> None:
    """``vramtui calibrate BACKEND`` against the truth: the rows ``PREFIX: context``,
    ``weights``, ``activation`` and ``confidence``."""
    sizes = sizes or plan.calibrate
    rows = [f"{prefix}: {n}" for n in ("context", "weights", "activation", "confidence")]
    out = Path(cfg["out"]) / ("calibration.json" if backend == CALIBRATE_NAME
                              else f"calibration-{backend}.json")
    timeout = 90 if plan.simulated else 180
    args = ["calibrate", backend, "--repeats", str(plan.repeats), "--settle",
            f"{plan.settle_s:g}", "--json", "--out", str(out)]
    try:
        done = vramtui_cmd(cfg, *args, timeout=timeout)
    except subprocess.TimeoutExpired:
        for name in rows:
            res.add(fail(name, "not measured", "", f"vramtui calibrate took over {timeout} s"))
        return
    print(done.stdout[-6000:], done.stderr[-3000:], sep="\n", flush=True)
    try:
        summary = _json_out(done.stdout)
        assert isinstance(summary, dict)
    except (ValueError, AssertionError):
        for name in rows:
            res.add(fail(name, f"exit {done.returncode}", "", "vramtui calibrate printed no "
                         f"JSON: {done.stderr.strip()[-300:]}"))
        return
    context_truth = _context_truth(cfg, plan)
    truths = (("context", context_truth, "context_mib",
               "the probe's context" if not plan.simulated else "the simulated context"),
              ("weights", sizes.weights_mib, "weights_mib", "allocated"),
              ("activation", sizes.activation_mib, "activation_mib", "allocated"))
    failed_run = summary.get("outcome") != "completed"
    for name, truth, key, what in truths:
        measured = summary.get(key)
        check = f"{prefix}: {name}"
        if truth is None:
            res.add(fail(check, f"{measured} MiB", "the probe's context",
                         "no truth to compare with: the probe row did not measure the context"))
            continue
        reason = summary.get("error") or summary.get("job_error")
        why = (f"the run {summary.get('outcome')}: {reason}" if failed_run else
               f"calibration measured {measured} MiB for a {what} {truth} MiB")
        res.add(verdict(check, not failed_run and compare.within(measured, truth),
                        compare.delta_text(measured, truth), compare.expect_text(truth, what),
                        why))
    confidence = summary.get("confidence")
    findings = [f.get("code") for f in summary.get("findings") or [] if isinstance(f, dict)]
    res.add(verdict(rows[3], confidence in ("high", "medium") and not failed_run,
                    f"{confidence}; findings: {', '.join(findings) or 'none'}",
                    "high or medium (an overlay written)",
                    f"confidence {confidence}: {summary.get('reason')}"))
    res.fact(**{"calibration" if backend == CALIBRATE_NAME else f"calibration_{backend}":
                summary.get("headline")})


def _context_truth(cfg: dict[str, Any], plan: Plan) -> int | None:
    """A CUDA context's size: the simulated one, or what the probe stage measured."""
    return SIM_CONTEXT_MIB if plan.simulated else cfg["facts"].get("context_mib")


# -- server: an HTTP model server whose memory a child process holds ---------------------------


def _tree(pid: int | None) -> set[int]:
    """The pid and its descendants now (empty when it is gone)."""
    import psutil

    if pid is None:
        return set()
    try:
        proc = psutil.Process(pid)
        return {pid, *(c.pid for c in proc.children(recursive=True))}
    except psutil.Error:
        return set()


def _chat(base: str, timeout: float) -> tuple[int, dict[str, Any], float]:
    """One chat completion for the server through the engine's HTTP door: (status, body,
    seconds)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = json.dumps({"model": SERVER_NAME, "messages": [{"role": "user", "content": "hi"}]})
    t0 = time.monotonic()
    try:
        conn.request("POST", "/v1/chat/completions", body,
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    try:
        doc = json.loads(data)
    except ValueError:
        doc = {"raw": data[:300].decode(errors="replace")}
    return resp.status, doc if isinstance(doc, dict) else {"raw": doc}, time.monotonic() - t0


def _server_view(client: Any) -> Any:
    return next((b for b in client.snapshot().backends if b.name == SERVER_NAME), None)


def model_server(cfg: dict[str, Any], plan: Plan, res: Results, client: Any,
                 serve: Serve) -> None:
    """The server's rows: a request through the HTTP door starts it; its tree's memory as NVML
    shows it per process (held by a child, not the process the engine started) against the
    truth and against the engine's figure; a request's activation; every process and its
    memory gone after an evict; then ``vramtui calibrate`` of the server."""
    names = STAGE_ROWS["server"][:4]
    sizes = plan.server
    context = _context_truth(cfg, plan)
    done: list[str] = []

    def add(row: Row) -> None:
        done.append(row.check)
        res.add(row)

    def give_up(why: str) -> None:
        for name in names:
            if name not in done:
                add(fail(name, "not measured", "", why))

    def left(reserve: float) -> float:
        """Seconds this part may still wait, leaving ``reserve`` to what comes after it."""
        ends_at = float(cfg.get("ends_at", time.time() + 1e9))
        return max(5.0, ends_at - time.time() - reserve)

    reader = open_reader(cfg)
    try:
        baseline, _total = reader.device()
        try:
            base = serve.http_base(30)
            status, body, seconds = _chat(base, min(240.0, left(150)))
        except (RuntimeError, OSError, http.client.HTTPException) as exc:
            give_up(f"the first request failed: {type(exc).__name__}: {exc}")
            return
        try:
            content = body["choices"][0]["message"]["content"]
            held = json.loads(content)
            assert isinstance(held, dict)
        except (KeyError, IndexError, TypeError, ValueError, AssertionError):
            held = {}
        served = status == 200 and held.get("weights_mib") == sizes.weights_mib
        add(verdict(names[0], served, f"HTTP {status} in {seconds:.1f} s (its cold start "
                    f"included); the server held {held.get('weights_mib')} MiB of weights",
                    f"200, an OpenAI answer from the server holding {sizes.weights_mib} MiB",
                    f"the answer: {json.dumps(body)[:300]}; serve log: "
                    f"{tail(serve.log_path, 3)}"))
        if not served:
            give_up("the server did not answer its first request")
            return
        view = _server_view(client)
        pid = view.pid if view is not None else None
        tree = _tree(pid)
        # the engine samples on its own clock: give its figure a few seconds to settle
        deadline = time.monotonic() + 10
        while True:
            procs = reader.processes()
            on_gpu = {p: procs[p] for p in tree if procs.get(p) is not None}
            nvml_sum = sum(on_gpu.values())  # type: ignore[arg-type]
            view = _server_view(client)
            engine = view.observed_mib if view is not None else None
            if (engine is not None and on_gpu and compare.within(engine, nvml_sum)) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        truth = None if context is None else context + sizes.weights_mib
        children = sorted(set(on_gpu) - {pid})
        problems = []
        if not on_gpu:
            problems.append(f"NVML shows none of the server's processes {sorted(tree)} (it "
                            f"lists {sorted(procs)}): another PID namespace, or no "
                            "per-process figures")
        if truth is not None and on_gpu and not compare.within(nvml_sum, truth):
            problems.append(f"NVML's figure for the tree, {nvml_sum} MiB, is not the context "
                            f"and weights allocated ({truth} MiB)")
        if on_gpu and not children:
            problems.append("the memory showed on the server's own pid, not its child's: the "
                            "tree was not tested")
        if on_gpu and not compare.within(engine, nvml_sum):
            problems.append(f"the engine measures the server at {engine} MiB, NVML's tree "
                            f"{nvml_sum} MiB")
        add(verdict(names[1], not problems,
                    f"engine {engine} MiB; NVML {nvml_sum} MiB on pids {sorted(on_gpu)} (the "
                    f"server is {pid})",
                    "the engine's figure = NVML's tree = context + weights"
                    + (f" ({truth} MiB)" if truth is not None else ""),
                    "; ".join(problems)))
        box: dict[str, Any] = {}

        def ask() -> None:
            try:
                box["answer"] = _chat(base, min(120.0, left(120)))
            except (OSError, http.client.HTTPException) as exc:
                box["error"] = exc

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        peak_nvml, peak_engine = nvml_sum, engine or 0
        while asker.is_alive():
            procs = reader.processes()
            peak_nvml = max(peak_nvml, sum(procs.get(p) or 0 for p in _tree(pid)))
            view = _server_view(client)
            if view is not None and view.observed_mib is not None:
                peak_engine = max(peak_engine, view.observed_mib)
            time.sleep(POLL_S)
        answer = box.get("answer")
        grew = peak_nvml - nvml_sum
        jobs = client.jobs(backends=[SERVER_NAME], limit=1)
        job_peak = jobs[0].peak_mib if jobs else None
        ok_answer = answer is not None and answer[0] == 200
        add(verdict(names[2], ok_answer and compare.within(grew, sizes.activation_mib)
                    and compare.within(job_peak, peak_nvml),
                    f"NVML +{grew} MiB at the request's peak ({peak_nvml} MiB); the engine's "
                    f"job peak {job_peak} MiB, its backend figure at most {peak_engine} MiB",
                    f"+{compare.expect_text(sizes.activation_mib, 'allocated')}; the job's "
                    "peak = NVML's",
                    f"the request answered {answer[0] if answer else box.get('error')}"
                    if not ok_answer else
                    f"NVML saw +{grew} MiB for {sizes.activation_mib} MiB allocated; the "
                    f"engine's job peak {job_peak} MiB for NVML's {peak_nvml} MiB"))
        tree = _tree(pid) or tree
        _unload(client, SERVER_NAME)
        deadline = time.monotonic() + 45
        while True:
            staying = {p for p in tree if process_alive(p)}
            procs = reader.processes()
            listed = sorted(set(procs) & tree)
            used, _ = reader.device()
            back = used is not None and baseline is not None and used <= baseline + 64
            if (not staying and not listed and back) or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        view = _server_view(client)
        add(verdict(names[3], not staying and not listed and back,
                    f"processes left {sorted(staying)}; NVML lists {listed}; device used {used} "
                    f"MiB (before the server: {baseline}); state {view.state if view else '?'}",
                    "every process of the tree gone, none on the GPU, used ≤ before + 64 MiB, "
                    "within 45 s of the evict",
                    "the server's tree or its memory outlived the evict"))
    except Exception as exc:  # noqa: BLE001 - said in its rows; the trace after it still runs
        give_up(f"the check broke: {type(exc).__name__}: {exc}")
    finally:
        reader.close()
        with contextlib.suppress(Exception):  # the trace after it needs the card
            _unload(client, SERVER_NAME)
    if left(90) > 5:
        calibrate(cfg, plan, res, backend=SERVER_NAME, sizes=sizes, prefix="server calibrate")
    else:
        for name in STAGE_ROWS["server"][4:]:
            res.add(fail(name, "not measured", "", "no time left in the stage's limit"))


def _unload(client: Any, backend: str, timeout: float = 30.0) -> None:
    """Cancel ``backend``'s jobs (one left by a request that timed out holds it) and evict
    it, retried while it is still busy."""
    from supervisor.errors import NothingToDo, Refused

    for job in client.jobs(backends=[backend], state="active"):
        with contextlib.suppress(Exception):
            client.cancel(job.id)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.evict(backend)
            return
        except NothingToDo:
            return
        except Refused:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _count_oom(paths: list[Path]) -> int:
    count = 0
    for path in paths:
        with contextlib.suppress(OSError):
            count += path.read_text(errors="replace").count(OOM)
    return count


def trace(cfg: dict[str, Any], plan: Plan, res: Results, client: Any) -> None:
    from supervisor.jobs import JobState

    context = int(cfg["context_declared"])
    peaks = [b.peak_mib for b in plan.trace]
    ratio = sum(peaks) / plan.total_mib
    watcher = Watcher(lambda: open_reader(cfg), hz=50.0)
    watcher.start()
    if not watcher.ready.wait(20) or watcher.error:
        why = watcher.error or "the watcher did not start in 20 s"
        for name in (*TRACE_ROWS, "screenshot"):
            res.add(fail(name, "not measured", "", why))
        watcher.stop()
        return
    payload = json.dumps({"steps": plan.trace_steps, "step_s": plan.trace_step_s}).encode()
    t0 = time.monotonic()
    jobs = []
    for backend, priority in plan.trace_jobs():
        jobs.append((client.submit(backend, payload, priority=priority), backend))
    log(f"trace: {len(jobs)} jobs on {len(plan.trace)} backends, peaks {peaks} MiB "
        f"({ratio:.2f}x the card's {plan.total_mib} MiB), context declared {context} MiB")
    shot = Screenshot(cfg, plan)
    shot.start()
    views = []
    # leave the stage time to stop the engine and report, inside its own limit
    ends_at = t0 + float(cfg.get("ends_at", time.time() + 1e9)) - time.time()
    deadline = max(t0 + 5, min(t0 + plan.trace_timeout_s, ends_at - 60))
    for job_id, _backend in jobs:
        try:
            views.append(client.wait(job_id, timeout=max(1.0, deadline - time.monotonic())))
        except Exception as exc:  # noqa: BLE001 - a job not finished in time is a failure
            log(f"trace: job {job_id}: {exc}")
            views.append(client.job(job_id))
    seconds = time.monotonic() - t0
    watcher.stop()
    shot.join(60)
    summary = watcher.summary()
    snap = client.snapshot()
    starts = sum(1 for line in snap.log if re.match(r"starting dc-trace-", line.text))
    succeeded = [v for v in views if v.state is JobState.SUCCEEDED]
    failures = [f"{v.id} ({v.backend}) {v.state.value}: {v.error}" for v in views
                if v.state is not JobState.SUCCEEDED]
    res.add(verdict("trace: jobs", len(succeeded) == len(views),
                    f"{len(succeeded)}/{len(views)} succeeded in {seconds:.0f} s; "
                    f"{starts} worker starts",
                    f"all of {len(views)} (peaks sum to {ratio:.1f}x the card)",
                    "; ".join(failures[:5])))
    job_oom = sum(1 for v in views if OOM in (v.error or ""))
    logs = sorted((Path(cfg["vramtui_env"]["VRAMTUI_STATE_DIR"]) / "logs").glob("dc-trace-*"))
    log_oom = _count_oom(logs)
    res.add(verdict("trace: out of memory", job_oom == 0 and log_oom == 0,
                    f"{job_oom} jobs failed with {OOM}; {log_oom} mentions in the workers' logs",
                    f"0 {OOM}",
                    "the engine admitted more than the card holds: workers' allocations "
                    "failed"))
    max_used, total = summary["max_used_mib"], summary["total_mib"]
    rate_ok = summary["hz"] >= compare.MIN_WATCH_HZ
    never_over = summary["over_count"] == 0 and max_used is not None
    problems = []
    if not never_over:
        problems.append(f"used memory was above the total {summary['over_count']} times "
                        f"(first: {summary['over'][:3]})" if max_used is not None
                        else "no reading had a used-memory figure")
    if not rate_ok:
        problems.append(f"the watcher read only {summary['hz']} Hz (needs "
                        f"{compare.MIN_WATCH_HZ:g}): it cannot vouch for every instant")
    res.add(verdict("trace: used ≤ total", never_over and rate_ok,
                    f"max {max_used} of {total} MiB; {summary['readings']} readings at "
                    f"{summary['hz']} Hz",
                    f"never above the total, read at ≥ {compare.MIN_WATCH_HZ:g} Hz",
                    "; ".join(problems)))
    trace_out = Path(cfg["out"]) / "trace.json"
    trace_out.write_text(json.dumps({
        "peaks_mib": peaks, "total_mib": plan.total_mib, "context_declared_mib": context,
        "jobs": [{"id": v.id, "backend": v.backend, "state": v.state.value, "error": v.error,
                  "peak_mib": v.peak_mib} for v in views],
        "worker_starts": starts, "watcher": summary,
    }, indent=1))
    res.add(shot.row())


class Screenshot(threading.Thread):
    """The dashboard, attached to the engine, shot while the trace runs (a child process)."""

    def __init__(self, cfg: dict[str, Any], plan: Plan) -> None:
        super().__init__(name="devicecheck-shot", daemon=True)
        self.cfg = cfg
        self.path = Path(cfg["screenshot"])
        name = str(cfg["facts"].get("gpu_name") or "")
        tokens = [t for t in re.split(r"\s+", name) if re.search(r"\d", t)]
        self.expect = ["SIMULATED"] if plan.simulated else (tokens[-1:] or [name] if name
                                                           else [])
        self.result: dict[str, Any] | None = None
        self.error: str | None = None

    def run(self) -> None:
        argv = [sys.executable, "-m", "devicecheck.shot", _socket_path(self.cfg),
                str(self.path), "--size", "160x48", "--polls", "4"]
        for text in self.expect:
            argv += ["--expect", text]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                                  env=base_env(self.cfg))
        except subprocess.TimeoutExpired:
            self.error = "the dashboard did not finish its screenshot in 60 s"
            return
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()[-3:]
            self.error = f"the dashboard failed: {' | '.join(lines)}"
            return
        try:
            self.result = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.error = f"the screenshot process printed no result: {done.stdout[-200:]}"

    def row(self) -> Row:
        expected = f"an SVG of the dashboard showing {', '.join(self.expect) or 'the GPU'}"
        if self.error or self.result is None:
            return fail("screenshot", "none", expected, self.error or "no screenshot")
        shows = self.result.get("shows", {})
        missing = [t for t, seen in shows.items() if not seen]
        return verdict("screenshot", not missing,
                       f"{self.result['path']} ({self.result['bytes'] // 1024} KiB)", expected,
                       f"the dashboard does not show {missing}")


STAGES: dict[str, Callable[[dict[str, Any], Results], None]] = {
    "doctor": stage_doctor, "probe": stage_probe, "engine": stage_engine}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in STAGES:
        print(f"usage: python -m devicecheck.stages {{{'|'.join(STAGES)}}} CONFIG.json",
              file=sys.stderr)
        return 2
    cfg = json.loads(Path(argv[1]).read_text())
    # a time limit's SIGTERM runs the clean-up (finally: blocks stop the engine)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    res = Results(Path(cfg["rows_path"]))
    STAGES[argv[0]](cfg, res)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
