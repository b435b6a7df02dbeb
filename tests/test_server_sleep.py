"""Model servers put to sleep and woken over HTTP (issue 27, item 2), end to end: a real engine
on the simulated GPU, real server processes (``tests/model_server.py``, whose ``/sleep`` and
``/wake_up`` really give back and take again what it holds on the simulated device).

What is checked: two servers that cannot both be awake on the card take turns asleep, each
one process all along (the pid in every answer, alive in /proc), the device's own ledger never
over, each sleep's residual measured (the context the server keeps) and each wake timed; a
server whose sleep gives nothing back, or whose wake never answers, is stopped instead, with
an event that says why, and its job runs on a fresh server.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_support import UsageWatcher, engine, sleep_events
from http_support import serve_http
from waiting import wait_until

from supervisor.engine import EngineConfig
from supervisor.jobs import JobState

pytestmark = pytest.mark.process

SERVER = Path(__file__).resolve().parent / "model_server.py"
CONTEXT_MIB = 256  # the simulated GPU's CUDA context per process: what a server keeps asleep
CARD = "sim:8GiB"
# Both sleepers' weights (5000 MiB each, as a server does not say what its sleep took) fit in
# host memory whatever this host has.
HOST_BUDGET_MIB = 16 * 1024
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def sleepy_server(name: str, mode: str = "ok", *, load_s: float = 0.4, start: str = "20s",
                  grace: str = "2s") -> dict[str, Any]:
    """tests/model_server.py holding 5000 MiB (+ its context): two do not fit on 8 GiB awake,
    one awake and one asleep do. Its load costs more than its wake (0.05 s)."""
    return {
        "name": name,
        "command": [sys.executable, str(SERVER), "--port", "${PORT}", "--mib", "5000",
                    "--load-s", str(load_s), "--wake-s", "0.05", "--tokens", "2", "--mode", mode],
        "http": {"health": "/health", "sleep": "POST /sleep?level=1", "wake": "/wake_up",
                 "ready_timeout": "20s"},
        "api": ["chat"],
        "vram": {"weights": "5000MiB", "activation": "0MiB", "context": f"{CONTEXT_MIB}MiB"},
        "safety": "0MiB",
        "simulated": True,
        "timeouts": {"start": start, "stop_grace": grace},
    }


def pid_of(answer: dict[str, Any]) -> int:
    """The pid of the server process that answered (its system_fingerprint), checked in /proc
    to be a live tests/model_server.py."""
    pid = int(answer["system_fingerprint"].removeprefix("pid-"))
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    assert str(SERVER).encode() in cmdline, cmdline
    return pid


def answered_by(view: Any) -> int:
    assert view.state is JobState.SUCCEEDED, view.error
    return pid_of(json.loads(view.data or b"{}"))


@pytest.mark.timeout(120)
def test_two_servers_take_turns_asleep_without_a_respawn() -> None:
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0,
                          sleep_host_budget_mib=HOST_BUDGET_MIB)
    with serve_http([sleepy_server("a"), sleepy_server("b")], gpus=CARD,
                    engine_config=config) as front, \
            UsageWatcher(front.sup, CARD, hz=100) as watch:
        events = sleep_events(front.sup)
        pids: dict[str, set[int]] = {"a": set(), "b": set()}
        for model in "abab":  # through the OpenAI route, each once the one before has ended
            reply = front.post("/v1/chat/completions", {"model": model, "messages": [
                {"role": "user", "content": "hi"}]})
            assert reply.status == 200, reply.body
            pids[model].add(pid_of(reply.json()))
        # b put to sleep through the door; then a websocket through /upstream wakes a (in
        # the room b gave back: a preload evicts nobody).
        assert front.post("/v1/backends/b/sleep", {}).status == 202
        assert asyncio.run(_ws_echo(front.base + "/upstream/a/ws")) == "echo:ping"
        server = front.get("/v1/backends/a").json()["server"]
        assert (server["sleep"], server["wake"]) == ("POST /sleep?level=1", "POST /wake_up")
        counters = front.engine.counters
        loads, wakes = dict(counters.loads), dict(counters.wakes)
        b = front.sup.snapshot().backend("b")
    assert [len(pids["a"]), len(pids["b"])] == [1, 1], pids  # the same process all along
    assert loads == {"a": 1, "b": 1} and wakes == {"a": 2, "b": 1}, (loads, wakes)
    assert watch.samples > 50 and watch.overcommits == [], watch.overcommits[:3]
    asleep = [e for e in events if e.state == "asleep"]
    assert [e.backend for e in asleep] == ["a", "b", "a", "b"], asleep
    assert all(f"keeps {CONTEXT_MIB} MiB" in e.message for e in asleep), asleep  # measured
    woke = [e for e in events if e.state == "awake"]
    assert len(woke) == 3 and all(e.seconds is not None and e.seconds >= 0.05 for e in woke)
    assert b is not None and b.state == "asleep" and b.reserved_mib == CONTEXT_MIB


async def _ws_echo(url: str) -> str:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.ws_connect(url) as sock:
        await sock.send_str("ping")
        return str((await sock.receive(timeout=10)).data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "why"), [
    ("sleep-keeps", "its sleep gave nothing back (it held 5256 MiB and still holds 5256 MiB"),
    ("wake-hangs", "it did not wake: POST /wake_up gave no answer within 2 s"),
])
def test_a_server_whose_sleep_or_wake_misbehaves_is_stopped_instead(mode: str,
                                                                    why: str) -> None:
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0,
                          sleep_host_budget_mib=HOST_BUDGET_MIB)
    # A wake is given timeouts.start to answer; a hung server is killed after its stop grace
    # (aiohttp waits for its handlers).
    fast: dict[str, Any] = {"load_s": 0.2, "start": "2s", "grace": "0.5s"}
    backends = [sleepy_server("a", mode, **fast), sleepy_server("b", **fast)]
    with engine(backends, gpus=CARD, config=config) as sup, \
            UsageWatcher(sup, CARD, hz=100) as watch:
        events = sleep_events(sup)
        pids = [answered_by(sup.wait(sup.submit(backend, CHAT), 60)) for backend in "aba"]
        stopped = [e for e in events if e.state == "stopped"]
        a = sup.snapshot().backend("a")
    assert [(e.backend, why in e.message) for e in stopped] == [("a", True)], stopped
    assert pids[0] != pids[2]  # a's last job ran on a fresh server
    assert watch.overcommits == []
    assert a is not None and a.state == "ready"


@pytest.mark.timeout(60)
def test_a_server_that_hangs_asleep_is_killed_as_hung() -> None:
    spec = sleepy_server("a", "asleep-hangs", load_s=0.1)
    spec["timeouts"]["ping"] = "0.5s"
    with engine([spec], gpus=CARD) as sup:
        pid = answered_by(sup.wait(sup.submit("a", CHAT), 30))
        sup.sleep("a")

        def killed() -> str | None:
            view = sup.snapshot().backend("a")
            return view.last_error if view is not None and view.state != "asleep" else None

        error = wait_until(killed, 10, "the hung sleeper to be killed")
        assert f"a hung: its server (pid {pid}) answered no ping" in error, error
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 10, "its process to be gone")


@pytest.mark.timeout(60)
def test_an_ollama_load_of_a_sleeper_without_room_to_wake_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine gives a wake that finds no room up (a load evicts nothing): the Ollama
    load waited for a worker that would never be loaded, and never answered."""
    import ollama

    from supervisor.engine import engine as engine_module

    monkeypatch.setattr(engine_module, "PRELOAD_PATIENCE_S", 1.0)  # (30 s: a test's wait)
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0,
                          sleep_host_budget_mib=HOST_BUDGET_MIB)
    with serve_http([sleepy_server("a"), sleepy_server("b")], gpus=CARD,
                    engine_config=config) as front:
        for model in "ab":  # a goes to sleep for b
            assert front.post("/v1/chat/completions", {"model": model, "messages": [
                {"role": "user", "content": "hi"}]}).status == 200
        assert {b.name: b.state for b in front.sup.snapshot().backends}["a"] == "asleep"
        client = ollama.Client(host=front.base, timeout=30)
        with pytest.raises(ollama.ResponseError) as err:
            client.chat(model="a", messages=[])
        assert err.value.status_code == 503 and "gave up preloading a" in err.value.error
