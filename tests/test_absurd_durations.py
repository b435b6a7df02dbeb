"""Durations no one means (a typo's extra digits) are one line at load, or never where a key
allows never: not a figure that overflows the waits it reaches.

A walk found that ``timeouts.stop_grace: 99999999999999d`` loaded as 8.64e18 s, and then
stopping the embedded engine (quitting the TUI: ``Supervisor.stop`` waits for the longest stop
grace) died in ``OverflowError: timestamp out of range for platform time_t``; every other
duration key took such a figure too (``backends --json`` showed a wake cost of 8.64e18 s).
:func:`supervisor.units.parse_duration` refuses more than 10 years, or reads it as never where
the key allows never.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from http_support import Front, serve_http
from serve_support import cli, echo_backend, make_env, new_root
from spawning import spawns
from waiting import wait_until

from supervisor.backends.loader import load_backends
from supervisor.engine import EngineConfig
from supervisor.errors import InvalidRequest
from supervisor.facade import Supervisor
from supervisor.paths import Paths

ABSURD = "99999999999999d"  # 8.64e18 s
SERVER = ["/bin/true", "--port", "${PORT}"]  # an http: backend's command (never run here)

# Each key that must be finite, as (its field, the backend's keys around the absurd figure).
FINITE: list[tuple[str, Any]] = [
    ("timeouts.start", lambda v: {"timeouts": {"start": v}}),
    ("timeouts.stop_grace", lambda v: {"timeouts": {"stop_grace": v}}),
    ("timeouts.ping", lambda v: {"timeouts": {"ping": v}}),
    ("reload_cost", lambda v: {"reload_cost": v}),
    ("wake_cost", lambda v: {"wake_cost": v}),
    ("target_wait", lambda v: {"target_wait": v}),
    ("http.ready_timeout", lambda v: {"command": SERVER, "http": {"ready_timeout": v}}),
]


def _load(tmp_path: Path, backends: list[dict[str, Any]]) -> Any:
    file = tmp_path / "b.yaml"
    file.write_text(yaml.safe_dump({"backends": backends}))
    return load_backends([file], demo_fallback=False)


@pytest.mark.parametrize("value", [ABSURD, "1e300", 1e308, 9e18, "3651d"])
@pytest.mark.parametrize(("field", "keys"), FINITE, ids=[f for f, _ in FINITE])
def test_a_finite_duration_key_refuses_more_than_ten_years_in_one_line(
        tmp_path: Path, field: str, keys: Any, value: object) -> None:
    result = _load(tmp_path, [{"name": "x", "command": ["/bin/true"], **keys(value)},
                              {"name": "fine", "command": ["/bin/true"], **keys("3650d")}])
    assert list(result.backends) == ["fine"]
    assert len(result.errors) == 1
    line = str(result.errors[0])
    assert f"backend 'x': field '{field}': " in line, line
    assert "is more than 10 years" in line and "write at most 3650d" in line, line
    assert "\n" not in line


@pytest.mark.parametrize("value", [ABSURD, "1e300", 1e308, "3651d"])
def test_a_key_that_allows_never_reads_more_than_ten_years_as_never(
        tmp_path: Path, value: object) -> None:
    result = _load(tmp_path, [
        {"name": "worker", "command": ["/bin/true"], "keep_alive": value,
         "timeouts": {"request": value}},
        {"name": "server", "command": SERVER, "http": {}, "timeouts": {"idle": value}},
        {"name": "vramd", "command": ["/bin/true"], "protocol": "vramd",
         "vramd": {"event_timeout": value}}])
    assert not result.errors, result.errors
    worker = result.backends["worker"]
    assert worker.keep_alive_s == math.inf and worker.timeouts.request_s is None
    assert result.backends["server"].timeouts.idle_s is None
    assert result.backends["vramd"].vramd.event_timeout_s is None


def test_a_llama_swap_figure_past_a_floats_range_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A llama-swap config.yaml is read as Go reads YAML, where an integer past 64 bits is a
    float: one past a float's range too (``unloadTimeout: <400 digits>``) raised
    OverflowError, and ``vramtui --serve --backends`` that file died in a traceback at its
    start (``import-llama-swap``: an internal error, exit 70). It is text, as a float out of
    range is: the model is one error line, the others load."""
    from vramtui.cli import main

    file = tmp_path / "config.yaml"
    file.write_text("models:\n  m:\n    cmd: /bin/true --port ${PORT}\n"
                    f"    unloadTimeout: {'9' * 400}\n"
                    "  ok:\n    cmd: /bin/true --port ${PORT}\n")
    result = load_backends([file], demo_fallback=False)
    assert list(result.backends) == ["ok"]
    assert len(result.errors) == 1
    line = str(result.errors[0])
    assert "backend 'm': field 'timeouts.stop_grace': '999" in line and "\n" not in line
    assert main(["import-llama-swap", str(file), "-o", str(tmp_path / "out")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert "field 'timeouts.stop_grace'" in errors[0] and "internal error" not in errors[0]


@pytest.mark.parametrize("value", [ABSURD, "1e300", "never"])
def test_a_setting_with_a_range_of_its_own_says_its_range(tmp_path: Path, value: str) -> None:
    """config.yaml's yield_when timings and http.heartbeat have ranges of their own (at most
    1 h): an absurd figure, or never, is refused in their words, not 'at most 3650d'."""
    from supervisor.engine.rules import BadRule, parse_rules
    from supervisor.http.config import HttpConfigError, load_http_config

    for key in ("timeout", "every"):
        with pytest.raises(BadRule) as rule:
            parse_rules([{"command": "true", key: value}], "engine: yield_when")
        assert str(rule.value) == f"engine: yield_when[0]: {key}: between 0.1s and 1h"
    config = tmp_path / "config.yaml"
    config.write_text(f"http:\n  heartbeat: {value}\n")
    with pytest.raises(HttpConfigError) as http:
        load_http_config(listen="127.0.0.1:0", config_file=config, environ={})
    assert str(http.value) == f"{config}: http.heartbeat: must be between 0.05 s and 1 h"


@pytest.mark.process
def test_stopping_an_embedded_engine_is_not_overflowed_by_a_stop_grace() -> None:
    """The TUI's embedded engine with a worker running: its stop (quitting the TUI) raised
    OverflowError from the thread's wait of the longest stop grace plus 15 s."""
    root = new_root()
    absurd = dict(echo_backend("absurd"), timeouts={"stop_grace": ABSURD})
    env = make_env(root, [echo_backend(), absurd])
    sup = Supervisor.from_config(gpus="sim:8GiB", backends=[env["VRAMTUI_TEST_BACKENDS"]],
                                 environ=env, paths=Paths.from_env(env),
                                 config=EngineConfig(reserve_mib=0, tick_s=0.1))
    sup.start_in_thread()
    try:
        errors = sup.snapshot().descriptor_errors
        sup.preload("echo")
        wait_until(lambda: any(b.name == "echo" and b.state == "ready"
                               for b in sup.snapshot().backends), 30, "echo ready")
        pid = next(b.pid for b in sup.snapshot().backends if b.name == "echo")
        sup.stop()  # waits for the longest grace of those loaded, plus 15 s
        assert not sup.running
        wait_until(lambda: _gone(pid), 10, "the echo worker to have exited")
        assert len(errors) == 1 and "field 'timeouts.stop_grace'" in errors[0], errors
    finally:
        sup.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.process
@pytest.mark.parametrize("timeout", [1e300, math.inf])
def test_an_embedded_engine_stops_whatever_the_timeout_given(timeout: float) -> None:
    """``Supervisor.stop(timeout)`` is where a duration becomes a thread's wait: one longer
    than a thread can wait (about 292 years) raised OverflowError out of it."""
    root = new_root()
    env = make_env(root, [echo_backend()])
    sup = Supervisor.from_config(gpus="sim:8GiB", backends=[env["VRAMTUI_TEST_BACKENDS"]],
                                 environ=env, paths=Paths.from_env(env),
                                 config=EngineConfig(reserve_mib=0, tick_s=0.1))
    sup.start_in_thread()
    try:
        sup.preload("echo")
        wait_until(lambda: any(b.name == "echo" and b.state == "ready"
                               for b in sup.snapshot().backends), 30, "echo ready")
        pid = next(b.pid for b in sup.snapshot().backends if b.name == "echo")
        sup.stop(timeout=timeout)
        assert not sup.running
        wait_until(lambda: _gone(pid), 10, "the echo worker to have exited")
    finally:
        sup.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    long = dict(echo_backend("long"), keep_alive="300d", target_wait=1234567,
                timeouts={"request": "30d", "stop_grace": "3s"})
    with serve_http([echo_backend(), long], control=True) as f:
        yield f


LIMIT = "is too long: at most 2592000 s (30 days)"


@pytest.mark.parametrize(("timeout", "given"), [
    (10**400, "1" + "0" * 56 + "..."), (1e300, "1e+300"), (2592001, "2592001")],
    ids=["400-digits", "1e300", "30-days-and-1-s"])
def test_a_jobs_timeout_past_30_days_is_a_400_that_says_the_limit(
        front: Front, timeout: float, given: str) -> None:
    """POST /v1/jobs said "timeout: seconds, more than 0" of 1e300, and answered a 500 (an
    OverflowError, its traceback logged) to a timeout past a float's range, which the
    engine's own check (the facade's submit) raised too."""
    reply = front.post("/v1/jobs", {"backend": "echo", "input": {}, "timeout": timeout})
    assert reply.status == 400, reply.body
    assert reply.error["param"] == "timeout"
    assert reply.error["message"] == f"timeout of {given} s {LIMIT}"
    with pytest.raises(InvalidRequest) as refused:
        front.sup.submit("echo", b"{}", timeout=timeout)
    assert str(refused.value) == f"timeout of {given} s {LIMIT}"
    assert not front.sup.jobs()


def test_submit_timeout_past_30_days_says_both_figures_in_full(front: Front) -> None:
    """It said "timeout of 2.592e+06 s is too long: at most 2.592e+06 s (30 days)"."""
    done = cli(front.env, "submit", "echo", "--data", "{}", "--timeout", "2592001")
    assert done.returncode == 2, done
    assert done.stderr == f"vramtui: error: timeout of 2592001 s {LIMIT}\n"


def test_a_calibrations_settle_past_a_floats_range_is_a_400(front: Front) -> None:
    """POST /v1/backends/NAME/calibrate answered a 500 (an OverflowError, its traceback
    logged) to a settle_s of 10**400; 1e300 was refused by its range, as it now is."""
    for settle in (10**400, 1e300):
        reply = front.post("/v1/backends/echo/calibrate", {"settle_s": settle})
        assert reply.status == 400, reply.body
        assert reply.error["param"] == "settle_s"
        assert reply.error["message"].startswith(
            "calibrate: argument 'settle_s' must be between 0 and 600 (got "), reply.error
    assert not front.sup.jobs()


def test_the_effective_descriptor_writes_long_durations_that_read_back(front: Front) -> None:
    """What the engine runs with (GET /v1/backends/NAME/descriptor, the TUI's backend
    screen) wrote ``timeouts: {request: 30d}`` as ``2.592e+06s``, which is no duration: a
    copy of it into a descriptor did not load."""
    from supervisor.units import parse_duration

    reply = front.get("/v1/backends/long/descriptor")
    assert reply.status == 200, reply.body
    effective = yaml.safe_load(reply.json()["effective"])
    shown = (effective["keep_alive"], effective["timeouts"]["request"],
             effective["target_wait"])
    assert shown == ("25920000s", "2592000s", "1234567s")
    assert [parse_duration(text) for text in shown] == [300 * 86400, 30 * 86400, 1234567]
