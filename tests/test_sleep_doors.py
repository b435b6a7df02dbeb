"""Sleep and wake through every face: HTTP, ``/metrics``, the CLI, the event stream, the TUI.

A real engine on the simulated GPU with a real worker that can sleep (the demo model with its
hooks) and one that cannot. Each face is driven as a user would (the standard library's HTTP
client, ``prometheus_client``'s own parser, ``vramtui`` as a subprocess, the Textual app under
``run_test``); what the device holds is read from the simulated device's ledger.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from engine_support import engine, sim_backend
from http_support import Front, serve_http
from prometheus_client.parser import text_string_to_metric_families
from serve_support import cli
from spawning import spawns
from waiting import wait_until, wait_until_async

from supervisor.gpu.sim import SimulatedProbe
from vramtui.app import VramApp
from vramtui.app.widgets.backends_table import BackendsTable
from vramtui.exits import Exit


def napper() -> dict[str, Any]:
    """1 GiB of weights (+ the device's 256 MiB context); asleep 44 MiB + the context."""
    spec = sim_backend("napper", 1024, 128, steps=1, step_s=0.01)
    spec["env"].update(SIM_SLEEP_KEEP_MIB="44", SIM_WAKE_S="0.05")
    return spec


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    with serve_http([napper(), sim_backend("plain", 512, 128, steps=1, step_s=0.01)],
                    gpus="sim:8GiB", control=True) as f:
        yield f


def device_mib(front: Front, pid: int) -> int:
    """What the worker process holds on the simulated device, from the device's ledger."""
    probe = SimulatedProbe("sim:8GiB", front.engine.paths.sim_dir)
    return sum(p.used_mib or 0 for p in probe.processes() if p.pid == pid)


def backend(front: Front, name: str) -> dict[str, Any]:
    reply = front.get(f"/v1/backends/{name}")
    assert reply.status == 200
    return reply.json()  # type: ignore[no-any-return]


def metrics(front: Front) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = front.get("/metrics")
    assert r.status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.body.decode())
            for s in family.samples}


def test_sleep_and_wake_over_http_with_metrics(front: Front) -> None:
    job = front.post("/v1/jobs", {"backend": "napper", "input": {"steps": 1}})
    assert job.status == 200, job.body
    pid = backend(front, "napper")["pid"]
    assert pid is not None and device_mib(front, pid) == 1024 + 256
    reply = front.post("/v1/backends/napper/sleep")
    assert reply.status == 202 and reply.json()["action"] == "sleep"
    wait_until(lambda: (backend(front, "napper")["sleep"]["residual_mib"] or 0) > 0, 20,
               "napper asleep and measured")
    view = backend(front, "napper")
    assert view["state"] == "asleep" and view["pid"] == pid
    assert view["sleep"]["residual_mib"] == 300 == device_mib(front, pid)  # measured truth
    assert view["memory"]["reserved_mib"] == 300 and view["sleep"]["can_sleep"]
    m = metrics(front)
    assert m[("vramtui_backend_state", (("backend", "napper"), ("state", "asleep")))] == 1
    assert m[("vramtui_backend_sleeps_total", (("backend", "napper"),))] == 1
    assert m[("vramtui_backend_sleep_residual_bytes", (("backend", "napper"),))] == \
        300 * 1024 * 1024
    assert front.post("/v1/backends/napper/wake").status == 202
    wait_until(lambda: backend(front, "napper")["state"] == "ready", 20, "napper awake")
    assert backend(front, "napper")["pid"] == pid and device_mib(front, pid) == 1024 + 256
    m = metrics(front)
    assert m[("vramtui_backend_wakes_total", (("backend", "napper"),))] == 1
    assert m[("vramtui_backend_wake_duration_seconds_count", (("backend", "napper"),))] == 1
    assert m[("vramtui_backend_wake_duration_seconds_sum", (("backend", "napper"),))] >= 0.05


def test_what_cannot_sleep_is_refused_in_one_clear_line(front: Front) -> None:
    assert front.post("/v1/jobs", {"backend": "plain", "input": {"steps": 1}}).status == 200
    reply = front.post("/v1/backends/plain/sleep")
    assert reply.status == 409, reply.body
    assert "no @worker_sdk.sleep" in json.dumps(reply.json())
    assert front.post("/v1/backends/nope/sleep").status == 404
    done = cli(front.env, "sleep", "plain")
    assert done.returncode == Exit.REFUSED and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("vramtui: error: ") and "evict" in line


def test_sleep_and_wake_with_nothing_to_do_exit_7(front: Front) -> None:
    # as evict of a backend not loaded: the line on stdout, no error, exit 7 (not 5: refused)
    assert front.post("/v1/backends/napper/unload").status == 202
    wait_until(lambda: backend(front, "napper")["state"] == "cold", 20, "napper unloaded")
    for verb, words in (("sleep", "napper is not loaded: nothing to put to sleep"),
                        ("wake", "napper is not loaded, so not asleep: nothing to wake")):
        done = cli(front.env, verb, "napper")
        assert (done.returncode, done.stderr) == (Exit.NOTHING_TO_DO, ""), done
        assert done.stdout.startswith(words), done.stdout
        reply = front.post(f"/v1/backends/napper/{verb}")
        assert reply.status == 409 and reply.json()["error"]["code"] == "nothing_to_do"
    done = cli(front.env, "sleep", "napper", "--json")
    assert done.returncode == Exit.NOTHING_TO_DO and json.loads(done.stdout) == {
        "backend": "napper", "action": "sleep", "ok": True, "nothing_to_do": True,
        "message": "napper is not loaded: nothing to put to sleep"}
    assert front.post("/v1/jobs", {"backend": "napper", "input": {"steps": 1}}).status == 200
    wait_until(lambda: backend(front, "napper")["state"] == "ready", 20, "napper ready")
    done = cli(front.env, "wake", "napper")
    assert done.returncode == Exit.NOTHING_TO_DO, done
    assert done.stdout == "napper is not asleep (it is ready): nothing to wake\n"
    assert front.post("/v1/backends/napper/wake").status == 202
    assert cli(front.env, "sleep", "napper").returncode == 0
    wait_until(lambda: backend(front, "napper")["state"] == "asleep", 20, "napper asleep")
    done = cli(front.env, "sleep", "napper")
    assert done.returncode == Exit.NOTHING_TO_DO, done
    assert done.stdout == "napper is asleep already: nothing to put to sleep\n"
    # over HTTP and the API, asking twice is no error: it stays asleep
    assert front.post("/v1/backends/napper/sleep").status == 202
    assert backend(front, "napper")["state"] == "asleep"
    assert cli(front.env, "wake", "napper").returncode == 0  # as the next test expects it
    wait_until(lambda: backend(front, "napper")["state"] == "ready", 20, "napper awake")


def test_the_cli_puts_to_sleep_and_wakes_and_events_tell_the_wake_time(front: Front) -> None:
    assert front.post("/v1/jobs", {"backend": "napper", "input": {"steps": 1}}).status == 200
    wait_until(lambda: backend(front, "napper")["state"] == "ready", 20, "napper ready")
    events = front.sse("GET", "/v1/events")
    try:
        done = cli(front.env, "sleep", "napper")
        assert done.returncode == 0 and "going to sleep" in done.stdout, done.stderr
        wait_until(lambda: backend(front, "napper")["state"] == "asleep", 20, "asleep")
        assert json.loads(cli(front.env, "wake", "napper", "--json").stdout) == \
            {"backend": "napper", "action": "wake", "ok": True}
        seen = []
        while not any(e.get("state") == "awake" for e in seen):
            event = events.next()
            assert event is not None, "the stream ended"
            data = event.json() if event.data else {}
            if data.get("kind") == "sleep":
                seen.append(data)
    finally:
        events.close()
    awake = next(e for e in seen if e["state"] == "awake")
    assert awake["backend"] == "napper" and awake["seconds"] >= 0.05
    assert "woke in" in awake["message"]


@pytest.mark.process
def test_the_tui_key_puts_the_selected_backend_to_sleep_and_wakes_it() -> None:
    async def drive() -> None:
        with engine([napper()], gpus="sim:8GiB") as sup:
            sup.preload("napper")
            wait_until(lambda: sup.snapshot().backend("napper").state == "ready",  # type: ignore
                       30, "napper ready")
            pid = sup.snapshot().backend("napper").pid  # type: ignore[union-attr]
            app = VramApp(sup, "embedded")
            async with app.run_test(size=(160, 48)) as pilot:
                table = app.screen.query_one(BackendsTable)
                await wait_until_async(lambda: "napper" in list(table.keys()), 20,
                                       "the table", pause=lambda: pilot.pause(0.05))
                table.focus()
                table.move_cursor(row=table.get_row_index("napper"))
                await pilot.press("S")
                await wait_until_async(
                    lambda: str(table.get_cell("napper", "state")).startswith("asleep"), 20,
                    "asleep in the table", pause=lambda: pilot.pause(0.05))
                assert sup.snapshot().backend("napper").pid == pid  # type: ignore
                await pilot.press("S")
                await wait_until_async(
                    lambda: str(table.get_cell("napper", "state")).startswith("ready"), 20,
                    "awake in the table", pause=lambda: pilot.pause(0.05))
                assert sup.snapshot().backend("napper").pid == pid  # type: ignore

    asyncio.run(drive())
