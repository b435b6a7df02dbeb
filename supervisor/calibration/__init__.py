"""Calibration: measuring a backend's real VRAM footprint from a run of its worker.

- ``record``: the data a run produces (samples of the worker's memory, phase marks);
- ``analysis``: pure analysis of a record into a ``Report`` (figures, findings, confidence);
- ``result``: the ``Report``, its ``Measure``/``Finding`` parts and the overlay it justifies;
- ``report``: the JSON report on disk (raw samples kept) and ``recalibrate``;
- ``harness``: a run without the engine, on a private simulated GPU (tests, model authors);
- ``runner``: the engine's runs (:class:`runner.Calibrations`, one part of the engine).

Only the pure modules are imported here.
"""

from .analysis import analyze
from .record import CalibrationError, CalibrationRecord, CalSample, PhaseMark
from .report import load_report, recalibrate, report_to_json, write_report
from .result import Finding, Measure, Report

__all__ = [
    "CalSample",
    "CalibrationError",
    "CalibrationRecord",
    "Finding",
    "Measure",
    "PhaseMark",
    "Report",
    "analyze",
    "load_report",
    "recalibrate",
    "report_to_json",
    "write_report",
]
