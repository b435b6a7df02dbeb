"""What the engine measured of its backends' time survives a restart (``engine.timings``).

The file's round trip, its bad contents and failed writes on their own; then through the
real engine, restarted on the same state directory, with real workers of the simulated model
whose load and job times the test sets (``SIM_LOAD_S``, its steps): the figures the first
engine showed come back before anything has loaded again, and a changed launch, in a running
engine or across a restart, starts from the priors.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
from pathlib import Path

import pytest
from engine_support import engine, scratch_dir, sim_backend
from waiting import wait_until

from supervisor import Supervisor
from supervisor.admission import DEFAULT_RELOAD_COST_S
from supervisor.backends.schema import BackendSpec, VramSpec
from supervisor.engine import EngineConfig, timings
from supervisor.engine.runtime import BackendRuntime
from supervisor.engine.timings import MAX_BYTES, Timings
from supervisor.jobs import JobState
from supervisor.scheduler.expect import Learner


def runtime(name: str = "m", **env: str) -> BackendRuntime:
    return BackendRuntime(BackendSpec(name=name, command=("python3", "model.py"),
                                      env=dict(env), vram=VramSpec(peak_mib=1000)))


def measured(path: Path) -> tuple[list[BackendRuntime], Learner]:
    """Two backends with loads, a wake and runs measured, saved to ``path``."""
    a, b = runtime("a"), runtime("b", MODEL="x")
    learner = Learner()
    a.measures.timed(load_s=2.0)
    a.measures.timed(load_s=2.5, wake_s=0.25)
    b.measures.timed(load_s=7.0)
    for s in (60.0,) * 20 + (3.0, 5.0, 4.0):  # (more runs than it keeps)
        learner.ran("a", s)
    Timings(path).save([a, b], learner, 0.0)
    return [a, b], learner


def entries(path: Path) -> dict[str, dict[str, object]]:
    return json.loads(path.read_text())["backends"]


def test_the_measured_times_come_back_as_they_were(tmp_path: Path) -> None:
    path = tmp_path / "timings.json"
    (a, b), learner = measured(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = [runtime("a"), runtime("b", MODEL="x"), runtime("new")]
    fresh = Learner()
    assert Timings(path).restore(again, fresh) == []
    assert list(again[0].measures.load_times) == [2.0, 2.5]
    assert list(again[0].measures.wake_times) == [0.25]
    assert again[0].reload_cost_s == a.reload_cost_s == 2.25
    assert again[1].reload_cost_s == 7.0
    assert again[2].reload_cost_s == DEFAULT_RELOAD_COST_S  # nothing measured: its prior
    # the mean as it was (it weighs the 60 s runs no longer kept: replaying the kept runs
    # would say 4.3 s), and the runs kept
    assert fresh.job_times()["a"] == learner.job_times()["a"] > 5.0
    assert fresh.runs() == learner.runs()
    assert fresh.view(0.0).job_s["a"] == learner.view(0.0).job_s["a"]


def test_a_clean_restore_is_not_written_again_until_something_changes(tmp_path: Path) -> None:
    path = tmp_path / "timings.json"
    measured(path)
    again, learner = [runtime("a"), runtime("b", MODEL="x")], Learner()
    store = Timings(path)
    assert store.restore(again, learner) == []
    inode = path.stat().st_ino
    store.save(again, learner, 0.0)
    assert path.stat().st_ino == inode  # (a write replaces the file)
    again[1].measures.timed(load_s=8.0)
    store.save(again, learner, 1.0)
    assert path.stat().st_ino != inode and entries(path)["b"]["loads"] == [7.0, 8.0]


def test_a_retired_backend_is_written_though_nothing_else_was_measured(tmp_path: Path) -> None:
    # (a reload removed it before any tick had written its figures, and no other backend
    # has any: the stop's save still writes its entry)
    path = tmp_path / "timings.json"
    gone, learner = runtime("a"), Learner()
    gone.measures.timed(load_s=2.0)
    store = Timings(path)
    store.retire(gone, learner)
    store.save([runtime("b")], learner, 0.0, force=True)
    assert entries(path)["a"]["loads"] == [2.0]


def test_a_worker_of_the_old_launch_writes_nothing_under_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "timings.json"
    (a, b), learner = measured(path)
    a.spec = runtime("a", EXTRA="1").spec  # (its launch changed by a reload)
    a.measures.forget_times("a#1")  # its worker a#1 runs on
    learner.forget_runs("a")
    a.measures.timed(load_s=99.0)
    learner.ran("a", 500.0)
    Timings(path).save([a, b], learner, 0.0)
    assert sorted(entries(path)) == ["b"]  # (a kill -9 now restores nothing of a#1's)


def test_a_backend_whose_launch_changed_starts_from_its_priors(tmp_path: Path) -> None:
    path = tmp_path / "timings.json"
    measured(path)
    again = [runtime("a", EXTRA="1"), runtime("b", MODEL="x")]
    fresh = Learner()
    store = Timings(path)
    said = store.restore(again, fresh)
    assert len(said) == 1 and said[0].startswith("a: its command, directory or environment")
    assert not again[0].measures.load_times and "a" not in fresh.job_times()
    assert list(again[1].measures.load_times) == [7.0]  # the other one is unchanged
    # the file keeps no environment's values, only a hash of them
    assert "MODEL" not in path.read_text() and '"x"' not in path.read_text()
    # the next save drops the stale entry, even with nothing measured since: the line is
    # said once, not at every start
    store.save(again, fresh, 0.0)
    assert sorted(entries(path)) == ["b"]
    assert Timings(path).restore(again, Learner()) == []


def test_a_backend_not_configured_now_keeps_its_entry(tmp_path: Path) -> None:
    path = tmp_path / "timings.json"
    measured(path)
    only_b = [runtime("b", MODEL="x")]  # (a's descriptor broken for one start)
    fresh = Learner()
    store = Timings(path)
    assert store.restore(only_b, fresh) == []
    only_b[0].measures.timed(load_s=9.0)
    store.save(only_b, fresh, 0.0)
    assert entries(path)["b"]["loads"] == [7.0, 9.0]
    again = [runtime("a"), runtime("b", MODEL="x")]
    back = Learner()
    Timings(path).restore(again, back)
    assert list(again[0].measures.load_times) == [2.0, 2.5] and "a" in back.job_times()
    # or, its descriptor mended, a reload adds it back to the engine that carried it
    added = runtime("a")
    store.adopt(added, fresh)
    assert list(added.measures.load_times) == [2.0, 2.5] and "a" in fresh.job_times()
    carrying, learner = Timings(path), Learner()
    assert carrying.restore([runtime("b", MODEL="x")], learner) == []
    other = runtime("a", EXTRA="1")  # (added with another launch: nothing of the old one)
    carrying.adopt(other, learner)
    assert not other.measures.load_times and "a" not in learner.job_times()


@pytest.mark.parametrize("content", [
    b"not json", b"\xff\xfe", b"[1, 2]", b'{"version": 2, "backends": {}}',
    b'{"version": true, "backends": {}}', b'{"version": 1, "backends": []}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"version": 1, "backends": {"a": {"launch": "x", "loads": [' + b"1" * 5000 + b"]}}}",
    b'{"version": 1, "backends": {}, "pad": "' + b"x" * MAX_BYTES + b'"}',
], ids=["garbage", "not-utf8", "a-list", "newer", "bool-version", "no-map", "deep",
        "5000-digits", "too-large"])
def test_a_file_that_is_not_ours_is_said_in_one_line_and_nothing_comes_back(
        tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "timings.json"
    path.write_bytes(content)
    again = [runtime("a")]
    fresh = Learner()
    said = Timings(path).restore(again, fresh)
    assert len(said) == 1 and "measures them again" in said[0], said
    assert "set_int_max_str_digits" not in said[0] and said[0].count(str(path)) == 1
    assert not again[0].measures.load_times and not fresh.job_times()


@pytest.mark.parametrize("kind", ["fifo", "link", "directory"])
def test_a_path_that_is_no_file_of_ours_neither_hangs_the_start_nor_is_read(
        tmp_path: Path, kind: str) -> None:
    path = tmp_path / "timings.json"
    if kind == "fifo":  # (opened plainly, it would block until a writer came)
        os.mkfifo(path)
    elif kind == "link":
        measured(tmp_path / "elsewhere.json")
        path.symlink_to(tmp_path / "elsewhere.json")
    else:
        path.mkdir()
    again = [runtime("a")]
    said = Timings(path).restore(again, Learner())
    assert len(said) == 1 and "measures them again" in said[0], said
    assert not again[0].measures.load_times


@pytest.mark.parametrize("figures", [
    {"loads": [1.0, -2.0]}, {"loads": ["1"]}, {"runs": [True]}, {"wakes": 3},
    {"loads": [1e400]},  # (JSON's way to say infinity)
    {"loads": [int("1" + "0" * 400)]},  # (too large for a float)
    {"loads": [1e308, 1e308]},  # (finite, but their sum is not: reload_cost_s inf)
    {"job_s": None}, {"runs": []},  # (a mean without its runs, runs without their mean)
    {"launch": 3},
], ids=["negative", "text", "bool", "not-a-list", "infinite", "400-digits", "huge",
        "mean-none", "mean-alone", "launch"])
def test_an_entry_that_is_not_seconds_is_dropped_and_the_rest_come_back(
        tmp_path: Path, figures: dict[str, object]) -> None:
    path = tmp_path / "timings.json"
    measured(path)
    data = json.loads(path.read_text())
    data["backends"]["a"].update(figures)
    path.write_text(json.dumps(data))
    again = [runtime("a"), runtime("b", MODEL="x")]
    fresh = Learner()
    said = Timings(path).restore(again, fresh)
    assert len(said) == 1 and "the measured times of a are not seconds" in said[0], said
    assert not again[0].measures.load_times and "a" not in fresh.job_times()
    assert list(again[1].measures.load_times) == [7.0]
    assert math.isfinite(again[0].reload_cost_s) and math.isfinite(again[0].wake_cost_s)


def test_writes_coalesce_and_a_failed_one_is_logged_once_not_raised(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "timings.json"
    rt, learner = runtime("a"), Learner()
    store = Timings(path)
    store.save([rt], learner, 100.0)
    assert not path.exists()  # nothing measured yet: nothing written
    rt.measures.timed(load_s=1.5)
    store.save([rt], learner, 100.5)
    assert entries(path)["a"]["loads"] == [1.5]
    rt.measures.timed(load_s=2.5)
    store.save([rt], learner, 101.0)  # within SAVE_EVERY_S of the last write: not yet
    assert entries(path)["a"]["loads"] == [1.5]
    store.save([rt], learner, 100.5 + timings.SAVE_EVERY_S)
    assert entries(path)["a"]["loads"] == [1.5, 2.5]
    learner.ran("a", 9.0)
    store.save([rt], learner, 101.0, force=True)  # the engine stops
    assert entries(path)["a"]["runs"] == [9.0] and entries(path)["a"]["job_s"] == 9.0

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    failing = Timings(blocked / "timings.json")
    with caplog.at_level(logging.WARNING, logger=timings.__name__):
        for t in range(3):
            rt.measures.timed(load_s=float(t))
            failing.save([rt], learner, t * timings.SAVE_EVERY_S)
    said = [r for r in caplog.records if "cannot record the measured" in r.getMessage()]
    assert len(said) == 1, caplog.records  # (tried each time, said once)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "timings.json"]  # no temp


# ------------------------------------------------------------------- through the engine

LOAD_S = 0.6


def model(load_s: float = LOAD_S) -> dict[str, object]:
    return sim_backend("m", 512, 256, load_s=load_s)


def figures(sup: Supervisor) -> tuple[float | None, float | None]:
    view = sup.snapshot().backend("m")
    assert view is not None
    return view.reload_cost_s, view.job_s


def ran_and_evicted(sup: Supervisor) -> tuple[float | None, float | None]:
    """A job of ``m`` run, and its worker evicted (a reload may remove it): its figures."""
    assert sup.wait(sup.submit("m", b"{}"), 60).state is JobState.SUCCEEDED
    ran = figures(sup)
    wait_until(lambda: sup.snapshot().backend("m").state == "ready", what="idle")
    sup.evict("m")
    wait_until(lambda: sup.snapshot().backend("m").state == "cold", what="evicted")
    return ran


@pytest.mark.process
def test_a_restarted_engine_knows_the_load_and_job_times_it_measured() -> None:
    root = scratch_dir()
    job = json.dumps({"steps": 10, "step_s": 0.05}).encode()  # 0.5 s of work
    path = root / "state" / "timings.json"
    with engine([model()], root=root) as sup:
        assert figures(sup) == (DEFAULT_RELOAD_COST_S, None)  # priors, nothing measured
        assert sup.wait(sup.submit("m", job), 60).state is JobState.SUCCEEDED
        first = figures(sup)
        # (the loads are written at the next tick, the runs within SAVE_EVERY_S: a kill -9
        # loses at most that much; this engine's stop writes them at once)
        wait_until(lambda: path.exists() and "m" in json.loads(path.read_text())["backends"],
                   what="the load time written")
    assert json.loads(path.read_text())["backends"]["m"]["runs"]
    reload_s, job_s = first
    assert reload_s is not None and reload_s >= LOAD_S  # the model's load, measured
    assert job_s is not None and job_s >= 0.5
    with engine([model()], root=root) as sup:
        assert sup.snapshot().backend("m").state == "cold"  # nothing loaded again yet
        assert figures(sup) == first
    with engine([model(load_s=0.3)], root=root) as sup:  # another launch (its env)
        assert figures(sup) == (DEFAULT_RELOAD_COST_S, None)
        log = [line.text for line in sup.snapshot().log]
    assert any("m: its command, directory or environment changed" in t for t in log), log


@pytest.mark.process
def test_a_reloaded_descriptor_with_another_launch_forgets_the_times() -> None:
    root = scratch_dir()
    with engine([model()], root=root) as sup:
        assert sup.wait(sup.submit("m", b"{}"), 60).state is JobState.SUCCEEDED
        reload_s, job_s = figures(sup)
        assert reload_s is not None and reload_s >= LOAD_S and job_s is not None
        source = Path(sup.descriptor("m").layers[0].file)
        source.write_text(json.dumps({"backends": [model(load_s=0.3)]}))
        result = sup.reload()
        assert figures(sup) == (DEFAULT_RELOAD_COST_S, None)
    notes = [n for ch in result.changed for n in ch.notes]
    assert any("measured anew (env changed)" in n for n in notes), result


@pytest.mark.process
def test_a_worker_of_the_old_launch_measures_for_it_alone() -> None:
    """A reload that changes the launch while the worker is busy: that worker runs the old
    command until it goes, and what it measured meanwhile goes with it."""
    root = scratch_dir()
    long_job = json.dumps({"steps": 40, "step_s": 0.05}).encode()  # 2 s of work
    with engine([model()], root=root) as sup:
        job = sup.submit("m", long_job)
        wait_until(lambda: sup.snapshot().backend("m").running, what="the job running")
        source = Path(sup.descriptor("m").layers[0].file)
        source.write_text(json.dumps({"backends": [model(load_s=0.3)]}))
        sup.reload()
        assert figures(sup) == (DEFAULT_RELOAD_COST_S, None)
        assert sup.wait(job, 60).state is JobState.SUCCEEDED
        assert figures(sup)[1] is not None  # (the old worker's job, while it stays)
        sup.evict("m")
        wait_until(lambda: sup.snapshot().backend("m").state == "cold", what="evicted")
        assert figures(sup) == (DEFAULT_RELOAD_COST_S, None)
    path = root / "state" / "timings.json"  # (not written at all if the reload came first)
    assert not path.exists() or "m" not in json.loads(path.read_text())["backends"]


@pytest.mark.process
def test_a_backend_removed_by_reload_gets_its_times_back_when_added_again() -> None:
    root = scratch_dir()
    other = sim_backend("other", 256, 128)
    with engine([model(), other], root=root) as sup:
        first = ran_and_evicted(sup)
        source = Path(sup.descriptor("m").layers[0].file)
        source.write_text(json.dumps({"backends": [other]}))
        assert sup.reload().removed == ("m",)
    with engine([model(), other], root=root) as sup:  # (restarted with it)
        assert figures(sup) == first
        source = Path(sup.descriptor("m").layers[0].file)
        source.write_text(json.dumps({"backends": [other]}))
        assert sup.reload().removed == ("m",)
        source.write_text(json.dumps({"backends": [model(), other]}))
        assert sup.reload().added == ("m",)  # (added again while it runs)
        assert figures(sup) == first


@pytest.mark.process
def test_a_backend_removed_and_added_again_by_reload_starts_from_its_priors() -> None:
    other = sim_backend("other", 256, 128)
    with engine([model(), other], root=scratch_dir()) as sup:
        ran_and_evicted(sup)
        source = Path(sup.descriptor("m").layers[0].file)
        source.write_text(json.dumps({"backends": [other]}))
        assert sup.reload().removed == ("m",)
        source.write_text(json.dumps({"backends": [model(load_s=0.3), other]}))
        assert sup.reload().added == ("m",)
        assert figures(sup) == (DEFAULT_RELOAD_COST_S, None)


@pytest.mark.process
def test_an_engine_without_a_journal_keeps_no_times() -> None:
    root = scratch_dir()
    with engine([model()], root=root, config=EngineConfig(reserve_mib=0, tick_s=0.1,
                                                          journal=False)) as sup:
        assert sup.wait(sup.submit("m", b"{}"), 60).state is JobState.SUCCEEDED
        assert figures(sup)[1] is not None
    assert not (root / "state" / "timings.json").exists()
    with engine([model()], root=root) as sup:
        assert figures(sup) == (DEFAULT_RELOAD_COST_S, None)


@pytest.mark.process
def test_a_backend_missing_for_one_start_gets_its_times_back_when_a_reload_adds_it() -> None:
    root = scratch_dir()
    other = sim_backend("other", 256, 128)
    with engine([model(), other], root=root) as sup:
        assert sup.wait(sup.submit("m", b"{}"), 60).state is JobState.SUCCEEDED
        first = figures(sup)
    with engine([other], root=root) as sup:  # (m's descriptor gone for a while)
        assert sup.wait(sup.submit("other", b"{}"), 60).state is JobState.SUCCEEDED
        source = Path(sup.descriptor("other").layers[0].file)
        source.write_text(json.dumps({"backends": [model(), other]}))
        assert sup.reload().added == ("m",)
        assert figures(sup) == first
