"""Calibration analysis on synthetic series (no processes): figures, findings, confidence,
the overlay they justify, and the JSON report written, read back and recalibrated."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.backends.schema import build_spec
from supervisor.calibration import report as report_mod
from supervisor.calibration.analysis import analyze
from supervisor.calibration.record import (
    CalibrationError,
    CalibrationRecord,
    CalSample,
    PhaseMark,
)
from supervisor.calibration.report import (
    load_report,
    recalibrate,
    write_calibrated_overlay,
    write_report,
)
from supervisor.calibration.result import BEHAVIOUR_CODES, QUALITY_CODES

HZ = 20.0
PID = 4242
CTX, W, A = 256, 1024, 512
RESIDENT = CTX + W

Level = int | None | list[int | None]


def record_of(
    segments: list[tuple[str, float, Level]],
    *,
    repeats: int = 3,
    foreign: int | list[int] = 0,
    outcome: str = "completed",
    per_process: bool = True,
    drop: tuple[float, float] | None = None,
    device: list[int] | None = None,
    source: str = "simulated",
) -> CalibrationRecord:
    """A record of ``(phase, seconds, level)`` segments sampled at 20 Hz (read on ``source``).

    ``level`` is the worker's MiB (None: not visible), or a list with one value per sample.
    ``foreign`` is other processes' MiB (a list: per sample over the whole run); ``device``
    overrides the device's used memory per sample; samples in ``drop`` (t0, t1) are removed.
    """
    marks: list[PhaseMark] = []
    samples: list[CalSample] = []
    t = 0.0
    k = 0
    for phase, seconds, level in segments:
        marks.append(PhaseMark(round(t, 6), phase))
        n = round(seconds * HZ)
        for j in range(n):
            at = round(t + (j + 0.5) / HZ, 6)
            value = level[min(j, len(level) - 1)] if isinstance(level, list) else level
            other = foreign[min(k, len(foreign) - 1)] if isinstance(foreign, list) else foreign
            used = device[k] if device is not None else (value or 0) + other
            procs = {} if value is None else {PID: value}
            if drop is None or not drop[0] <= at < drop[1]:
                samples.append(CalSample(at, procs, used))
            k += 1
        t += seconds
    marks.append(PhaseMark(round(t, 6), "end"))
    return CalibrationRecord(
        backend="model-x", gpu=0, source=source, per_process=per_process, sample_hz=HZ,
        repeats=repeats, request=b'{"steps": 2}', started_wall=1_700_000_000.25,
        samples=tuple(samples), marks=tuple(marks), device_total_mib=24576, outcome=outcome,
        error=None if outcome == "completed" else "boom",
    )


def standard(
    *,
    repeats: int = 3,
    load: Level = None,
    resident: int = RESIDENT,
    peaks: list[Level] | None = None,
    settled: list[int] | None = None,
    shutdown: Level = CTX,
    shutdown_s: float = 0.1,
    start: Level = None,
    initialize: Level = CTX,
) -> list[tuple[str, float, Level]]:
    """A well-behaved run, with any part replaced."""
    peaks = peaks if peaks is not None else [resident + A] * repeats
    settled = settled if settled is not None else [resident] * repeats
    segments: list[tuple[str, float, Level]] = [
        ("start", 0.3, start),
        ("initialize", 0.5, initialize if load is None else load),
        ("settle-load", 0.5, resident),
    ]
    for i in range(1, repeats + 1):
        segments += [(f"predict-{i}", 0.5, peaks[i - 1]), (f"settle-{i}", 0.5, settled[i - 1])]
    segments += [("shutdown", shutdown_s, shutdown), ("exited", 0.5, None)]
    return segments


def codes(record: CalibrationRecord) -> set[str]:
    return set(analyze(record).codes)


# -- figures ---------------------------------------------------------------------------------


def test_steady_run_measures_exactly_and_finds_nothing() -> None:
    report = analyze(record_of(standard()))
    assert report.findings == ()
    assert report.confidence == "high"
    assert report.context is not None and report.context.value_mib == CTX
    assert report.weights is not None and report.weights.value_mib == W
    assert report.activation is not None and report.activation.value_mib == A
    assert report.peak is not None and report.peak.value_mib == CTX + W + A
    assert report.resident is not None and report.resident.value_mib == RESIDENT
    assert report.weights.samples == 10 and report.weights.spread_mib == 0
    assert report.activation.samples == 60  # 3 x (predict + settle) x 10
    assert report.run_peaks == (CTX + W + A,) * 3
    assert report.run_settled == (RESIDENT,) * 3


def test_overlay_fields_are_valid_descriptor_fields(tmp_path: Path) -> None:
    report = analyze(record_of(standard()))
    fields = report.overlay_fields()
    assert fields == {"vram": {"peak": "1792MiB", "weights": "1024MiB",
                               "activation": "512MiB", "context": "256MiB"}}
    spec = build_spec("model-x", {"command": ["true"], **fields}, base_dir=lambda _k: tmp_path)
    assert (spec.vram.peak_mib, spec.vram.weights_mib) == (1792, 1024)
    assert (spec.vram.activation_mib, spec.vram.context_mib) == (512, 256)
    assert spec.resident == RESIDENT

    path = write_calibrated_overlay(tmp_path / "zz-model-x.yaml", report)
    text = path.read_text()
    assert text.startswith("# calibrated by vramtui on ")
    assert yaml.safe_load(text) == {"name": "model-x", "overlay": True, **fields}


def test_a_sample_read_across_a_mark_counts_in_neither_phase(tmp_path: Path) -> None:
    """On a busy machine a sample stamped as its reads began, in ``settle-load``, was read
    after ``predict-1`` had begun and the worker had taken its activation: counted as
    resident, it made the resident spread the activation and the confidence medium."""
    record = record_of(standard())
    predict = next(m.t for m in record.marks if m.phase == "predict-1")
    straddler = CalSample(predict - 0.01, {PID: RESIDENT + A}, RESIDENT + A, read_s=0.05)
    spanning = dataclasses.replace(record, samples=tuple(sorted(
        (*record.samples, straddler), key=lambda s: s.t)))
    report = analyze(spanning)
    assert report.resident is not None and report.resident.spread_mib == 0
    assert report.confidence == "high" and report.findings == ()
    # read at once (read_s 0), the same reading is the resident's, as it says
    at_once = dataclasses.replace(spanning, samples=tuple(
        dataclasses.replace(s, read_s=0.0) for s in spanning.samples))
    assert "memory-unsettled" in analyze(at_once).codes
    # the report keeps how long each read took; a report without it (older) still loads
    path = write_report(tmp_path / "model-x.json", spanning, report)
    assert load_report(path)[0] == spanning
    document = json.loads(path.read_text())
    assert [len(row) for row in document["samples"]].count(4) == 1
    document["samples"] = [row[:3] for row in document["samples"]]
    path.write_text(json.dumps(document))
    assert load_report(path)[0] == at_once


def test_context_is_the_floor_before_load_or_after_unload() -> None:
    # A worker whose unload frees nothing: the pre-load floor still gives the context.
    report = analyze(record_of(standard(shutdown=RESIDENT, shutdown_s=0.1)))
    assert report.context is not None and report.context.value_mib == CTX
    # Seen only after unload (the loader touched CUDA and loaded at once).
    report = analyze(record_of(standard(initialize=[None, None, 900, 1100, RESIDENT])))
    assert report.context is not None and report.context.value_mib == CTX
    assert report.weights is not None and report.weights.value_mib == W


def test_the_context_is_not_what_nvml_shows_while_it_is_created_or_destroyed() -> None:
    # Read on an H200: a context being created shows 14-104 MiB for ~85 ms before its 518,
    # and one being destroyed reads 0 for an instant. Neither is the context, nor moves weights.
    for segments in (standard(initialize=[14, *[CTX] * 9]),
                     standard(start=[None, None, None, 20, 104, CTX], initialize=CTX),
                     standard(shutdown=[CTX, 0]),
                     # a lazy loader: nothing but its context until the first request
                     standard(initialize=[14, *[CTX] * 9], resident=CTX,
                              peaks=[CTX + 2048] * 3, settled=[CTX + 2048] * 3)):
        report = analyze(record_of(segments, source="nvml"))
        assert report.context is not None and report.context.value_mib == CTX, report.context


def test_shapes_that_look_like_a_context_being_created_are_not_taken_for_one() -> None:
    # The simulated GPU charges a context at once: a context seen briefly, then a staged
    # load's first shard, is the context (not the shard); on a real GPU the shard counts only
    # when nothing after the creation window shows the context.
    staged = standard(initialize=[CTX] * 2 + [CTX + 512] * 8)
    for source in ("simulated", "nvml"):
        report = analyze(record_of(staged, source=source))
        assert report.context is not None and report.context.value_mib == CTX, source
        assert report.weights is not None and report.weights.value_mib == W
    partial = standard(initialize=[CTX] * 3 + [RESIDENT] * 7, shutdown=[CTX + 600] * 10,
                       shutdown_s=0.5)
    report = analyze(record_of(partial))
    assert report.context is not None and report.context.value_mib == CTX
    # a teardown's 0 hides no unload that freed nothing
    kept = standard(initialize=CTX, shutdown=[RESIDENT] * 10 + [0], shutdown_s=0.55)
    assert "shutdown-keeps-memory" in codes(record_of(kept, source="nvml"))
    # a model loaded within the creation window: its context, seen whole there, is kept
    fast = standard(initialize=[CTX, CTX, *[RESIDENT] * 8], shutdown=[RESIDENT] * 10,
                    shutdown_s=0.5)
    report = analyze(record_of(fast, source="nvml"))
    assert report.context is not None and report.context.value_mib == CTX
    assert "shutdown-keeps-memory" in report.codes
    # the samples' order is not the record's business: the creation is the earliest reading
    ramp = record_of(standard(initialize=[14, *[CTX] * 9]), source="nvml+host")
    shuffled = dataclasses.replace(ramp, samples=tuple(reversed(ramp.samples)))
    assert analyze(shuffled).context == analyze(ramp).context
    assert analyze(ramp).context is not None and analyze(ramp).context.value_mib == CTX


def h200_creation(t: float) -> int | None:
    """NVML's figure for a process creating its CUDA context then holding it, read at 36 kHz
    on an H200 (driver 580.159.04): t in seconds after its cuInit."""
    if t < 0.276:
        return None
    if t < 0.334:
        return 14
    if t < 0.355:
        return 14 + int((t - 0.334) / 0.021 * 18)
    if t < 0.359:
        return 104
    return 518


@pytest.mark.parametrize("offset_ms", range(0, 50, 5))
def test_the_context_is_the_h200s_518_mib_wherever_20_hz_samples_fall(offset_ms: int) -> None:
    # its context created through initialize (1 s before the weights), sampled at 20 Hz at
    # every phase of the sampling against the creation: never the 14-104 MiB of its ramp
    preload = [h200_creation((j + 0.5) / HZ + offset_ms / 1000) for j in range(int(1.4 * HZ))]
    segments = standard(resident=518 + W, shutdown=[518, 0])
    assert segments[1][0] == "initialize"
    segments[1] = ("initialize", 1.4, preload)
    report = analyze(record_of(segments, source="nvml"))
    assert report.context is not None and report.context.value_mib == 518, report.context
    assert report.weights is not None and report.weights.value_mib == W


def test_context_not_seen_counts_it_in_weights_and_clears_it_in_the_overlay() -> None:
    record = record_of(standard(initialize=None, shutdown=None))
    report = analyze(record)
    assert report.context is None
    assert report.weights is not None and report.weights.value_mib == RESIDENT
    assert "context-not-seen" in report.codes and report.confidence == "medium"
    assert report.overlay_fields()["vram"]["context"] is None


# -- behaviour findings ----------------------------------------------------------------------


def test_load_peak_above_inference() -> None:
    quantised = record_of(standard(load=[CTX] * 3 + [CTX + 2 * W] * 7))
    report = analyze(quantised)
    assert report.codes == ("load-peak-above-inference",)
    finding = report.findings[0]
    assert finding.numbers["load_peak_mib"] == CTX + 2 * W
    assert finding.numbers["predict_peak_mib"] == CTX + W + A
    assert report.peak is not None and report.peak.value_mib == CTX + 2 * W
    assert report.activation is not None and report.activation.value_mib == A
    # within the noise band: nothing
    assert codes(record_of(standard(load=[CTX] * 3 + [CTX + W + A + 60] * 7))) == set()


def test_activation_much_larger_than_weights() -> None:
    small = CTX + 200
    report = analyze(record_of(standard(resident=small, peaks=[small + 2000] * 3,
                                        settled=[small] * 3)))
    assert report.codes == ("activation-much-larger-than-weights",)
    assert report.findings[0].numbers == {"activation_mib": 2000, "weights_mib": 200,
                                          "ratio": 10.0}
    # twice the weights but under 512 MiB: not flagged
    assert codes(record_of(standard(resident=small, peaks=[small + 500] * 3,
                                    settled=[small] * 3))) == set()


def test_lazy_loading_and_not_also_activation_or_warm_up() -> None:
    peaks: list[Level] = [RESIDENT + A] * 3
    report = analyze(record_of(standard(resident=CTX, peaks=peaks, settled=[RESIDENT] * 3)))
    assert report.codes == ("lazy-loading",)
    assert report.findings[0].numbers == {"weights_mib": 0, "activation_mib": W + A,
                                          "resident_after_first_job_mib": RESIDENT}
    # an echo-like worker: nothing resident, and next to nothing used either
    assert codes(record_of(standard(resident=CTX, peaks=[CTX + 16] * 3,
                                    settled=[CTX] * 3))) == set()


def test_shutdown_keeps_memory_when_unload_frees_nothing() -> None:
    report = analyze(record_of(standard(shutdown=RESIDENT, shutdown_s=0.6)))
    assert report.codes == ("shutdown-keeps-memory",)
    numbers = report.findings[0].numbers
    assert numbers["held_mib"] == RESIDENT and numbers["freed_mib"] == 0
    assert numbers["held_for_s"] >= 0.5
    # freed at once, or held too briefly to judge: nothing
    assert codes(record_of(standard(shutdown=[RESIDENT, CTX], shutdown_s=0.6))) == set()
    assert codes(record_of(standard(shutdown=RESIDENT, shutdown_s=0.1))) == set()
    # a worker with no weights has nothing to free
    assert "shutdown-keeps-memory" not in codes(record_of(standard(
        resident=CTX + 10, peaks=[CTX + 100] * 3, settled=[CTX + 10] * 3,
        shutdown=CTX + 10, shutdown_s=0.6)))


def test_shutdown_keeps_memory_when_the_device_does_not_get_it_back() -> None:
    segments = standard()
    n = sum(round(s * HZ) for _p, s, _l in segments)
    exited_from = n - 10  # the last 10 samples are the exited phase
    base = record_of(segments)
    device = [s.device_used_mib or 0 for s in base.samples]
    device[exited_from:] = [RESIDENT - 100] * 10  # most of it never came back
    report = analyze(record_of(segments, device=device))
    assert report.codes == ("shutdown-keeps-memory",)
    assert report.findings[0].numbers["device_missing_mib"] == RESIDENT - 100
    assert codes(base) == set()


def test_leak_across_repeats_reports_the_slope() -> None:
    settled = [RESIDENT + 40 * i for i in range(1, 5)]
    peaks: list[Level] = [s + A for s in settled]
    report = analyze(record_of(standard(repeats=4, peaks=peaks, settled=settled), repeats=4))
    assert report.codes == ("leak-across-repeats",)
    assert report.findings[0].numbers["slope_mib_per_run"] == 40.0
    assert report.confidence == "medium"
    settled = [RESIDENT + 16 * i for i in range(1, 5)]
    peaks = [s + A for s in settled]
    assert codes(record_of(standard(repeats=4, peaks=peaks, settled=settled), repeats=4)) == set()


def test_warm_up_on_the_first_request() -> None:
    peaks: list[Level] = [RESIDENT + A + 768, RESIDENT + A, RESIDENT + A]
    report = analyze(record_of(standard(peaks=peaks)))
    assert report.codes == ("warm-up",)
    assert report.findings[0].numbers == {"first_mib": A + 768, "typical_mib": A,
                                          "extra_mib": 768}
    assert report.activation is not None and report.activation.value_mib == A + 768
    assert report.activation.spread_mib == 768
    # 25 % more but under 256 MiB: not a warm-up
    assert codes(record_of(standard(peaks=[RESIDENT + A + 200, RESIDENT + A,
                                           RESIDENT + A]))) == set()


def test_foreign_memory_changed() -> None:
    segments = standard()
    n = sum(round(s * HZ) for _p, s, _l in segments)
    moving = [500] * (n // 2) + [700] * (n - n // 2)
    report = analyze(record_of(segments, foreign=moving))
    assert report.codes == ("foreign-memory-changed",)
    assert report.findings[0].numbers["moved_mib"] == 200
    # one reading taken mid-change (device and processes read apart) moves no median
    blip = [500] * n
    blip[n // 3] = 1500
    assert codes(record_of(segments, foreign=blip)) == set()


# -- quality -----------------------------------------------------------------------------------


def test_sample_gaps_are_reported_and_lower_confidence() -> None:
    report = analyze(record_of(standard(), drop=(1.0, 1.5)))
    assert report.codes == ("sample-gaps",)
    finding = report.findings[0]
    assert finding.numbers["gaps"] == 1 and finding.numbers["largest_gap_s"] == 0.55
    assert report.confidence == "medium" and "gaps" in report.reason
    assert report.overlay_fields() != {}  # medium still writes


def test_too_few_samples_in_a_window() -> None:
    segments = standard()
    segments[4] = ("settle-1", 0.1, RESIDENT)  # 2 samples
    report = analyze(record_of(segments))
    assert report.codes == ("too-few-samples",)
    assert report.findings[0].numbers == {"settle-1": 2}
    assert report.confidence == "medium"


def test_single_run_is_medium() -> None:
    report = analyze(record_of(standard(repeats=1), repeats=1))
    assert report.codes == ("single-run",)
    assert report.confidence == "medium"


def test_no_process_samples_gives_low_confidence_and_no_footprint() -> None:
    record = record_of([(p, s, None) for p, s, _l in standard()])
    report = analyze(record)
    assert report.codes == ("no-process-samples",)
    assert report.confidence == "low"
    assert (report.peak, report.weights, report.activation, report.context) == (None,) * 4
    assert report.overlay_fields() == {}
    with pytest.raises(CalibrationError):
        write_calibrated_overlay(Path("/nonexistent/never-written.yaml"), report)


def test_not_per_process_gives_no_footprint() -> None:
    report = analyze(record_of(standard(), per_process=False))
    assert report.codes == ("not-per-process",)
    assert report.confidence == "low" and report.peak is None
    assert report.overlay_fields() == {}


def test_zero_readings_are_never_a_certain_zero() -> None:
    report = analyze(record_of([(p, s, None if lv is None else 0)
                                for p, s, lv in standard()]))
    assert "zero-memory" in report.codes
    assert report.confidence == "low"
    assert report.overlay_fields() == {}


@pytest.mark.parametrize("outcome", ["cancelled", "crashed", "failed"])
def test_incomplete_run_gives_no_overlay(outcome: str) -> None:
    report = analyze(record_of(standard(), outcome=outcome))
    assert "run-incomplete" in report.codes
    assert report.confidence == "low"
    assert report.overlay_fields() == {}
    assert report.overlay_refusal is not None and outcome in report.overlay_refusal


def test_a_crash_before_ready_has_no_footprint() -> None:
    record = record_of([("start", 0.3, None), ("initialize", 0.5, CTX)], outcome="crashed")
    report = analyze(record)
    assert report.peak is None and report.weights is None
    assert {"run-incomplete", "no-load-samples", "no-predict-samples"} <= set(report.codes)
    assert report.overlay_fields() == {}


def test_malformed_marks_raise() -> None:
    good = record_of(standard())
    marks = list(good.marks)
    marks[1], marks[2] = marks[2], marks[1]
    with pytest.raises(CalibrationError, match="time order"):
        analyze(CalibrationRecord(**{**good.__dict__, "marks": tuple(marks)}))


def test_every_code_is_classified() -> None:
    assert not BEHAVIOUR_CODES & QUALITY_CODES


@settings(max_examples=40, deadline=None)
@given(
    ctx=st.integers(0, 1024),
    weights=st.integers(65, 40_000),
    activation=st.integers(0, 20_000),
    repeats=st.integers(2, 5),
    settle_s=st.floats(0.2, 1.0),
)
def test_step_functions_are_recovered_exactly(
    ctx: int, weights: int, activation: int, repeats: int, settle_s: float
) -> None:
    resident = ctx + weights
    segments: list[tuple[str, float, Level]] = [
        ("start", 0.2, None), ("initialize", 0.3, ctx), ("settle-load", settle_s, resident)]
    for i in range(1, repeats + 1):
        segments += [(f"predict-{i}", 0.3, resident + activation),
                     (f"settle-{i}", settle_s, resident)]
    segments += [("shutdown", 0.1, ctx), ("exited", settle_s, None)]
    report = analyze(record_of(segments, repeats=repeats))
    assert report.context is not None and report.context.value_mib == ctx
    assert report.weights is not None and report.weights.value_mib == weights
    assert report.activation is not None and report.activation.value_mib == activation
    assert report.peak is not None and report.peak.value_mib == resident + activation
    behaviour = {c for c in report.codes if c in BEHAVIOUR_CODES}
    expected = set()
    if activation > 2 * weights and activation > 512:
        expected.add("activation-much-larger-than-weights")
    assert behaviour == expected


# -- the report on disk -------------------------------------------------------------------------


def test_report_written_loaded_and_recalibrated_compare_equal(tmp_path: Path) -> None:
    peaks: list[Level] = [RESIDENT + A + 768, RESIDENT + A, RESIDENT + A]
    record = record_of(standard(peaks=peaks, shutdown=RESIDENT, shutdown_s=0.6),
                       drop=(1.0, 1.5))
    report = analyze(record)
    assert {"warm-up", "shutdown-keeps-memory", "sample-gaps"} <= set(report.codes)
    path = write_report(tmp_path / "reports" / "model-x.json", record, report)
    loaded_record, loaded_report = load_report(path)
    assert loaded_record == record
    assert loaded_report == report
    assert recalibrate(path) == report
    document = json.loads(path.read_text())
    assert document["format"] == "vramtui-calibration" and document["version"] == 1
    assert len(document["samples"]) == len(record.samples)
    assert document["overlay"] == report.overlay_fields()
    assert os.listdir(path.parent) == ["model-x.json"]


def test_a_low_report_round_trips_with_no_overlay(tmp_path: Path) -> None:
    record = record_of(standard(), outcome="crashed")
    path = write_report(tmp_path / "r.json", record)
    assert json.loads(path.read_text())["overlay"] is None
    assert load_report(path) == (record, analyze(record))


def test_an_interrupted_write_keeps_the_old_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = record_of(standard())
    path = write_report(tmp_path / "r.json", record)
    before = path.read_bytes()

    def fail(*_args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(report_mod.os, "replace", fail)
    with pytest.raises(KeyboardInterrupt):
        write_report(path, record_of(standard(), outcome="cancelled"))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize(
    "text, match",
    [
        ("{not json", "cannot read"),
        ('{"format": "something else"}', "not a vramtui calibration report"),
        ('{"format": "vramtui-calibration", "version": 99}', "version 99"),
        ('{"format": "vramtui-calibration", "version": 1, "record": {}}', "malformed"),
    ],
)
def test_bad_report_files_raise_calibration_error(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=match):
        load_report(path)
    with pytest.raises(CalibrationError, match="cannot read"):
        load_report(tmp_path / "missing.json")
