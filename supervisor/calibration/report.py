"""The calibration report on disk: every raw sample and mark, plus the analysis, as JSON.

A report keeps the whole ``CalibrationRecord`` so that ``recalibrate(path)`` re-runs the
(possibly improved) analysis with no GPU.  Files are written atomically (a temporary file in
the same directory, fsync, then ``os.replace``): an interrupted write leaves the old file or
none, never half of one.  Layout (``version`` 1)::

    {"format": "vramtui-calibration", "version": 1,
     "record": {backend, gpu, source, per_process, sample_hz, repeats, request_b64,
                started_wall, device_total_mib, outcome, error,
                "marks": [[t, phase], ...]},
     "analysis": {... Report fields ...},
     "overlay": {"vram": {...}} or null,
     "samples": [[t, device_used_mib, {"pid": mib, ...}(, read_s)], ...]}   # one per line
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from ..atomicfile import write_atomic
from ..backends.overlay import write_overlay
from ..backends.schema import NAME_RE
from ..paths import MAX_REPORT_BYTES, read_bounded
from .analysis import analyze
from .record import CalibrationError, CalibrationRecord, CalSample, PhaseMark
from .result import Finding, Measure, Report

FORMAT = "vramtui-calibration"
VERSION = 1

__all__ = [
    "CalibrationError",
    "load_report",
    "parse_report",
    "recalibrate",
    "report_from_json",
    "report_to_json",
    "write_calibrated_overlay",
    "write_report",
]


# -- to JSON -----------------------------------------------------------------------------------


def _measure_json(measure: Measure | None) -> dict[str, int] | None:
    if measure is None:
        return None
    return {"value_mib": measure.value_mib, "spread_mib": measure.spread_mib,
            "samples": measure.samples}


def _record_json(record: CalibrationRecord) -> dict[str, Any]:
    return {
        "backend": record.backend,
        "gpu": record.gpu,
        "source": record.source,
        "per_process": record.per_process,
        "allocated": record.allocated,
        "sample_hz": record.sample_hz,
        "repeats": record.repeats,
        "request_b64": base64.b64encode(record.request).decode("ascii"),
        "started_wall": record.started_wall,
        "device_total_mib": record.device_total_mib,
        "outcome": record.outcome,
        "error": record.error,
        "marks": [[m.t, m.phase] for m in record.marks],
    }


def _sample_json(sample: CalSample) -> list[Any]:
    row = [sample.t, sample.device_used_mib, {str(pid): mib for pid, mib in sample.procs.items()}]
    return [*row, round(sample.read_s, 6)] if sample.read_s > 0 else row


def _analysis_json(report: Report) -> dict[str, Any]:
    return {
        "analysis_version": report.analysis_version,
        "backend": report.backend,
        "gpu": report.gpu,
        "source": report.source,
        "outcome": report.outcome,
        "error": report.error,
        "repeats": report.repeats,
        "sample_count": report.sample_count,
        "duration_s": report.duration_s,
        "started_wall": report.started_wall,
        "confidence": report.confidence,
        "reason": report.reason,
        "context": _measure_json(report.context),
        "weights": _measure_json(report.weights),
        "activation": _measure_json(report.activation),
        "peak": _measure_json(report.peak),
        "resident": _measure_json(report.resident),
        "load_peak_mib": report.load_peak_mib,
        "predict_peak_mib": report.predict_peak_mib,
        "run_peaks": list(report.run_peaks),
        "run_settled": list(report.run_settled),
        "sleep_residual": _measure_json(report.sleep_residual),
        "wake_s": report.wake_s,
        "findings": [
            {"code": f.code, "message": f.message, "numbers": dict(f.numbers)}
            for f in report.findings
        ],
    }


def report_to_json(record: CalibrationRecord, report: Report | None = None) -> dict[str, Any]:
    """The whole report as a JSON-ready dict (``report`` defaults to ``analyze(record)``)."""
    if report is None:
        report = analyze(record)
    return {
        "format": FORMAT,
        "version": VERSION,
        "record": _record_json(record),
        "analysis": _analysis_json(report),
        "overlay": report.overlay_fields() or None,
        "samples": [_sample_json(s) for s in record.samples],
    }


def _dumps(document: dict[str, Any]) -> str:
    """Indented JSON, except one line per sample (a run at 20 Hz has thousands)."""
    samples = document.get("samples", [])
    head = {k: v for k, v in document.items() if k != "samples"}
    text = json.dumps(head, indent=2, ensure_ascii=False, allow_nan=False)
    lines = ",\n".join(
        "    " + json.dumps(s, separators=(",", ":"), allow_nan=False) for s in samples
    )
    body = f"[\n{lines}\n  ]" if samples else "[]"
    return f'{text[:-2]},\n  "samples": {body}\n}}\n'


def write_report(
    path: str | os.PathLike[str], record: CalibrationRecord, report: Report | None = None
) -> Path:
    """Write the report (record + analysis) to ``path`` atomically; returns the path."""
    target = Path(path)
    write_atomic(target, _dumps(report_to_json(record, report)))
    return target


def write_calibrated_overlay(path: str | os.PathLike[str], report: Report) -> Path:
    """Write ``report``'s measured ``vram:`` fields as a one-backend overlay at ``path``.

    Raises ``CalibrationError`` (and writes nothing) when the report justifies no overlay.
    """
    fields = report.overlay_fields()
    if not fields:
        raise CalibrationError(f"no overlay for {report.backend}: {report.overlay_refusal}")
    return write_overlay(path, report.backend, fields, comment=report.overlay_comment())


# -- from JSON ---------------------------------------------------------------------------------


def _measure(data: Any) -> Measure | None:
    if data is None:
        return None
    return Measure(int(data["value_mib"]), int(data["spread_mib"]), int(data["samples"]))


def _record(data: dict[str, Any], samples: list[Any]) -> CalibrationRecord:
    backend = data["backend"]
    if not isinstance(backend, str) or not NAME_RE.match(backend):
        # (it names the overlay written from the report: never a path)
        raise ValueError(f"its backend {backend!r:.80} is not a backend name")
    return CalibrationRecord(
        backend=backend,
        gpu=int(data["gpu"]),
        source=str(data["source"]),
        per_process=bool(data["per_process"]),
        allocated=data.get("allocated") if isinstance(data.get("allocated"), bool) else None,
        sample_hz=float(data["sample_hz"]),
        repeats=int(data["repeats"]),
        request=base64.b64decode(data["request_b64"], validate=True),
        started_wall=float(data["started_wall"]),
        samples=tuple(
            CalSample(float(t), {int(pid): int(mib) for pid, mib in procs.items()},
                      None if used is None else int(used), float(read[0]) if read else 0.0)
            for t, used, procs, *read in samples
        ),
        marks=tuple(PhaseMark(float(t), str(phase)) for t, phase in data["marks"]),
        device_total_mib=int(data["device_total_mib"]),
        outcome=str(data["outcome"]),
        error=data.get("error"),
    )


def report_from_json(data: dict[str, Any]) -> Report:
    """Rebuild the ``Report`` stored in a report's ``analysis`` section."""
    return Report(
        backend=data["backend"],
        gpu=data["gpu"],
        source=data["source"],
        outcome=data["outcome"],
        error=data["error"],
        repeats=data["repeats"],
        sample_count=data["sample_count"],
        duration_s=data["duration_s"],
        started_wall=data["started_wall"],
        context=_measure(data["context"]),
        weights=_measure(data["weights"]),
        activation=_measure(data["activation"]),
        peak=_measure(data["peak"]),
        resident=_measure(data["resident"]),
        load_peak_mib=data["load_peak_mib"],
        predict_peak_mib=data["predict_peak_mib"],
        run_peaks=tuple(data["run_peaks"]),
        run_settled=tuple(data["run_settled"]),
        findings=tuple(
            Finding(f["code"], f["message"], dict(f["numbers"])) for f in data["findings"]
        ),
        confidence=data["confidence"],
        reason=data["reason"],
        analysis_version=data["analysis_version"],
        sleep_residual=_measure(data.get("sleep_residual")),
        wake_s=data.get("wake_s"),
    )


def load_report(path: str | os.PathLike[str]) -> tuple[CalibrationRecord, Report]:
    """Read a report: its record and the analysis stored with it (not recomputed).

    Raises ``CalibrationError`` naming the file for anything unreadable or malformed.
    """
    try:
        data = read_bounded(path, MAX_REPORT_BYTES)
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read the calibration report: "
                               f"{exc.strerror or exc}") from exc
    if len(data) > MAX_REPORT_BYTES:
        raise CalibrationError(f"{path}: over {MAX_REPORT_BYTES >> 20} MiB, more than a "
                               "calibration report is; is it the right file?")
    return parse_report(data, path)


def parse_report(data: bytes, path: str | os.PathLike[str] = "report"
                 ) -> tuple[CalibrationRecord, Report]:
    """A report's record and stored analysis from its JSON bytes (``path`` names it in
    errors): what a face gets through the API (``calibration_report``) reads the same way."""
    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read the calibration report: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CalibrationError(f"{path}: not a vramtui calibration report")
    if document.get("version") != VERSION:
        raise CalibrationError(
            f"{path}: report version {document.get('version')!r} (this vramtui reads {VERSION})"
        )
    try:
        record = _record(document["record"], document["samples"])
        report = report_from_json(document["analysis"])
        if report.backend != record.backend:
            raise ValueError(f"its analysis is of {report.backend!r:.80}, its record of "
                             f"{record.backend!r}")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CalibrationError(f"{path}: malformed calibration report: {exc!r}") from exc
    return record, report


def recalibrate(path: str | os.PathLike[str]) -> Report:
    """Re-run the analysis on the raw samples saved in the report at ``path`` (no GPU)."""
    record, _stored = load_report(path)
    return analyze(record)
