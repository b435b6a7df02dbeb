"""The API methods that the TUI and the CLI need beyond submit/cancel/evict, against a real
engine with real workers, through the embedded facade and the control socket alike.

Truth comes from outside the code under test where it can: the worker process in /proc
(psutil), the descriptor file as written, the report file on disk.
"""

from __future__ import annotations

import json
import time

import psutil
import pytest
import yaml
from engine_support import sim_backend
from fixed_source import calibration_record
from serve_support import echo_backend, in_process
from waiting import wait_until

from supervisor.calibration.report import write_report
from supervisor.client import Client
from supervisor.errors import (
    InvalidRequest,
    NoReport,
    Refused,
    UnknownBackend,
    UnknownGpu,
    UnknownJob,
)
from supervisor.jobs import JobState


def req(**kw: object) -> bytes:
    return json.dumps(kw).encode()


def backends() -> list[dict[str, object]]:
    return [echo_backend(), sim_backend("slow", 1024, 512, steps=40, step_s=0.05),
            sim_backend("huge", 64 * 1024, 1024)]


@pytest.mark.process
def test_descriptors_reports_and_wall_clock_times_come_through_the_api() -> None:
    with in_process(backends()) as (sup, _server, root):
        c = Client(sup.paths.control_socket)
        record = calibration_record()
        report = write_report(sup.paths.calibration_dir / "slow-20260101-115500.json",
                              record, None)
        for face in (sup, c):
            info = face.descriptor("echo")
            assert [layer.file.endswith("backends.yaml") for layer in info.layers] == [True]
            assert "name: echo" in info.layers[0].text and info.layers[0].line is not None
            assert "command:" in info.effective and "16MiB" in info.effective
            with pytest.raises(UnknownBackend):
                face.descriptor("nope")
            with pytest.raises(NoReport, match="not been calibrated"):
                face.calibration_report("echo")
            got = face.calibration_report("slow")
            assert got.data == report.read_bytes() and got.count == 1
            assert got.name == report.name
            with pytest.raises(NoReport):
                face.calibration_report("slow", name="../../etc/passwd")
            before = time.time()
            view = face.wait(face.submit("echo", b"hi"), 30)
            # every time a face sees is wall clock, like the snapshot's own taken_at
            assert before - 1 < view.submitted_at <= view.finished_at <= time.time() + 1
            assert all(before - 1 < t < time.time() + 1 for t, _s, _n in view.history)
            snap = face.snapshot()
            assert abs(snap.gpus[0].history[-1][0] - snap.taken_at) < 5
        c.close()
        assert root.exists()


@pytest.mark.process
def test_priority_cancel_many_kill_retry_and_drain() -> None:
    with in_process(backends()) as (sup, _server, _root):
        c = Client(sup.paths.control_socket)
        first = c.submit("slow", req(steps=40, step_s=0.05))
        second, third = sup.submit("slow", b""), sup.submit("slow", b"")
        wait_until(lambda: sup.job(first).state is JobState.RUNNING, 30, "first running")
        assert sup.job(third).position == 2
        moved = c.set_priority(third, 50)
        assert moved.priority == 50 and moved.position == 1
        assert sup.job(second).position == 2
        assert "priority 0 → 50" in moved.history[-1][2]
        with pytest.raises(Refused, match="only a queued job"):
            sup.set_priority(first, 3)
        with pytest.raises(InvalidRequest):
            c.set_priority(second, "high")  # type: ignore[arg-type]
        results = {r.job_id: r for r in c.cancel_many([second, third, "j-nope", second])}
        assert len(results) == 3
        assert results[second].state == results[third].state == "cancelled"
        assert results["j-nope"].state is None and "unknown job" in (results["j-nope"].error
                                                                      or "")
        # kill: the worker's process is really gone, and the job says why it failed
        pid = sup.snapshot().backend("slow").pid
        assert pid is not None and psutil.pid_exists(pid)
        c.kill("slow")
        view = sup.wait(first, 30)
        assert view.state is JobState.FAILED and "killed on request" in (view.error or "")
        wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() ==
                 psutil.STATUS_ZOMBIE, 10, "the killed worker gone")
        wait_until(lambda: sup.snapshot().backend("slow").pid is None, 10, "no worker")
        with pytest.raises(Refused, match="no worker"):
            sup.kill("slow")
        asked = c.job_request(first, limit=4)
        assert (asked.size, asked.data) == (len(req(steps=40, step_s=0.05)), b'{"st')
        assert sup.job_request(second).data == b"" and sup.job_request(second).kept
        with pytest.raises(UnknownJob):
            sup.job_request("j-nope")
        # retry: the same request as a new job
        with pytest.raises(UnknownJob):
            c.retry("j-nope")
        again = c.retry(first)
        assert again != first and sup.job(again).backend == "slow"
        assert sup.job(again).state in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
        sup.cancel(again)
        with pytest.raises(Refused, match="calibration|finished"):
            sup.retry(sup.submit("slow", b""))  # still waiting
        # drain: the flag is in the snapshot, both ways, and a bad GPU is a clear error
        assert c.drain(0) == (0,) and sup.snapshot().gpus[0].draining
        assert sup.drain(0, False) == () and not c.snapshot().gpus[0].draining
        with pytest.raises(UnknownGpu, match="no GPU7"):
            c.drain(7)
        c.close()


@pytest.mark.process
def test_reload_applies_changes_and_a_broken_file_leaves_the_rest_running() -> None:
    with in_process(backends()) as (sup, _server, root):
        desc = root / "backends.yaml"
        good = desc.read_text()
        desc.write_text(good + "\n  - name: extra\n\tscript: x.py\n")  # a tab: bad YAML
        c = Client(sup.paths.control_socket)
        broken = c.reload()
        assert broken.errors and "backends.yaml" in broken.errors[0]
        assert not broken.removed and not broken.added
        assert {k.split(":")[0] for k in broken.kept} == {"echo", "slow", "huge"}
        assert sup.wait(sup.submit("echo", b"still here"), 30).data == b"still here"
        assert sup.snapshot().descriptor_errors == broken.errors
        changed = [dict(echo_backend(), priority=5), echo_backend("echo2"),
                   sim_backend("slow", 1024, 512, steps=40, step_s=0.05)]
        desc.write_text(yaml.safe_dump({"backends": changed}))
        result = sup.reload()
        assert result.added == ("echo2",) and result.removed == ("huge",)
        assert [(ch.backend, ch.changes) for ch in result.changed] == [
            ("echo", ("priority: 0 → 5",))]
        assert not result.errors and not sup.snapshot().descriptor_errors
        snap = c.snapshot()
        assert snap.backend("echo").priority == 5 and snap.backend("huge") is None
        assert c.wait(c.submit("echo2", b"new"), 30).data == b"new"
        assert any("descriptors reloaded" in line.text for line in snap.log)
        assert c.reload().unchanged
        c.close()
