"""Yielding GPUs (``vramtui yield``) on fake workers: what a yield closes, what waits, what a
resume, a duration and a restart do, and the refusals; the file that keeps yields."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
from engine_support import scratch_dir
from fake_worker import Script, fake_engine
from waiting import wait_until, wait_until_async

from supervisor.engine import EngineConfig
from supervisor.engine.rules import BadRule, Rules, parse_rules
from supervisor.engine.yielding import Yields
from supervisor.errors import InvalidRequest, NothingToDo, Refused, UnknownGpu, VramtuiError
from supervisor.results import YieldInfo


def desc(**extra: object) -> dict[str, object]:
    return {"vram": {"weights": "1GiB", "activation": "256MiB"}, "safety": "0MiB", **extra}


def script(**kw: object) -> Script:
    return Script(weights_mib=1024, activation_mib=256, **kw)  # type: ignore[arg-type]


def test_a_yielded_gpu_unloads_its_models_and_its_jobs_wait_until_resumed() -> None:
    with fake_engine({"a": desc(gpus=[0]), "b": desc()}, gpus=[8192, 8192],
                     scripts={"a": script(job_s=0.01), "b": script(job_s=0.01)}) as fe:
        fe.sup.preload("a")
        wait_until(lambda: fe.sup.snapshot().backend("a").state == "ready", what="a loaded")
        given = fe.sup.yield_gpus([0], by="ada")
        assert [(y.gpu, y.by, y.until) for y in given] == [(0, "ada", None)]
        wait_until(lambda: fe.gpu.used(0) == 0, 5, "GPU0 empty")
        gpu = fe.sup.snapshot().gpus[0]
        assert gpu.yielded_by == "ada" and gpu.yielded_until is None
        waits = fe.sup.submit("a", b"x")  # a may only use GPU0: it waits
        elsewhere = fe.sup.submit("b", b"y")  # b may use GPU1: it runs there
        assert fe.sup.wait(elsewhere, 5).state == "succeeded"
        assert fe.sup.job(waits).state == "queued"
        assert "GPU0 is yielded (ada" in fe.sup.job(waits).waiting
        assert fe.sup.resume_gpus([0]) == (0,)
        assert fe.sup.wait(waits, 5).state == "succeeded"
        assert fe.sup.snapshot().gpus[0].yielded_by is None


def test_a_yield_for_a_while_ends_by_itself_and_now_cancels_what_runs() -> None:
    with fake_engine({"a": desc()}, scripts={"a": script(job_s=60)}) as fe:
        running = fe.sup.submit("a", b"x")
        wait_until(lambda: fe.sup.job(running).state == "running", what="running")
        fe.sup.yield_gpus(for_s=0.3, now=True)
        assert fe.sup.wait(running, 5).state == "cancelled"
        wait_until(lambda: fe.sup.snapshot().gpus[0].yielded_by is None, 5, "resumed by itself")
        assert any("its yield" in line.text and "is over" in line.text
                   for line in fe.sup.snapshot().log)


@pytest.mark.parametrize("now", [False, True], ids=["yield", "yield-now"])
def test_a_load_under_way_on_a_yielded_gpu_is_given_up(now: bool) -> None:
    """The GPU is handed over now, not once a 60 s load ends: the loading worker goes (the
    fake GPU holds nothing of it), and its job waits for the resume (``--now``: cancelled)."""
    with fake_engine({"a": desc()}, scripts={"a": script(load_s=60, job_s=0.01)}) as fe:
        job = fe.sup.submit("a", b"x")
        wait_until(lambda: fe.sup.snapshot().backend("a").state in ("starting", "initializing"),
                   5, "a loading")
        fe.sup.yield_gpus(now=now)
        (worker,) = fe.workers.of("a")
        wait_until(lambda: worker.exited, 5, "the loading worker gone")
        assert fe.gpu.used(0) == 0
        if now:
            assert fe.sup.wait(job, 5).state == "cancelled"
            return
        wait_until(lambda: fe.sup.job(job).state == "queued", 5, "its job back in the queue")
        assert any("its load is given up" in n for _t, _s, n in fe.sup.job(job).history)


def test_bad_yields_and_resumes_are_refused_clearly() -> None:
    with fake_engine({"a": desc()}, gpus=[8192, 8192]) as fe:
        with pytest.raises(UnknownGpu,
                           match=r"unknown GPU 7: there is no GPU7 \(present: GPU0, GPU1\)"):
            fe.sup.yield_gpus([7])
        with pytest.raises(InvalidRequest, match="more than 0 s"):
            fe.sup.yield_gpus([0], for_s=-1)
        with pytest.raises(NothingToDo, match="GPU1 is not yielded"):
            fe.sup.resume_gpus([1])
        with pytest.raises(NothingToDo, match="no GPU is yielded"):
            fe.sup.resume_gpus()
        with pytest.raises(InvalidRequest, match="at most 80 printable"):
            fe.sup.yield_gpus([0], by="x" * 81)
        with pytest.raises(InvalidRequest, match="list of GPU indexes"):
            fe.sup.yield_gpus([-1])
        assert not any(g.yielded_by for g in fe.sup.snapshot().gpus)


def test_a_yield_outlives_an_engine_restart() -> None:
    root = Path(tempfile.mkdtemp(prefix="vt-yield-", dir="/tmp"))
    try:
        with fake_engine({"a": desc()}, journal=True, root=root) as fe:
            fe.sup.yield_gpus([0], for_s=3600, by="ada")
        with fake_engine({"a": desc()}, scripts={"a": script(job_s=0.01)}, journal=True,
                         root=root) as again:
            gpu = again.sup.snapshot().gpus[0]
            assert gpu.yielded_by == "ada" and gpu.yielded_until is not None
            job = again.sup.submit("a", b"x")
            assert again.sup.job(job).state == "queued"
            again.sup.resume_gpus()
            assert again.sup.wait(job, 5).state == "succeeded"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_yields_file_drops_what_expired_and_survives_garbage(tmp_path: Path) -> None:
    clock = [1000.0]
    path = tmp_path / "yielded.json"
    y = Yields(path, lambda: clock[0])
    y.give([0, 1], [0, 1], for_s=10, by="ada")
    y.give([1], [0, 1], by="bob")
    assert json.loads(path.read_text())["yielded"][1]["by"] == "bob"
    clock[0] = 1011.0
    again = Yields(path, lambda: clock[0])
    assert len(again.load()) == 1 and list(again.held) == [1]
    # another device at that index after the restart (a simulated GPU0, then the host): open
    other = Yields(path, lambda: clock[0], device=lambda g: "host memory")
    said = other.load()
    assert not other.held and "it is host memory now: open" in said[0], said
    assert json.loads(path.read_text())["yielded"] == []
    path.write_text("{not json")
    broken = Yields(path, lambda: clock[0])
    assert "cannot read the yielded GPUs" in broken.load()[0] and not broken.held
    for garbage in ('{"yielded": [{"gpu": Infinity, "by": "x", "since": 1}]}',
                    '{"yielded": [], "waived": [{"gpu": -Infinity, "rules": ["r"]}, 7]}'):
        path.write_text(garbage)  # (json reads Infinity; int() of it overflows)
        broken = Yields(path, lambda: clock[0])
        said = broken.load()
        assert not broken.held and not broken.waived, said


# -- rules and per-GPU reserves --------------------------------------------------------------

def test_bad_rules_are_refused_in_one_line() -> None:
    for raw, words in (("steam", "a list"), ([""], "a process name"),
                       ([{"cmd": "x"}], "a process name, or"),
                       ([{"command": "x", "every": "soon"}], "every:"),
                       ([{"command": "x", "timeout": "0s"}], "between 0.1s and 1h"),
                       ([{"command": "x", "gpus": "0"}], "gpus:"),
                       ([{"command": "x", "when": 1}], "unknown key 'when'"),
                       ([{"command": "pgrep -x a\0b"}], "command:"),
                       ([{"command": ["pgrep", "a\0b"]}], "command:")):
        with pytest.raises(BadRule, match=re.escape(words)):
            parse_rules(raw, "config.yaml: engine: yield_when")
    rules = parse_rules(["steam", {"command": "pgrep -x blender", "gpus": [1]}], "here")
    assert rules[0].name == "steam" and rules[1].command == ("pgrep", "-x", "blender")


def test_a_rule_yields_a_gpu_while_a_named_program_holds_memory_there() -> None:
    me = psutil.Process().name()  # this test's process plays the program (on GPU0)
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_arrive_s=0.1, others_leave_s=0.1,
                       yield_when=parse_rules([me], "test"))
    with fake_engine({"a": desc()}, gpus=[8192, 8192], config=cfg,
                     scripts={"a": script(job_s=0.01)}) as fe:
        assert (fe.engine.rules.arrive_s, fe.engine.rules.leave_s) == (0.1, 0.1)  # as others
        fe.gpu.hold(os.getpid(), 0, 512)
        wait_until(lambda: fe.sup.snapshot().gpus[0].yielded_by == f"while {me} runs", 5,
                   "GPU0 yielded by the rule")
        assert fe.sup.snapshot().gpus[1].yielded_by is None
        fe.gpu.release(os.getpid())
        wait_until(lambda: fe.sup.snapshot().gpus[0].yielded_by is None, 5, "resumed")


class RuleGpus:
    """What ``Rules.follow`` is given, on a clock the test moves: the GPUs it yielded and
    resumed, and the programs on them (GPU -> names)."""

    def __init__(self, rules: list[object], held: dict[int, YieldInfo] | None = None) -> None:
        self.t = 0.0
        self.rules = Rules(parse_rules(rules, "test"), lambda *_a, **_k: None,
                           arrive_s=3.0, leave_s=3.0, clock=lambda: self.t)
        self.held: dict[int, YieldInfo] = dict(held or {})
        self.yielded: list[tuple[float, int]] = []
        self.resumed: list[tuple[float, int]] = []

    def at(self, t: float, *names: str, gpu: int = 0) -> None:
        self.t = t
        from supervisor.engine.others import Stranger

        strangers = {gpu: tuple(Stranger(100 + i, 1024, n) for i, n in enumerate(names))}
        self.rules.follow(strangers, [0, 1], self.held, self._give, self._take_back)

    def _give(self, gpus: list[int], *, by: str, rule: bool) -> None:
        for g in gpus:
            self.held[g] = YieldInfo(g, by, self.t, rule=rule)
            self.yielded.append((self.t, g))

    def _take_back(self, gpus: list[int]) -> None:
        for g in gpus:
            del self.held[g]
            self.resumed.append((self.t, g))

    def person_resumes(self, gpu: int) -> list[str]:
        """What the engine does when a person resumes ``gpu``."""
        y = self.held.pop(gpu)
        return self.rules.waive(gpu, y.by if y.rule else None)


def test_a_name_rule_yields_once_its_program_stayed_and_resumes_once_it_stayed_gone() -> None:
    g = RuleGpus(["steam"])
    for t in (0.0, 0.5, 1.0):  # a 1-second steam changes nothing
        g.at(t, "steam")
    for t in (1.5, 2.0, 2.5):
        g.at(t)
    for t in (3.0, 3.5, 4.0, 4.5, 5.0, 5.5):  # it comes back: 3 s from its return again
        g.at(t, "steam")
    assert g.yielded == [] and g.held == {}
    g.at(6.0, "steam")
    assert g.yielded == [(6.0, 0)] and g.held[0].by == "while steam runs"
    g.at(6.5, "steam", gpu=1)  # gone from GPU0 (and only arriving on GPU1)
    g.at(8.0)
    g.at(9.0, "steam")  # back before 3 s: GPU0 stays yielded, its absence starts anew
    for t in (9.5, 11.0, 12.0):
        g.at(t)
    assert g.resumed == [] and 0 in g.held
    g.at(12.5)
    assert g.resumed == [(12.5, 0)] and g.yielded == [(6.0, 0)]


def test_a_program_that_flaps_never_makes_its_rule_yield() -> None:
    g = RuleGpus(["steam"])
    for step in range(60):  # 1 s there, 1 s gone, for a minute, seen twice a second
        g.at(step / 2, *(["steam"] if step % 4 < 2 else []))
    assert g.yielded == [] and g.resumed == []


def test_a_rule_yield_kept_over_a_restart_is_resumed_once_its_program_stayed_gone() -> None:
    kept = {0: YieldInfo(0, "while steam runs", 1.0, rule=True)}
    g = RuleGpus(["steam"], held=kept)
    for t in (0.0, 1.0, 2.5):  # the engine just started: steam is not seen (yet)
        g.at(t)
    assert g.resumed == []
    g.at(3.0)
    assert g.resumed == [(3.0, 0)]
    again = RuleGpus(["steam"], held=kept)
    for t in (0.0, 5.0, 10.0):  # still there: it stays yielded, never resumed in between
        again.at(t, "steam")
    assert again.resumed == [] and again.yielded == [] and 0 in again.held


def test_a_persons_resume_holds_until_the_rules_program_has_left_and_come_back() -> None:
    g = RuleGpus(["steam"])
    for t in (0.0, 1.5, 3.0):
        g.at(t, "steam")
    assert g.yielded == [(3.0, 0)]
    assert g.person_resumes(0) == ["while steam runs"]
    for t in (3.5, 10.0, 20.0):  # steam still there: a person's resume stands
        g.at(t, "steam")
    g.at(21.0)
    g.at(22.0, "steam")  # gone for 1 s only: still the same visit
    for t in (23.0, 26.0, 29.0):
        g.at(t, "steam")
    assert g.yielded == [(3.0, 0)] and g.held == {}
    for t in (30.0, 33.0):  # gone for 3 s: that visit is over
        g.at(t)
    for t in (34.0, 35.0, 36.0):  # a new one: 3 s, and the rule yields again
        g.at(t, "steam")
    assert g.yielded == [(3.0, 0)]
    g.at(37.0, "steam")
    assert g.yielded == [(3.0, 0), (37.0, 0)]


def test_a_persons_resume_holds_against_a_command_rule_until_it_answers_no() -> None:
    g = RuleGpus([{"command": "pgrep -x darktable", "gpus": [1]}])
    g.rules.answered(0, True)
    g.at(0.0)
    assert g.yielded == [(0.0, 1)]
    assert g.person_resumes(1) == ["while `pgrep -x darktable`"]
    g.rules.answered(0, True)
    g.at(5.0)
    assert g.yielded == [(0.0, 1)] and g.held == {}
    g.rules.answered(0, None)  # no answer (a timeout): not the condition's end
    g.rules.answered(0, True)
    g.at(7.0)
    assert g.yielded == [(0.0, 1)] and g.held == {}
    g.rules.answered(0, False)
    g.rules.answered(0, True)
    g.at(10.0)
    assert g.yielded == [(0.0, 1), (10.0, 1)]


def test_a_persons_resume_right_after_a_restart_holds_for_the_kept_rule_yield() -> None:
    kept = {0: YieldInfo(0, "while steam runs", 1.0, rule=True)}
    g = RuleGpus(["steam"], held=kept)
    assert g.person_resumes(0) == ["while steam runs"]  # before the rules' first look
    for t in (0.0, 3.0, 6.0):
        g.at(t, "steam")
    assert g.yielded == [] and g.held == {}


def test_a_persons_resume_outlives_a_restart_until_the_rules_program_has_left() -> None:
    g = RuleGpus(["steam", {"command": "pgrep -x darktable", "gpus": [1]}])
    g.rules.answered(1, True)
    for t in (0.0, 1.5, 3.0):
        g.at(t, "steam")
    assert g.yielded == [(0.0, 1), (3.0, 0)]
    g.person_resumes(0)
    g.person_resumes(1)
    kept = g.rules.waivers()
    assert kept == {0: ("while steam runs",), 1: ("while `pgrep -x darktable`",)}
    again = RuleGpus(["steam", {"command": "pgrep -x darktable", "gpus": [1]}])  # restarted
    again.rules.restore(kept)
    again.rules.answered(1, True)
    for t in (0.0, 3.0, 6.0, 9.0):  # steam and darktable still there: the resumes stand
        again.at(t, "steam")
    assert again.yielded == [] and again.rules.waivers() == kept
    again.rules.answered(1, False)  # darktable gone, then back: yielded again
    again.rules.answered(1, True)
    for t in (10.0, 13.5):  # steam gone for 3 s: that visit is over
        again.at(t)
    assert again.rules.waivers() == {}
    for t in (14.0, 17.0):
        again.at(t, "steam")
    assert again.yielded == [(10.0, 1), (17.0, 0)]


@pytest.mark.process
def test_a_persons_resume_of_a_rules_yield_is_kept_over_an_engine_restart() -> None:
    root = scratch_dir("vt-yield-")
    asked = root / "asked"  # a line per question: the command says yes, every 0.1 s
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       yield_when=parse_rules([{"command": ["sh", "-c", f"echo >> {asked}"],
                                                "gpus": [1], "every": "0.1s"}], "test"))
    label = f"while `sh -c 'echo >> {asked}'`"
    with fake_engine({"a": desc()}, gpus=[8192, 8192], config=cfg, journal=True,
                     root=root) as fe:
        wait_until(lambda: fe.sup.snapshot().gpus[1].yielded_by == label, 20,
                   "GPU1 yielded by the command")
        fe.sup.resume_gpus([1])
    saved = json.loads((root / "state" / "yielded.json").read_text())
    assert saved["yielded"] == [] and [w["rules"] for w in saved["waived"]] == [[label]]
    with fake_engine({"a": desc()}, gpus=[8192, 8192], config=cfg, journal=True,
                     root=root) as again:
        before = len(asked.read_text().splitlines())
        # five more yeses, each followed by ticks: the person's resume still stands
        wait_until(lambda: len(asked.read_text().splitlines()) >= before + 5, 10,
                   "five answers of the restarted engine's command")
        assert again.sup.snapshot().gpus[1].yielded_by is None
        assert again.engine.rules.waivers() == {1: (label,)}


def test_a_persons_resume_of_a_gpu_a_rule_yielded_holds_while_its_program_runs() -> None:
    me = psutil.Process().name()  # this test's process plays the program (on GPU0)
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_arrive_s=0.1, others_leave_s=0.1,
                       yield_when=parse_rules([me], "test"))
    with fake_engine({"a": desc(gpus=[0])}, config=cfg,
                     scripts={"a": script(job_s=0.3)}) as fe:
        fe.gpu.hold(os.getpid(), 0, 512)
        gpu = wait_until(lambda: (g := fe.sup.snapshot().gpus[0]).yielded_by and g, 5,
                         "GPU0 yielded by the rule")
        assert gpu.yielded_rule and gpu.yielded_text == \
            f"yielded while {me} runs (rule), or until resumed"
        assert fe.sup.resume_gpus([0]) == (0,)
        # A job of 0.3 s (15 ticks) runs there while the program still does: not yielded again.
        assert fe.sup.wait(fe.sup.submit("a", b"x"), 5).state == "succeeded"
        assert fe.sup.snapshot().gpus[0].yielded_by is None
        assert any(f"its rule (while {me} runs) yields it again only once" in line.text
                   for line in fe.sup.snapshot().log)
        fe.gpu.release(os.getpid())  # it leaves (for 0.1 s), then comes back: yielded again
        wait_until(lambda: not fe.engine.rules.following, 5, "the program's visit over")
        fe.gpu.hold(os.getpid(), 0, 512)
        wait_until(lambda: fe.sup.snapshot().gpus[0].yielded_by == f"while {me} runs", 5,
                   "GPU0 yielded again by the rule")


@pytest.mark.process
def test_a_rule_command_decides_and_one_that_hangs_is_killed_and_counts_as_no() -> None:
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       yield_when=parse_rules([
                           {"command": "true", "gpus": [1], "every": "0.2s"},
                           {"command": ["sleep", "30"], "timeout": "0.3s", "every": "0.2s"}],
                           "test"))
    with fake_engine({"a": desc()}, gpus=[8192, 8192], config=cfg,
                     scripts={"a": script(job_s=0.01)}) as fe:
        wait_until(lambda: fe.sup.snapshot().gpus[1].yielded_by == "while `true`", 5,
                   "GPU1 yielded by the command")
        wait_until(lambda: any("did not answer within 0.3 s (killed)" in line.text
                               for line in fe.sup.snapshot().log), 5, "the hang said")
        assert fe.sup.snapshot().gpus[0].yielded_by is None
        assert fe.sup.wait(fe.sup.submit("a", b"x"), 5).state == "succeeded"  # not stuck
    assert not [p for p in psutil.process_iter(["cmdline"])
                if p.info["cmdline"] == ["sleep", "30"] and p.ppid() == os.getpid()]


def test_a_per_gpu_reserve_is_kept_free(tmp_path: Path) -> None:
    import argparse

    from supervisor.paths import Paths
    from vramtui.serve import engine_config

    paths = Paths(tmp_path / "cfg", tmp_path / "state", tmp_path / "run")
    paths.settings_file.parent.mkdir(parents=True)
    paths.settings_file.write_text("engine:\n  reserve: {0: 4GiB}\n  yield_when: [steam]\n")
    cfg = engine_config(argparse.Namespace(), paths, environ={})
    assert cfg.gpu_reserve_mib == {0: 4096} and cfg.yield_when[0].name == "steam"
    paths.settings_file.write_text("engine:\n  reserve: {gpu0: 4GiB}\n")
    with pytest.raises(VramtuiError, match="a map of GPU index to size"):
        engine_config(argparse.Namespace(), paths, environ={})
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       gpu_reserve_mib={0: 4096})
    big = {"vram": {"weights": "5GiB", "activation": "256MiB"}, "safety": "0MiB"}
    with fake_engine({"big": big}, config=cfg) as fe:
        assert fe.sup.snapshot().gpus[0].reserve_mib == 4096
        with pytest.raises(Refused, match="4096 MiB reserve"):
            fe.sup.submit("big", b"x")


@pytest.mark.process
def test_a_rule_command_still_running_when_the_engine_stops_is_killed() -> None:
    rules = Rules(parse_rules([{"command": ["sleep", "30"], "timeout": "20s"}], "test"),
                  lambda *_a, **_k: None)

    def alive() -> list[int]:
        found = []
        for p in psutil.Process().children():
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.cmdline() == ["sleep", "30"] and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p.pid)
        return found

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(rules.watch_commands())
        await wait_until_async(alive, 5, "the rule's command running")
        task.cancel()  # what the engine does to its rules when it stops
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await wait_until_async(lambda: not alive(), 5, "the command killed with the rules")

    asyncio.run(main())


@pytest.mark.process
def test_what_a_rule_command_leaves_behind_is_killed_once_it_has_answered() -> None:
    rule = parse_rules([{"command": ["sh", "-c", "sleep 31 & exit 1"]}], "test")[0]
    sessions: list[int] = []
    rules = Rules([rule], lambda *_a, **_k: None, own=sessions.append)

    def left() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getsid(p.pid) in sessions and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
        return found

    try:
        assert asyncio.run(rules.ask(0, rule)) is False  # exit 1: no
        wait_until(lambda: not left(), 5, "the command's sleep killed with it")
    finally:
        for p in left():
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_a_rule_yield_kept_over_a_restart_stays_until_its_command_first_answers() -> None:
    rules = Rules(parse_rules([{"command": "pgrep -x darktable"}], "test"),
                  lambda *_a, **_k: None)
    held = {0: YieldInfo(0, "while `pgrep -x darktable`", 1.0, rule=True)}  # from the file
    resumed: list[list[int]] = []
    rules.follow({}, [0], held, lambda *_a, **_k: None, resumed.append)
    assert resumed == []  # the command has not answered yet: nothing is known to be over
    rules.answers[0] = False
    rules.follow({}, [0], held, lambda *_a, **_k: None, resumed.append)
    assert resumed == [[0]]


def test_a_rule_yield_of_a_gpu_no_longer_there_is_not_resumed_from_the_ticker() -> None:
    rules = Rules(parse_rules(["steam"], "test"), lambda *_a, **_k: None)
    yields = Yields(None)
    # An older yields file names no device: GPU1's rule yield comes back on a one-GPU engine.
    yields.held = {1: YieldInfo(1, "while steam runs", 1.0, rule=True)}
    # (take_back refuses a GPU that is not there: raised in the engine's ticker, it ended it)
    rules.follow({}, [0], yields.held, lambda *_a, **_k: None,
                 lambda gpus: yields.take_back(gpus, [0]))


def test_a_yield_of_a_gpu_gone_after_a_restart_is_said_plainly(tmp_path: Path) -> None:
    path = tmp_path / "yielded.json"
    Yields(path, device=lambda g: "Simulated GPU").give([1], [0, 1], by="ada")
    fewer = Yields(path, device=lambda g: "Simulated GPU" if g == 0 else "")
    said = fewer.load()
    assert not fewer.held and "there is no GPU1 now" in said[0], said
