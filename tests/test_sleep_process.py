"""The sleep tier end to end: real worker processes on the simulated GPU, its ledger the truth.

The issue's check: two simulated 9 GiB models on ``sim:12GiB`` (load 3 s, asleep 300 MiB on
the device, wake 0.3 s), jobs alternating a, b four times: each backend keeps one worker
process (its pid is in every answer), the device never holds more than 12 GiB (read from the
simulated device's own ledger by a watcher, not from the engine), and six wakes replace six
reloads.  (How long the eight jobs take, against seven reloads, is measured by
``bench/sleep.py``, not asserted here.)  Then real workers that misbehave: their sleep gives
nothing back, or their wake hangs; the engine measures, stops them instead, says why, and the
job runs on a fresh worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_support import UsageWatcher, engine, sim_backend, sleep_events

from supervisor.engine import EngineConfig
from supervisor.jobs import JobState

WORKERS = Path(__file__).resolve().parent / "workers"
CARD = "sim:12GiB"


def nine_gib(name: str) -> dict[str, Any]:
    """8448 MiB of weights + the device's 256 MiB context + 512 MiB a job: 9 GiB at its peak;
    asleep it keeps 44 MiB + its context: 300 MiB on the device."""
    spec = sim_backend(name, 8448, 512, load_s=3.0, steps=1, step_s=0.05)
    spec["env"].update(SIM_SLEEP_KEEP_MIB="44", SIM_WAKE_S="0.3")
    return spec


@pytest.mark.process
@pytest.mark.timeout(180)
def test_two_9gib_models_on_a_12gib_card_take_turns_asleep_without_a_respawn() -> None:
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0)
    with engine([nine_gib("a"), nine_gib("b")], gpus=CARD, config=config) as sup, \
            UsageWatcher(sup, CARD, hz=100) as watch:
        events = sleep_events(sup)
        answers = []
        for i in range(8):  # a, b, a, b, …: each once the one before has ended
            view = sup.wait(sup.submit("ab"[i % 2], b'{"steps": 1, "step_s": 0.05}'), 60)
            assert view.state is JobState.SUCCEEDED, view.error
            answers.append(json.loads(view.data or b"{}"))
        counters = sup.engine.counters
        loads, wakes = dict(counters.loads), dict(counters.wakes)
        a = sup.snapshot().backend("a")
    pids = {name: {ans["pid"] for ans in answers if ans["backend"] == name} for name in "ab"}
    assert [len(pids["a"]), len(pids["b"])] == [1, 1], pids  # no respawn
    assert watch.samples > 100 and watch.overcommits == [], watch.overcommits[:3]
    assert watch.max_used[0] <= 12 * 1024
    assert loads == {"a": 1, "b": 1} and wakes == {"a": 3, "b": 3}
    woke = [e for e in events if e.state == "awake"]
    assert len(woke) == 6 and all(e.seconds is not None and e.seconds >= 0.3 for e in woke)
    assert a is not None and a.state == "asleep" and a.reserved_mib == 300  # measured


def misbehaving(name: str, mode: str) -> dict[str, Any]:
    return {"name": name, "script": str(WORKERS / "sleepy.py"),
            "vram": {"weights": "5000MiB", "activation": "200MiB", "context": "256MiB"},
            "safety": "0MiB",
            "env": {"SLEEPY_MODE": mode, "SLEEPY_WEIGHTS": "5000", "SLEEPY_KEEP": "100"},
            "timeouts": {"start": "3s", "stop_grace": "1s"}}


@pytest.mark.process
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("mode", "why"), [
    ("keeps", "gave nothing back"),
    ("wake-hangs", "it did not wake: no answer within 3 s"),
])
def test_a_real_worker_whose_sleep_or_wake_misbehaves_is_stopped_instead(
        mode: str, why: str) -> None:
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0)
    with engine([misbehaving("a", mode), misbehaving("b", "honest")], gpus="sim:8GiB",
                config=config) as sup, UsageWatcher(sup, "sim:8GiB", hz=100) as watch:
        events = sleep_events(sup)
        pids = []
        for backend in "aba":
            view = sup.wait(sup.submit(backend, b"x"), 60)
            assert view.state is JobState.SUCCEEDED, view.error
            pids.append(json.loads(view.data or b"{}")["pid"])
        stopped = [e for e in events if e.state == "stopped"]
    assert [(e.backend, why in e.message) for e in stopped] == [("a", True)], stopped
    assert pids[0] != pids[2]  # a's job ran on a fresh worker
    assert watch.overcommits == []


@pytest.mark.process
@pytest.mark.timeout(120)
def test_a_sleep_that_takes_more_host_memory_than_the_budget_leaves_is_stopped() -> None:
    """It declares 10 MiB and says its sleep took none (``host_mib: 0``), but its process
    grew by 160 MiB (its PSS, read from /proc): counted at what it took, past the sleepers'
    100 MiB budget, so it is stopped, and the job that needed the room still runs."""
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0, sleep_host_budget_mib=100)
    hungry = misbehaving("a", "honest")
    hungry["env"]["SLEEPY_HOST_MIB"] = "160"
    hungry["sleep"] = {"host": "10MiB"}  # what it declares its sleep takes: it fits
    with engine([hungry, misbehaving("b", "honest")], gpus="sim:8GiB", config=config) as sup:
        events = sleep_events(sup)
        for backend in "ab":
            view = sup.wait(sup.submit(backend, b"x"), 60)
            assert view.state is JobState.SUCCEEDED, view.error
        stopped = [e for e in events if e.state == "stopped"]
        a = sup.snapshot().backend("a")
    assert [e.backend for e in stopped] == ["a"], [e.message for e in events]
    assert "it said 0" in stopped[0].message
    assert "sleepers may take 100 MiB more" in stopped[0].message
    assert a is not None and a.state in ("cold", "stopping")
