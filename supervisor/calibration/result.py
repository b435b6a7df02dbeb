"""What the analysis answers: measures, findings, confidence, and the overlay they justify.

``Report`` is frozen and compares by value, so a report recomputed from a saved record
(``report.recalibrate``) can be checked against the original.  ``overlay_fields`` gives the
descriptor fields to write only when the run completed and earned at least "medium"
confidence; otherwise it is empty — a calibration never writes a figure it did not measure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..snapshot import device_label
from ..units import format_duration, format_size_mib

ANALYSIS_VERSION = 2  # 2: the context leaves out its creation and teardown
CONFIDENCES = ("high", "medium", "low")

# Findings about the model's behaviour (what the backend does) ...
BEHAVIOUR_CODES = frozenset(
    {
        "load-peak-above-inference",
        "activation-much-larger-than-weights",
        "lazy-loading",
        "shutdown-keeps-memory",
        "leak-across-repeats",
        "warm-up",
        "foreign-memory-changed",
        "sleep-gives-nothing",
    }
)
# ... and findings about the measurement itself (how far the numbers can be trusted).
QUALITY_CODES = frozenset(
    {
        "not-per-process",
        "no-process-samples",
        "zero-memory",
        "run-incomplete",
        "no-load-samples",
        "no-predict-samples",
        "too-few-samples",
        "sample-gaps",
        "context-not-seen",
        "single-run",
        "memory-unsettled",
    }
)


@dataclass(frozen=True)
class Measure:
    """A measured figure in MiB, the spread of the samples behind it, and how many there were."""

    value_mib: int
    spread_mib: int
    samples: int


@dataclass(frozen=True)
class Finding:
    """Something the samples show, in words, with the numbers behind it."""

    code: str
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def about_measurement(self) -> bool:
        """True for findings about the measurement's quality rather than the model."""
        return self.code in QUALITY_CODES


@dataclass(frozen=True)
class Report:
    """The analysis of one ``CalibrationRecord``.

    ``context``/``weights``/``activation``/``peak`` are the descriptor's figures (None where
    not measured); ``resident`` is the worker's memory once loaded (context + weights);
    ``load_peak_mib``/``predict_peak_mib`` are the highest readings while loading and while
    running requests; ``run_peaks``/``run_settled`` are per repeat (None: no sample).
    ``sleep_residual`` is what a worker that can sleep kept on the GPU asleep and ``wake_s``
    how long its wake took (None: it cannot sleep, or did not).
    """

    backend: str
    gpu: int
    source: str
    outcome: str
    error: str | None
    repeats: int
    sample_count: int
    duration_s: float
    started_wall: float
    context: Measure | None
    weights: Measure | None
    activation: Measure | None
    peak: Measure | None
    resident: Measure | None
    load_peak_mib: int | None
    predict_peak_mib: int | None
    run_peaks: tuple[int | None, ...]
    run_settled: tuple[int | None, ...]
    findings: tuple[Finding, ...]
    confidence: str
    reason: str
    analysis_version: int = ANALYSIS_VERSION
    sleep_residual: Measure | None = None
    wake_s: float | None = None

    @property
    def sleeps(self) -> bool:
        """It slept and woke, and sleeping gave memory back."""
        return (self.sleep_residual is not None and self.wake_s is not None
                and "sleep-gives-nothing" not in self.codes)

    @property
    def codes(self) -> tuple[str, ...]:
        """The findings' codes, in order."""
        return tuple(f.code for f in self.findings)

    @property
    def overlay_refusal(self) -> str | None:
        """Why no overlay may be written from this report, or None when one may."""
        if self.outcome != "completed":
            return f"the run did not complete ({self.outcome})"
        if self.confidence == "low":
            return f"confidence is low: {self.reason}"
        if self.peak is None or self.weights is None or self.activation is None:
            return "the footprint was not measured"
        return None

    def overlay_fields(self) -> dict[str, Any]:
        """The backend's measured ``vram:`` fields for ``write_overlay``; ``{}`` when refused.

        All four keys are written (``context: null`` when it was not seen) so that figures
        from an earlier layer never mix with measured ones; ``peak`` is explicit so an older
        explicit peak cannot win over weights + activation.
        """
        if self.overlay_refusal is not None:
            return {}
        assert self.peak is not None and self.weights is not None
        assert self.activation is not None
        fields: dict[str, Any] = {
            "vram": {
                "peak": format_size_mib(self.peak.value_mib),
                "weights": format_size_mib(self.weights.value_mib),
                "activation": format_size_mib(self.activation.value_mib),
                "context": (format_size_mib(self.context.value_mib)
                            if self.context is not None else None),
            }
        }
        if self.sleeps:  # the scheduler's priors for its sleeps and wakes
            assert self.sleep_residual is not None and self.wake_s is not None
            fields["sleep"] = {"residual": format_size_mib(self.sleep_residual.value_mib)}
            fields["wake_cost"] = format_duration(round(self.wake_s, 2))
        return fields

    def overlay_comment(self) -> str:
        """Lines for ``write_overlay(..., comment=...)``: when, how sure, and what was seen."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_wall))
        lines = [
            f"calibrated by vramtui on {stamp} ({device_label(self.source, self.gpu)}): "
            f"{self.sample_count} samples, {self.repeats} repeats",
            f"confidence {self.confidence}: {self.reason}",
        ]
        lines += [f"finding {f.code}: {f.message}" for f in self.findings]
        return "\n".join(lines)

    def headline(self) -> str:
        """One line: the footprint (or why there is none), the confidence and the findings."""
        if self.peak is None:
            text = f"not measured ({self.confidence} confidence: {self.reason})"
        else:
            parts = [f"peak {self.peak.value_mib} MiB"]
            if self.weights is not None and self.activation is not None:
                split = f"weights {self.weights.value_mib} + activation {self.activation.value_mib}"
                if self.context is not None:
                    split += f" + context {self.context.value_mib}"
                parts.append(f"({split})")
            text = " ".join(parts) + f", {self.confidence} confidence"
        if self.sleeps:
            assert self.sleep_residual is not None and self.wake_s is not None
            text += (f"; asleep {self.sleep_residual.value_mib} MiB, wakes in "
                     f"{self.wake_s:.2f} s")
        model = [f.code for f in self.findings if not f.about_measurement]
        return text + (f"; {', '.join(model)}" if model else "")

    def summary(self) -> dict[str, Any]:
        """A flat, JSON-ready summary (for job results, the CLI and the TUI)."""

        def mib(measure: Measure | None) -> int | None:
            return measure.value_mib if measure is not None else None

        return {
            "backend": self.backend,
            "headline": self.headline(),
            "confidence": self.confidence,
            "reason": self.reason,
            "peak_mib": mib(self.peak),
            "weights_mib": mib(self.weights),
            "activation_mib": mib(self.activation),
            "context_mib": mib(self.context),
            "resident_mib": mib(self.resident),
            "sleep_residual_mib": mib(self.sleep_residual),
            "wake_s": self.wake_s,
            "findings": [{"code": f.code, "message": f.message} for f in self.findings],
            "samples": self.sample_count,
        }
