"""Calibration of a worker that can sleep: what it keeps asleep and how long its wake takes.

The reference runner (a private simulated GPU) and the engine's own calibration job both put
such a worker to sleep after its repeats and wake it: the report measures its residual from
the samples (never the worker's word) and its wake's time, and the overlay gives the
scheduler those as its priors (``sleep: {residual}``, ``wake_cost``). A sleep that gives
nothing back is a finding, and no prior is written from it. The analysis is checked on a
hand-built record too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from engine_support import ROOT, engine, sim_backend

from supervisor import JobState
from supervisor.calibration.analysis import analyze
from supervisor.calibration.harness import run_with_wire_server
from supervisor.calibration.record import CalibrationRecord, CalSample, PhaseMark
from supervisor.calibration.report import report_from_json, report_to_json

SIMMODEL = ROOT / "examples" / "demo" / "simmodel.py"
ENV = {"SIM_WEIGHTS_MIB": "2000", "SIM_ACTIVATION_MIB": "300", "SIM_LOAD_S": "0",
       "SIM_STEPS": "2", "SIM_STEP_S": "0.1", "SIM_SLEEP_KEEP_MIB": "44", "SIM_WAKE_S": "0.4"}


def record(asleep_mib: int, *, wake: bool = True) -> CalibrationRecord:
    """A run at 20 Hz: 300 MiB context, 2000 resident, 2300 per request, then asleep."""
    marks = ["start", "initialize", "settle-load", "predict-1", "settle-1", "predict-2",
             "settle-2", "sleep", "asleep", "wake", "woken", "shutdown", "exited", "end"]
    levels = [300, 300, 2000, 2300, 2000, 2300, 2000, 2000, asleep_mib, asleep_mib, 2000,
              300, 0, 0]
    if not wake:
        marks.remove("woken")
        levels.pop(10)
    samples, t = [], 0.0
    times = []
    for level in levels:
        times.append(t)
        for _ in range(10):
            samples.append(CalSample(round(t, 3), {7: level} if level else {}, level + 100))
            t += 0.05
    return CalibrationRecord("m", 0, "simulated", True, 20.0, 2, b"", 0.0, samples,
                             [PhaseMark(round(at, 3), m) for at, m in zip(times, marks,
                                                                        strict=True)],
                             24576, "completed")


def test_the_analysis_measures_what_it_keeps_asleep_and_its_wake() -> None:
    report = analyze(record(300))
    assert report.sleep_residual is not None and report.sleep_residual.value_mib == 300
    assert report.wake_s == pytest.approx(0.5)
    assert report.sleeps and "asleep 300 MiB, wakes in 0.50 s" in report.headline()
    fields = report.overlay_fields()
    assert fields["sleep"] == {"residual": "300MiB"} and fields["wake_cost"] == "0.5s"
    again = report_from_json(report_to_json(record(300))["analysis"])
    assert (again.sleep_residual, again.wake_s) == (report.sleep_residual, report.wake_s)


def test_a_sleep_that_gives_nothing_back_is_a_finding_and_no_prior() -> None:
    report = analyze(record(1990))
    assert "sleep-gives-nothing" in report.codes and not report.sleeps
    assert "sleep" not in report.overlay_fields() and "vram" in report.overlay_fields()
    no_wake = analyze(record(300, wake=False))
    assert no_wake.wake_s is None and not no_wake.sleeps


@pytest.mark.process
def test_the_reference_runner_sleeps_and_wakes_a_worker_that_can() -> None:
    rec = run_with_wire_server(SIMMODEL, ENV, repeats=2, settle_s=0.4)
    phases = [m.phase for m in rec.marks]
    assert phases.index("asleep") < phases.index("wake") < phases.index("woken") < \
        phases.index("shutdown")
    report = analyze(rec)
    assert report.sleep_residual is not None
    assert report.sleep_residual.value_mib == 44 + 256  # what it kept + its context
    assert report.wake_s is not None and report.wake_s >= 0.4
    assert report.overlay_fields()["sleep"] == {"residual": "300MiB"}


@pytest.mark.process
def test_the_engines_calibration_writes_the_sleep_priors() -> None:
    spec = sim_backend("napper", 2000, 300, steps=2, step_s=0.1)
    spec["env"].update(SIM_SLEEP_KEEP_MIB="44", SIM_WAKE_S="0.3")
    spec["vram"] = "6GiB"
    with engine([spec]) as sup:
        result = sup.wait(sup.calibrate("napper", repeats=2, settle_s=0.4), 90)
        assert result.state is JobState.SUCCEEDED, result.error
        summary = json.loads(result.data or b"{}")
        overlay = yaml.safe_load(Path(summary["overlay"]).read_text())
        view = sup.snapshot().backend("napper")
    assert summary["sleep_residual_mib"] == 300 and summary["wake_s"] >= 0.3
    entry = json.dumps(overlay)
    assert '"residual": "300MiB"' in entry and "wake_cost" in entry
    assert view is not None and view.wake_cost_s is not None and view.wake_cost_s >= 0.3
