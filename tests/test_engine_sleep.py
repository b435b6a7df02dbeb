"""The sleep tier's rules in the engine, on fake workers (``tests/fake_worker.py``): milliseconds.

Two 9 GiB models on a 12 GiB card take turns by sleeping, not reloading: one worker each all
along, and the fake GPU (the truth the engine only reads) never over its size.  Workers that
cannot sleep are stopped; workers whose sleep gives nothing back, that lie about what they
keep, that take their memory back asleep, or whose sleep or wake fails or hangs are stopped
instead, and an event says why; their jobs run on a fresh worker.  Sleep and wake can be
asked; a sleeping worker is unloaded at its keep-alive like an idle one.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_worker import FakeEngine, Script, fake_engine
from waiting import wait_until

from supervisor.engine import EngineConfig
from supervisor.errors import NothingToDo, Refused
from supervisor.events import EngineEvent
from supervisor.jobs import JobState

CARD = 12 * 1024
NINE = {"vram": {"weights": "8704MiB", "activation": "512MiB"}, "safety": "0MiB"}


def sleepy(mode: str = "honest", **kw: Any) -> Script:
    """A 9 GiB model that loads in 0.2 s and sleeps to 300 MiB."""
    fields: dict[str, Any] = {"weights_mib": 8704, "activation_mib": 512, "load_s": 0.2,
                              "job_s": 0.01, "sleep_keeps_mib": 300, "sleep_mode": mode,
                              "wake_s": 0.02, **kw}
    return Script(**fields)


class Events:
    """Every sleep event, as the engine published it."""

    def __init__(self, fe: FakeEngine) -> None:
        self.seen: list[EngineEvent] = []
        self._lock = threading.Lock()
        fe.sup.subscribe(kinds=["sleep"], callback=self._add)

    def _add(self, event: EngineEvent) -> None:
        with self._lock:
            self.seen.append(event)

    def of(self, state: str) -> list[EngineEvent]:
        with self._lock:
            return [e for e in self.seen if e.state == state]


def alternate(fe: FakeEngine, rounds: int = 4) -> list[Any]:
    """a, b, a, b, …: each job submitted once the one before has ended (a user taking
    turns between two models)."""
    views = []
    for i in range(rounds * 2):
        view = fe.sup.wait(fe.sup.submit("ab"[i % 2], b"%d" % i), 10)
        assert view.state is JobState.SUCCEEDED, view.error
        views.append(view)
    return views


def state(fe: FakeEngine, backend: str) -> str:
    view = fe.sup.snapshot().backend(backend)
    assert view is not None
    return view.state


def test_two_models_that_cannot_share_a_card_take_turns_asleep() -> None:
    scripts = {"a": sleepy(), "b": sleepy()}
    with fake_engine({"a": NINE, "b": NINE}, gpus=[CARD], scripts=scripts) as fe:
        events = Events(fe)
        alternate(fe)
        snap = fe.sup.snapshot()
        a = snap.backend("a")
        assert a is not None and a.state == "asleep"
        assert a.reserved_mib == 300  # what it keeps, measured: never 0, never its 8704
        wakes = events.of("awake")
    assert [len(fe.workers.of(n)) for n in "ab"] == [1, 1]  # no respawn
    assert fe.gpu.overcommits == [] and fe.gpu.peak[0] <= CARD
    a_worker, b_worker = fe.workers.of("a")[0], fe.workers.of("b")[0]
    assert (len(a_worker.sleeps), a_worker.wakes) == (4, 3)
    assert (len(b_worker.sleeps), b_worker.wakes) == (3, 3)
    # (the wake hook takes 0.02 s; uvloop's timers keep whole milliseconds and may end
    # one early)
    assert len(wakes) == 6 and all(e.seconds is not None and e.seconds >= 0.019 for e in wakes)
    assert events.of("stopped") == []


def test_a_model_without_sleep_hooks_is_stopped_and_reloaded() -> None:
    plain = {"weights_mib": 8704, "activation_mib": 512, "load_s": 0.05, "job_s": 0.01}
    with fake_engine({"a": NINE, "b": NINE}, gpus=[CARD],
                     scripts={"a": Script(**plain), "b": Script(**plain)}) as fe:
        alternate(fe, rounds=2)
    assert [len(fe.workers.of(n)) for n in "ab"] == [2, 2]
    assert fe.gpu.overcommits == []


def test_a_sleep_that_does_not_fit_the_host_budget_is_a_stop() -> None:
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       sleep_host_budget_mib=1024)  # a 9 GiB model's weights do not fit
    with fake_engine({"a": NINE, "b": NINE}, gpus=[CARD], config=cfg,
                     scripts={"a": sleepy(), "b": sleepy()}) as fe:
        alternate(fe, rounds=1)
    assert fe.workers.of("a")[0].sleeps == [] and fe.workers.of("a")[0].exited


@pytest.mark.parametrize(("mode", "why"), [
    ("keeps", "gave nothing back"),
    ("lies", "said it keeps 300 MiB"),
    ("sleep-fails", "its sleep failed: RuntimeError: cannot release the weights"),
    ("sleep-hangs", "its sleep failed: no answer within"),
])
def test_a_bad_sleep_is_measured_and_the_worker_stopped_instead(mode: str, why: str) -> None:
    descriptor = {**NINE, "timeouts": {"start": "1s"}}
    with fake_engine({"a": descriptor, "b": NINE}, gpus=[CARD],
                     scripts={"a": sleepy(mode), "b": sleepy()}) as fe:
        events = Events(fe)
        alternate(fe, rounds=2)  # a, b, a, b
        stopped = events.of("stopped")
        assert len(stopped) == 1 and stopped[0].backend == "a" and why in stopped[0].message
        lines = [line.text for line in fe.sup.snapshot().log if line.backend == "a"]
        assert any(why in text and "stopping it instead" in text for text in lines)
    first, second = fe.workers.of("a")
    assert len(first.sleeps) == 1 and first.exited
    assert second.sleeps == []  # not put to sleep again: stopped for b's second turn
    assert fe.gpu.overcommits == []


@pytest.mark.parametrize(("mode", "why"), [
    ("wake-fails", "it did not wake: RuntimeError: the weights are gone"),
    ("wake-hangs", "it did not wake: no answer within 1 s"),
])
def test_a_wake_that_fails_or_hangs_runs_the_job_on_a_fresh_worker(mode: str, why: str) -> None:
    descriptor = {**NINE, "timeouts": {"start": "1s"}}
    with fake_engine({"a": descriptor, "b": NINE}, gpus=[CARD],
                     scripts={"a": sleepy(mode), "b": sleepy()}) as fe:
        events = Events(fe)
        views = alternate(fe, rounds=2)
        stopped = events.of("stopped")
        assert [(e.backend, why in e.message) for e in stopped] == [("a", True)]
        retried = views[2]  # a's second job: its wake failed, it ran after all
        notes = [note for _t, _s, note in retried.history]
        assert any("requeued: a did not wake" in n for n in notes)
    first, second = fe.workers.of("a")
    assert first.wakes == 1 and first.exited and second.sleeps == []
    assert fe.gpu.overcommits == []


def test_a_worker_that_dies_in_its_wake_runs_the_waiting_job_on_a_fresh_worker() -> None:
    """The job waited for the wake: it never ran on that worker, so it is not failed with the
    worker's crash (a crash in the hook, the OOM killer), it runs on a fresh one."""
    with fake_engine({"a": NINE, "b": NINE}, gpus=[CARD],
                     scripts={"a": sleepy("wake-crashes"), "b": sleepy()}) as fe:
        events = Events(fe)
        views = alternate(fe, rounds=3)
        stopped = events.of("stopped")
        assert [(e.backend, "it died in its wake" in e.message) for e in stopped] == [
            ("a", True)], [e.message for e in stopped]
        assert [v.state for v in views] == [JobState.SUCCEEDED] * 6, [v.error for v in views]
        notes = [note for _t, _s, note in views[2].history]
        assert any(n.startswith("requeued: a") and "before it ran" in n for n in notes), notes
    first, second, third = fe.workers.of("a")
    assert first.wakes == 1 and first.exited and first.sent == [views[0].id]
    assert second.sent == [views[2].id] and third.sent == [views[4].id]
    assert second.sleeps == third.sleeps == []  # stopped for b's turns, not put to sleep
    assert fe.gpu.overcommits == []


def test_a_wake_the_engine_gives_up_is_no_failed_wake() -> None:
    """A wake under way on a GPU just yielded is given up (the worker stopped): that is no
    crash in the wake, so no sleep event says it died, and the backend may sleep again."""
    with fake_engine({"a": NINE, "b": NINE}, gpus=[CARD],
                     scripts={"a": sleepy(wake_s=1.5), "b": sleepy()}) as fe:
        events = Events(fe)
        alternate(fe, rounds=1)  # a, b: a asleep
        job = fe.sup.submit("a", b"x")  # its wake takes 1.5 s
        wait_until(lambda: fe.workers.of("a")[0].wakes == 1, 5, "a waking")
        fe.sup.yield_gpus()
        wait_until(lambda: fe.workers.of("a")[0].exited, 5, "the wake given up")
        wait_until(lambda: any(line.text == "a stopped" for line in fe.sup.snapshot().log),
                   5, "its stop told")
        assert fe.sup.job(job).state == "queued"
        assert events.of("stopped") == []
        view = fe.sup.snapshot().backend("a")
        assert view is not None and view.no_sleep is None


def test_a_worker_that_takes_its_memory_back_asleep_is_stopped() -> None:
    with fake_engine({"a": NINE, "b": NINE}, gpus=[CARD],
                     scripts={"a": sleepy("grows"), "b": sleepy(job_s=0.5)}) as fe:
        events = Events(fe)
        fe.sup.wait(fe.sup.submit("a", b""), 10)
        b_job = fe.sup.submit("b", b"")
        wait_until(lambda: events.of("stopped"), what="a stopped")
        assert "took its memory back while asleep" in events.of("stopped")[0].message
        assert fe.sup.wait(b_job, 10).state is JobState.SUCCEEDED
    assert fe.workers.of("a")[0].exited


@pytest.mark.parametrize(("card_mib", "stopped"), [(CARD, True), (19 * 1024, False)],
                         ids=["over-commits", "room-left"])
def test_a_sleeping_worker_that_creeps_back_is_stopped_once_its_gpu_is_over_committed(
        card_mib: int, stopped: bool) -> None:
    """It takes back 900 MiB asleep (less than the 1 GiB a sleeper may grow unasked), after
    a model was loaded into the room its sleep gave: on a 12 GiB card that over-commits the
    GPU (the fake GPU's own count), and it is stopped; with room left, it stays asleep."""
    big = {"vram": {"weights": "11264MiB", "activation": "512MiB"}, "safety": "0MiB"}
    with fake_engine({"a": NINE, "b": big}, gpus=[card_mib],
                     scripts={"a": sleepy("creeps", creep_mib=900),
                              "b": Script(weights_mib=11264, activation_mib=512,
                                          load_s=0.05, job_s=1.5)}) as fe:
        events = Events(fe)
        fe.sup.wait(fe.sup.submit("a", b""), 10)
        b_job = fe.sup.submit("b", b"")
        wait_until(lambda: fe.workers.of("a")[0].sleeps, what="a asleep")
        if stopped:
            wait_until(lambda: events.of("stopped"), what="a stopped")
            (why,) = [e.message for e in events.of("stopped")]
            assert "took its memory back while asleep" in why and "more than it may" in why
        assert fe.sup.wait(b_job, 10).state is JobState.SUCCEEDED
        assert [e.backend for e in events.of("stopped")] == (["a"] if stopped else [])


def test_sleep_and_wake_asked() -> None:
    plain = Script(weights_mib=1000, activation_mib=100)
    with fake_engine({"a": NINE, "plain": {"vram": "2GiB"}}, gpus=[CARD],
                     scripts={"a": sleepy(), "plain": plain}) as fe:
        with pytest.raises(NothingToDo, match="a is not loaded: nothing to put to sleep"):
            fe.sup.sleep("a")
        with pytest.raises(NothingToDo, match=r"nothing to wake \(`vramtui preload a`"):
            fe.sup.wake("a")
        fe.sup.wait(fe.sup.submit("a", b""), 10)
        fe.sup.wake("a")  # awake already: it stays so (asking twice is no error)
        fe.sup.wait(fe.sup.submit("plain", b""), 10)
        with pytest.raises(Refused, match="no @worker_sdk.sleep"):
            fe.sup.sleep("plain")
        fe.sup.sleep("a")
        wait_until(lambda: fe.sup.snapshot().backend("a").reserved_mib == 300,  # type: ignore
                   what="a asleep, measured")
        assert fe.gpu.used(0) == 300 + 1000
        fe.sup.sleep("a")  # asleep already: it stays so
        fe.sup.wake("a")
        wait_until(lambda: state(fe, "a") == "ready", what="a awake")
        assert fe.gpu.used(0) == 8704 + 1000
        worker = fe.worker("a")
        assert (len(worker.sleeps), worker.wakes) == (1, 1)


def test_a_wake_asked_waits_for_the_room_another_sleep_gives_back() -> None:
    # b is still falling asleep when a's wake is asked: the wake waits (a preload evicts
    # nobody) and a wakes once b's memory is back, not never.
    scripts = {"a": sleepy(), "b": sleepy(sleep_s=0.3)}
    with fake_engine({"a": NINE, "b": NINE}, gpus=[CARD], scripts=scripts) as fe:
        alternate(fe, rounds=1)
        assert (state(fe, "a"), state(fe, "b")) == ("asleep", "ready")
        fe.sup.sleep("b")
        fe.sup.wake("a")
        wait_until(lambda: state(fe, "a") == "ready", 5, what="a awake")
        assert state(fe, "b") == "asleep"
    assert fe.gpu.overcommits == []


def test_a_busy_worker_is_not_put_to_sleep_when_asked() -> None:
    with fake_engine({"a": NINE}, gpus=[CARD], scripts={"a": sleepy(manual=True)}) as fe:
        job = fe.sup.submit("a", b"")
        wait_until(lambda: fe.workers.live("a"), what="a's worker")
        fe.on_loop(fe.worker("a").ready)
        wait_until(lambda: fe.sup.job(job).state is JobState.RUNNING, what="running")
        with pytest.raises(Refused, match="wait until it is idle"):
            fe.sup.sleep("a")
        fe.on_loop(lambda: fe.worker("a").reply(job, b"ok"))
        assert fe.sup.wait(job, 5).state is JobState.SUCCEEDED


def test_a_sleeping_worker_is_unloaded_at_its_keep_alive() -> None:
    with fake_engine({"a": {**NINE, "keep_alive": "1s"}}, gpus=[CARD],
                     scripts={"a": sleepy()}) as fe:
        fe.sup.wait(fe.sup.submit("a", b""), 10)
        fe.sup.sleep("a")
        wait_until(lambda: state(fe, "a") == "cold", what="a unloaded")
    assert fe.workers.of("a")[0].sleeps == [1]


def test_the_sleepers_host_budget_comes_from_the_environment_then_config_yaml(
        tmp_path: Path) -> None:
    from supervisor.errors import VramtuiError
    from supervisor.paths import Paths
    from vramtui.serve import engine_config

    paths = Paths(config_dir=tmp_path, state_dir=tmp_path, runtime_dir=tmp_path)
    args = argparse.Namespace(max_queue=None)
    assert engine_config(args, paths, {}).sleep_host_budget_mib > 0  # half the host's
    (tmp_path / "config.yaml").write_text("engine:\n  sleep_host_budget: 16GiB\n")
    assert engine_config(args, paths, {}).sleep_host_budget_mib == 16 * 1024
    env = {"VRAMTUI_SLEEP_HOST_BUDGET": "2GiB"}
    assert engine_config(args, paths, env).sleep_host_budget_mib == 2048
    with pytest.raises(VramtuiError, match="VRAMTUI_SLEEP_HOST_BUDGET: .*not a size"):
        engine_config(args, paths, {"VRAMTUI_SLEEP_HOST_BUDGET": "lots"})
    (tmp_path / "config.yaml").write_text("engine:\n  sleep_host_budget: -1\n")
    with pytest.raises(VramtuiError, match="sleep_host_budget: .*negative"):
        engine_config(args, paths, {})


def test_a_job_that_comes_as_the_sleep_is_asked_leaves_no_sleep_half_begun() -> None:
    # The sleep is asked and, in the same turn of the loop, a job is admitted: the sleep hook
    # then finds the worker busy and does not sleep. Its sleep must not stay recorded as
    # "falling" (counted as giving its memory back, a wake waiting on a sleep that never ends).
    with fake_engine({"a": NINE}, gpus=[CARD], scripts={"a": sleepy(job_s=0.2)}) as fe:
        fe.sup.wait(fe.sup.submit("a", b""), 10)

        def sleep_then_job() -> str:
            fe.engine.sleep("a")
            job = fe.engine.submit("a", b"", durable=False)
            fe.engine.step_now()
            return str(job.id)

        job = fe.on_loop(sleep_then_job)
        assert fe.sup.wait(job, 10).state is JobState.SUCCEEDED
        wait_until(lambda: fe.on_loop(lambda: fe.engine.backends["a"].slumber) is None, 5,
                   "the sleep that did not happen to be forgotten")
        assert state(fe, "a") == "ready" and fe.worker("a").sleeps == []
        fe.sup.sleep("a")  # asked again, idle: it sleeps
        wait_until(lambda: state(fe, "a") == "asleep", 5, "a asleep")


@pytest.mark.parametrize("sleeps", [True, False])
def test_room_a_stop_makes_is_not_made_twice_while_the_reading_lags(sleeps: bool) -> None:
    # a and b fill a 4 GiB card between them; c needs the room of one of them. With sleep, b
    # is put to sleep for c and keeps 356 MiB where its prior said 256: c is 72 MiB short,
    # and one more sleeper must go (stopping either one is enough). Without, one of a, b
    # stops. The worker that stopped is let go of on a process list read right after its exit
    # (not at the next sample): the device reading must be read after that list too, or,
    # still showing the memory used while nothing counts it as on its way back, it has
    # admission evict the other one as well (a reload for nothing).
    if sleeps:
        desc = {"vram": {"weights": "3000MiB", "activation": "200MiB", "context": "256MiB"},
                "safety": "0MiB", "keep_alive": "10m"}
        script = sleepy(weights_mib=3256, activation_mib=200, sleep_keeps_mib=356,
                        load_s=0.02, job_s=0.0)
    else:
        desc = {"vram": {"weights": "1500MiB", "activation": "200MiB", "context": "256MiB"},
                "safety": "0MiB", "keep_alive": "10m"}
        script = Script(weights_mib=1756, activation_mib=200, load_s=0.02)
    # samples far apart: a reading taken before the exit stays the latest a long while
    cfg = EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=4.0, ping_interval_s=0.05)
    with fake_engine({n: desc for n in "abc"}, gpus=[4096], config=cfg,
                     scripts={n: script for n in "abc"}) as fe:
        for n in "abc":
            view = fe.sup.wait(fe.sup.submit(n, b"x"), 10)
            assert view.state is JobState.SUCCEEDED, view.error
            wait_until(lambda: fe.on_loop(lambda: fe.engine.monitor.readings[0].used_mib)
                       == fe.gpu.used(0), 5, "a sample of the card as it is now")
        lines = [line.text for line in fe.sup.snapshot().log if line.text.startswith("evicting")]
        kept = [n for n in "ab" if state(fe, n) == ("asleep" if sleeps else "ready")]
        stopped = [n for n in "ab" for w in fe.workers.of(n) if w.exited]
    assert len(lines) == 1, lines
    assert len(kept) == 1 and len(stopped) == 1 and kept != stopped, (kept, stopped)
    assert fe.gpu.overcommits == []
