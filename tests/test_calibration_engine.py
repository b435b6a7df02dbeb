"""Calibration as a job of the real engine: queued, alone on a GPU, measured, written."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest
import yaml
from engine_support import ROOT, engine, sim_backend
from waiting import wait_until

from supervisor import JobState

EXAMPLES = ROOT / "examples" / "calibration"


def calibration_backend(name: str, script: str, *, weights: int, activation: int,
                        declared: str = "6GiB") -> dict:
    return {
        "name": name,
        "script": str(EXAMPLES / script),
        "vram": declared,
        "env": {"SIM_WEIGHTS_MIB": str(weights), "SIM_ACTIVATION_MIB": str(activation),
                "SIM_LOAD_S": "0.05", "SIM_PREDICT_S": "0.2"},
        "timeouts": {"stop_grace": "3s", "start": "20s"},
    }


@pytest.mark.process
def test_a_calibration_measures_writes_the_overlay_and_admission_uses_it() -> None:
    steady = calibration_backend("steady", "steady.py", weights=1000, activation=500)
    with engine([steady, sim_backend("other", 512, 256)]) as sup:
        sup.wait(sup.submit("other", b"{}"), 30)  # a hot worker that must make room
        job = sup.calibrate("steady", repeats=2, settle_s=0.3)
        result = sup.wait(job, 90)
        assert result.state is JobState.SUCCEEDED, result.error
        summary = json.loads(result.data or b"{}")
        overlay = Path(summary["overlay"])
        written = yaml.safe_load(overlay.read_text())
        assert "steady" in json.dumps(written)
        # figures measured on a simulated GPU say so in the file they are written to (its
        # comment was "measured by vramtui calibrate on <stamp>; report <path>" alone)
        header = overlay.read_text().split("\nname:")[0]
        assert "(simulated GPU 0)" in header and f"# report {summary['report']}" in header
        report = json.loads(Path(summary["report"]).read_text())
        assert len(report["samples"]) > 20  # every raw sample is kept, for recalibrate
        assert {m["phase"] if isinstance(m, dict) else m[1] for m in report["record"]["marks"]} \
            >= {"start", "initialize", "predict-1", "predict-2", "shutdown", "end"}
        # Admission now uses the measured peak (256 context + 1000 + 500), not the 6 GiB.
        backend = sup.snapshot().backend("steady")
        assert backend.declared_peak_mib is not None
        assert abs(backend.declared_peak_mib - 1756) <= 64
        assert sup.snapshot().backend("other").state == "cold"  # it ran alone
        # listed with the jobs at every door (`vramtui jobs` said "no jobs yet" while it ran)
        listed = {v.id: v.kind for v in sup.jobs(backends=["steady"])}
        assert listed == {job: "calibration"}


@pytest.mark.process
def test_a_cancelled_calibration_writes_no_overlay() -> None:
    slow = calibration_backend("slow", "steady.py", weights=500, activation=100)
    slow["env"]["SIM_PREDICT_S"] = "5"
    with engine([slow]) as sup:
        job = sup.calibrate("slow", repeats=3, settle_s=0.2)
        wait_until(lambda: "predict" in sup.job(job).progress_text, deadline=30,
                 what="the calibration predicting")
        sup.cancel(job)
        assert sup.wait(job, 30).state is JobState.CANCELLED
        backends_d = sup.paths.backends_dir
        assert not list(backends_d.glob("*.yaml")) if backends_d.exists() else True
        assert sup.snapshot().backend("slow").declared_peak_mib == 6 * 1024


@pytest.mark.process
def test_a_stop_during_a_calibration_says_it_interrupts_it(
        caplog: pytest.LogCaptureFixture) -> None:
    # (it said "stopping: no job is running" while `vramtui calibrate` held the GPU)
    slow = calibration_backend("slow", "steady.py", weights=500, activation=100)
    slow["env"]["SIM_PREDICT_S"] = "5"
    with caplog.at_level(logging.INFO, logger="supervisor"), engine([slow]) as sup:
        job = sup.calibrate("slow", repeats=3, settle_s=0.2)
        wait_until(lambda: "predict" in sup.job(job).progress_text, deadline=30,
                   what="the calibration predicting")
        sup.stop(timeout=30)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stopping")]
    assert lines == ["stopping: no job is running; the calibration of slow is interrupted "
                     "(run `vramtui calibrate slow` again)"]


@pytest.mark.process
def test_a_calibration_is_not_starved_by_jobs_for_the_same_backend() -> None:
    steady = calibration_backend("steady", "steady.py", weights=500, activation=100)
    with engine([steady], gpus="sim:8GiB,sim:8GiB") as sup:
        first = sup.submit("steady", b"{}")
        wait_until(lambda: sup.job(first).state is JobState.RUNNING, what="a job running")
        cal = sup.calibrate("steady", repeats=1, settle_s=0.2)
        # A steady stream of jobs for the same backend must not keep the old worker busy
        # for ever: once the calibration holds its GPU, new jobs wait.
        others = [sup.submit("steady", b"{}") for _ in range(5)]
        assert sup.wait(cal, 90).state is JobState.SUCCEEDED
        results = [sup.wait(j, 90) for j in others]
        assert all(r.state is JobState.SUCCEEDED for r in results)
        # None of them was given to the worker the calibration had to stop (steady#1).
        notes = [note for r in results for _t, state, note in r.history if state == "running"]
        assert notes and not any(note.startswith("on steady#1 ") for note in notes), notes


@pytest.mark.process
def test_each_phase_of_a_run_waits_for_a_sample_of_its_own() -> None:
    # With no settle at all (or a sampler that falls behind a short one, as on a loaded
    # machine with 0.2 s), the phase after the worker was ready saw no sample, and the run
    # measured nothing; each phase now lasts until one of its own samples has come.
    steady = calibration_backend("steady", "steady.py", weights=1000, activation=500)
    with engine([steady]) as sup:
        result = sup.wait(sup.calibrate("steady", repeats=1, settle_s=0), 90)
        assert result.state is JobState.SUCCEEDED, result.error
        report = json.loads(Path(json.loads(result.data or b"{}")["report"]).read_text())
        times = [sample[0] for sample in report["samples"]]  # [t, device MiB, ...]
        for (begins, phase), (ends, _) in itertools.pairwise(report["record"]["marks"]):
            if phase in ("settle-load", "settle-1", "exited"):
                assert any(begins <= t <= ends for t in times), (phase, begins, ends)
