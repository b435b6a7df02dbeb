"""Pure analysis of a calibration record: footprint figures, findings and confidence.

No I/O, no clock, no threads.  The worker's memory at a sample is the sum over the processes
of its tree the GPU source showed ("visible" samples); samples where none was visible say
nothing (never "0 MiB").  Each sample belongs to the phase whose mark precedes it.

How each figure is computed (MiB):

- **resident**: the median of the worker's memory during ``settle-load`` (after ``ready``);
  spread = max - min there.
- **context** (the CUDA context): every process holds its context for its whole life, so no
  reading can be below it, and the lowest readings come while nothing else is held: before
  the weights load (``start``/``initialize``) and after ``@unload`` (``shutdown``).  The value
  is the median of the readings of those phases within ``NOISE_MIB`` of their minimum (capped
  at the resident); spread = max - min of those readings.  vramd took the median after
  unload; a worker whose unload frees nothing would then report its weights as context,
  hence the pre-load readings too.  Two moments are not the context: NVML lists a process
  while its context is being created, at a fraction of its size (an H200, driver 580: 14 MiB,
  rising to 104 over ~85 ms, then 518), and a context being destroyed reads 0 for an instant
  before the process leaves the list.  So a 0 beside other readings is left out (here and in
  the unload check), and on NVML so are readings under ``CONTEXT_MIN_MIB`` within
  ``CONTEXT_CREATION_S`` of the worker's first visible one, where others are left.  (Neither
  a held level nor time alone tells them apart: a context then a staged load's first shard
  looks like a ramp then a context, and a model may load within that first moment.)  The
  simulated GPU charges a context whole at once, and the host device has none.
  On a real GPU a loader that touches CUDA and copies weights at once leaves few pre-load
  readings: then the figure leans high and ``weights`` low by as much, and their sum (the
  resident, which admission uses) is still exact.
- **weights**: resident - context (the resident itself when no context was seen).
- **load peak**: the highest reading in ``start``, ``initialize`` and ``settle-load``.
- **run peak** *i*: the highest reading in ``predict-i`` and ``settle-i``; the **predict
  peak** is the highest run peak (a first-job warm-up is included: every fresh worker pays it).
- **activation**: predict peak - resident; spread = max - min of the run peaks.
- **peak**: max(load peak, predict peak); spread = max - min of the run peaks.
- **settled** *i*: the median reading in ``settle-i`` (for leaks).
- **asleep** (a worker that can sleep): the median reading in ``asleep``; spread = max - min
  there; the **wake** time is from the ``wake`` mark to the ``woken`` one. A sleep that keeps
  within ``NOISE_MIB`` of the resident gave nothing back (``sleep-gives-nothing``).

Findings (codes in ``result.BEHAVIOUR_CODES`` and ``result.QUALITY_CODES``) carry the numbers
behind them; thresholds are the module constants below.  Confidence is "high" unless a
quality problem lowers it; with no per-process memory, no visible sample or a 0 MiB reading
it is "low" and the footprint is absent (or refused for the overlay): never a guessed 0.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .record import (
    ASLEEP,
    EXITED,
    INITIALIZE,
    LOAD_PHASES,
    SETTLE_LOAD,
    SHUTDOWN,
    START,
    WAKE,
    WOKEN,
    CalibrationError,
    CalibrationRecord,
    CalSample,
    predict_phase,
    settle_phase,
)
from .result import ANALYSIS_VERSION, Finding, Measure, Report

__all__ = ["analyze", "CalibrationError", "Finding", "Measure", "Report"]

NOISE_MIB = 64  # readings closer than this are "the same level"
MIN_SETTLE_SAMPLES = 3  # fewer in a settle window: its median is weak
MIN_PREDICT_SAMPLES = 2  # fewer in a request window: its peak may fall between samples
GAP_FACTOR = 3.0  # a gap longer than this many sample periods is reported
LEAK_MIB_PER_RUN = 32.0
WARMUP_RATIO = 1.25
WARMUP_MIN_MIB = 256
ACTIVATION_RATIO = 2.0
ACTIVATION_MIN_MIB = 512
LAZY_MIN_ACTIVATION_MIB = 512
UNLOAD_KEPT_FRACTION = 0.9  # kept at least this share of what unload should free: flagged
UNLOAD_HOLD_S = 0.3  # ... for at least this long after SHUTDOWN, until the process died
FOREIGN_MIB = 64
CONTEXT_CREATION_S = 0.25  # on NVML, a reading this soon after the worker first showed and
CONTEXT_MIN_MIB = 128  # below this is a context still being created (see the module's
# docstring): no whole CUDA context is that small
NVML = "nvml"  # a record's source read through NVML (``gpu.model.GpuReading.source``)
MIN_FOREIGN_WINDOW = 3  # samples a phase needs for its foreign-memory median to count


def _ceil_median(values: Sequence[int]) -> int:
    """The median, rounded up (a VRAM figure is better slightly high than slightly low)."""
    return math.ceil(statistics.median(values))


def _totals(samples: Iterable[CalSample]) -> list[int]:
    return [s.total for s in samples if s.total is not None]


@dataclass
class _Phases:
    """The record's samples split by phase (samples before the first mark are dropped, and
    so is a sample whose reads spanned a mark: what it shows may be of either phase — on a
    busy machine the worker's activation, read after ``predict-1``, counted as resident)."""

    by_phase: dict[str, list[CalSample]] = field(default_factory=dict)
    starts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def split(cls, record: CalibrationRecord, samples: Sequence[CalSample]) -> _Phases:
        marks = record.marks
        times = [m.t for m in marks]
        if any(b < a for a, b in zip(times, times[1:], strict=False)):
            raise CalibrationError("phase marks are not in time order")
        names = [m.phase for m in marks]
        if len(set(names)) != len(names):
            raise CalibrationError("a phase is marked twice")
        out = cls(starts={m.phase: m.t for m in marks})
        for sample in samples:
            index = bisect_right(times, sample.t) - 1
            if index >= 0 and bisect_right(times, sample.t + sample.read_s) - 1 == index:
                out.by_phase.setdefault(marks[index].phase, []).append(sample)
        return out

    def get(self, *phases: str) -> list[CalSample]:
        return [s for p in phases for s in self.by_phase.get(p, [])]


@dataclass
class _Figures:
    """Intermediate figures shared by the checks."""

    resident: Measure | None = None
    context: Measure | None = None
    load_peak: int | None = None
    load_peak_t: float | None = None
    run_peaks: list[int | None] = field(default_factory=list)
    run_settled: list[int | None] = field(default_factory=list)
    predict_peak: int | None = None
    predict_samples: int = 0


# -- figures ---------------------------------------------------------------------------------


def _present(samples: Sequence[CalSample]) -> list[CalSample]:
    """The visible samples in time order, without a 0 beside other readings: a context being
    destroyed reads 0 for an instant before its process leaves the list."""
    seen = sorted((s for s in samples if s.total is not None), key=lambda s: s.t)
    return [s for s in seen if s.total] if any(s.total for s in seen) else seen


def _context_floor(record: CalibrationRecord, samples: Sequence[CalSample]) -> list[int]:
    """The readings the context is the floor of (see the module's docstring): on NVML none of
    a context still being created, where others are left."""
    seen = _present(samples)
    if NVML in record.source.split("+") and seen:
        first = min(s.t for s in record.samples if s.total is not None)
        created = [s for s in seen if s.t >= first + CONTEXT_CREATION_S
                   or (s.total or 0) >= CONTEXT_MIN_MIB]
        seen = created or seen
    return [s.total or 0 for s in seen]


def _figures(record: CalibrationRecord, phases: _Phases) -> _Figures:
    fig = _Figures()
    settled_load = _totals(phases.get(SETTLE_LOAD))
    if settled_load:
        fig.resident = Measure(
            _ceil_median(settled_load), max(settled_load) - min(settled_load), len(settled_load)
        )
    floor = _context_floor(record, phases.get(START, INITIALIZE, SHUTDOWN))
    if floor:
        low = min(floor)
        band = [v for v in floor if v <= low + NOISE_MIB]
        value = _ceil_median(band)
        if fig.resident is not None:
            value = min(value, fig.resident.value_mib)
        fig.context = Measure(value, max(band) - low, len(band))
    load = [s for s in phases.get(*LOAD_PHASES) if s.total is not None]
    if load:
        top = max(load, key=lambda s: s.total or 0)
        fig.load_peak, fig.load_peak_t = top.total, top.t
    for i in range(1, record.repeats + 1):
        window = _totals(phases.get(predict_phase(i), settle_phase(i)))
        fig.predict_samples += len(window)
        fig.run_peaks.append(max(window) if window else None)
        settled = _totals(phases.get(settle_phase(i)))
        fig.run_settled.append(_ceil_median(settled) if settled else None)
    peaks = [p for p in fig.run_peaks if p is not None]
    fig.predict_peak = max(peaks) if peaks else None
    return fig


def _spread(values: Sequence[int | None]) -> int:
    present = [v for v in values if v is not None]
    return max(present) - min(present) if present else 0


# -- behaviour checks --------------------------------------------------------------------------


def _check_load_peak(fig: _Figures) -> Finding | None:
    if fig.load_peak is None or fig.predict_peak is None:
        return None
    excess = fig.load_peak - fig.predict_peak
    if excess <= NOISE_MIB:
        return None
    return Finding(
        "load-peak-above-inference",
        f"loading peaks at {fig.load_peak} MiB, {excess} MiB above the highest request "
        f"({fig.predict_peak} MiB): the model is loaded at full size and shrunk afterwards "
        "(e.g. quantised after loading); the GPU must fit the load peak",
        {
            "load_peak_mib": fig.load_peak,
            "predict_peak_mib": fig.predict_peak,
            "excess_mib": excess,
            "at_s": round(fig.load_peak_t or 0.0, 3),
        },
    )


def _check_activation(weights: Measure | None, activation: Measure | None) -> Finding | None:
    if weights is None or activation is None or weights.value_mib <= NOISE_MIB:
        return None  # no weights: that is lazy loading, reported on its own
    w, a = weights.value_mib, activation.value_mib
    if a > ACTIVATION_RATIO * w and a > ACTIVATION_MIN_MIB:
        return Finding(
            "activation-much-larger-than-weights",
            f"a request needs {a} MiB on top of {w} MiB of weights ({a / w:.1f}x): "
            "predict probably loads another model",
            {"activation_mib": a, "weights_mib": w, "ratio": round(a / w, 2)},
        )
    return None


def _check_lazy(
    weights: Measure | None, activation: Measure | None, fig: _Figures
) -> Finding | None:
    if weights is None or activation is None:
        return None
    if weights.value_mib > NOISE_MIB or activation.value_mib <= LAZY_MIN_ACTIVATION_MIB:
        return None
    after = fig.run_settled[0] if fig.run_settled else None
    numbers: dict[str, int | None] = {
        "weights_mib": weights.value_mib,
        "activation_mib": activation.value_mib,
        "resident_after_first_job_mib": after,
    }
    kept = ""
    base = fig.resident.value_mib if fig.resident is not None else None
    if after is not None and base is not None and after - base > NOISE_MIB:
        kept = f"; after the first job it keeps {after} MiB"
    return Finding(
        "lazy-loading",
        f"nothing is resident after initialize ({weights.value_mib} MiB besides the CUDA "
        f"context) but a request uses {activation.value_mib} MiB: the model loads inside "
        f"predict, so the first job pays the load and an idle worker's size misleads{kept}",
        numbers,
    )


def _check_shutdown(
    record: CalibrationRecord, phases: _Phases, fig: _Figures
) -> Finding | None:
    last = next((s for s in reversed(fig.run_settled) if s is not None), None)
    if last is None and fig.resident is not None:
        last = fig.resident.value_mib
    if last is None:
        return None
    numbers: dict[str, float | int] = {"resident_mib": last}
    problems: list[str] = []
    # (a) @unload freed nothing: the worker held on to >= 90 % of what it should free until it
    # died, for a while after SHUTDOWN.
    held = _present(phases.get(SHUTDOWN))
    shutdown_t = phases.starts.get(SHUTDOWN)
    if fig.context is not None and held and shutdown_t is not None:
        freeable = last - fig.context.value_mib
        floor = min(s.total or 0 for s in held)
        span = held[-1].t - shutdown_t
        if (
            freeable > NOISE_MIB
            and floor - fig.context.value_mib >= UNLOAD_KEPT_FRACTION * freeable
            and span >= UNLOAD_HOLD_S
        ):
            numbers.update(held_mib=floor, held_for_s=round(span, 3),
                           freed_mib=max(0, last - floor))
            problems.append(
                f"after SHUTDOWN the worker still held {floor} MiB of {last} MiB for "
                f"{span:.2f} s until it exited: @unload frees nothing"
            )
    # (b) the device did not get the memory back once the process was gone.
    before = [s.device_used_mib for s in phases.get(settle_phase(record.repeats))
              if s.device_used_mib is not None]
    if not before:
        before = [s.device_used_mib for s in phases.get(SETTLE_LOAD)
                  if s.device_used_mib is not None]
    after = [s.device_used_mib for s in phases.get(EXITED) if s.device_used_mib is not None]
    if before and after:
        dropped = _ceil_median(before) - min(after)
        missing = last - dropped
        if missing > max(NOISE_MIB, (1 - UNLOAD_KEPT_FRACTION) * last):
            numbers.update(device_dropped_mib=dropped, device_missing_mib=missing)
            problems.append(
                f"after the worker exited the GPU's used memory fell by only {dropped} MiB "
                f"of {last} MiB ({missing} MiB not returned: a leftover process?)"
            )
    if not problems:
        return None
    return Finding(
        "shutdown-keeps-memory",
        "; ".join(problems) + " — evicting this backend frees less than planned",
        numbers,
    )


def _slope(ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2 …"""
    n = len(ys)
    mean_x, mean_y = (n - 1) / 2, sum(ys) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(ys))
    den = sum((x - mean_x) ** 2 for x in range(n))
    return num / den


def _check_leak(fig: _Figures) -> Finding | None:
    settled = [s for s in fig.run_settled if s is not None]
    if len(settled) < 2:
        return None
    slope = _slope(settled)
    if slope <= LEAK_MIB_PER_RUN:
        return None
    return Finding(
        "leak-across-repeats",
        f"the memory kept between jobs grows by {slope:.0f} MiB per job "
        f"({settled[0]} MiB after the first, {settled[-1]} MiB after the last): "
        "the figures will be too low for a worker that runs many jobs",
        {
            "slope_mib_per_run": round(slope, 3),
            "first_mib": settled[0],
            "last_mib": settled[-1],
            "runs": len(settled),
        },
    )


def _check_warmup(fig: _Figures) -> Finding | None:
    # Per run, what the request used above what it left behind: a transient warm-up shows
    # here, while weights loaded (and kept) by a first job do not.
    transient = [
        p - s if p is not None and s is not None else None
        for p, s in zip(fig.run_peaks, fig.run_settled, strict=True)
    ]
    if len(transient) < 2 or transient[0] is None:
        return None
    rest = [t for t in transient[1:] if t is not None]
    if not rest:
        return None
    first, typical = transient[0], _ceil_median(rest)
    if first > WARMUP_RATIO * typical and first - typical > WARMUP_MIN_MIB:
        return Finding(
            "warm-up",
            f"the first request used {first} MiB above what it kept, the others {typical} "
            f"MiB: every fresh worker's first job needs {first - typical} MiB more (the peak "
            "includes it; a single repeat would not tell it apart)",
            {"first_mib": first, "typical_mib": typical, "extra_mib": first - typical},
        )
    return None


def _check_foreign(phases: _Phases) -> Finding | None:
    """Memory of other processes (device used - ours), by the median of each phase while the
    worker lived: a median shrugs off a reading taken mid-change between the two queries."""
    levels: dict[str, int] = {}
    for phase, samples in phases.by_phase.items():
        if phase == EXITED:
            continue  # after exit, memory not returned is the shutdown check's business
        foreign = [
            s.device_used_mib - (s.total or 0) for s in samples if s.device_used_mib is not None
        ]
        if len(foreign) >= MIN_FOREIGN_WINDOW:
            levels[phase] = _ceil_median(foreign)
    if len(levels) < 2:
        return None
    low = min(levels, key=lambda p: levels[p])
    high = max(levels, key=lambda p: levels[p])
    moved = levels[high] - levels[low]
    if moved <= FOREIGN_MIB:
        return None
    return Finding(
        "foreign-memory-changed",
        f"other processes' memory on the GPU moved by {moved} MiB during the run "
        f"({levels[low]} MiB in {low}, {levels[high]} MiB in {high}): device-wide "
        "readings are unreliable; per-process figures are not affected",
        {"moved_mib": moved, "low_mib": levels[low], "low_phase": low,
         "high_mib": levels[high], "high_phase": high},
    )


# -- quality checks ----------------------------------------------------------------------------


def _check_gaps(record: CalibrationRecord, samples: Sequence[CalSample]) -> Finding | None:
    period = 1.0 / record.sample_hz
    gaps = [(b.t - a.t, a.t) for a, b in zip(samples, samples[1:], strict=False)]
    long = [g for g in gaps if g[0] > GAP_FACTOR * period]
    if not long:
        return None
    largest, at = max(long)
    return Finding(
        "sample-gaps",
        f"{len(long)} gaps between samples longer than {GAP_FACTOR:g} sample periods; the "
        f"largest {largest:.3f} s at {at:.2f} s (a short peak may have been missed)",
        {"gaps": len(long), "largest_gap_s": round(largest, 3), "at_s": round(at, 3),
         "period_s": round(period, 4)},
    )


def _check_windows(record: CalibrationRecord, phases: _Phases) -> Finding | None:
    short: dict[str, int] = {}
    wanted = [(SETTLE_LOAD, MIN_SETTLE_SAMPLES)]
    for i in range(1, record.repeats + 1):
        wanted += [(predict_phase(i), MIN_PREDICT_SAMPLES), (settle_phase(i), MIN_SETTLE_SAMPLES)]
    for phase, least in wanted:
        if phase not in phases.starts:
            continue  # never reached: the outcome says why
        count = len(_totals(phases.get(phase)))
        if count < least:
            short[phase] = count
    if not short:
        return None
    listed = ", ".join(f"{p}: {n}" for p, n in short.items())
    return Finding(
        "too-few-samples",
        f"some phases have too few samples of the worker ({listed}); make settle_s longer "
        "or the request longer",
        dict(short),
    )


# -- the analysis --------------------------------------------------------------------------------


def _empty_report(
    record: CalibrationRecord, samples: Sequence[CalSample], finding: Finding
) -> Report:
    findings = [finding]
    if record.outcome != "completed":
        findings.append(_incomplete(record))
    return Report(
        backend=record.backend, gpu=record.gpu, source=record.source, outcome=record.outcome,
        error=record.error, repeats=record.repeats, sample_count=len(samples),
        duration_s=_duration(record, samples), started_wall=record.started_wall,
        context=None, weights=None, activation=None, peak=None, resident=None,
        load_peak_mib=None, predict_peak_mib=None,
        run_peaks=(None,) * record.repeats, run_settled=(None,) * record.repeats,
        findings=tuple(findings), confidence="low", reason=finding.message,
        analysis_version=ANALYSIS_VERSION,
    )


def _incomplete(record: CalibrationRecord) -> Finding:
    why = f": {record.error}" if record.error else ""
    return Finding(
        "run-incomplete",
        f"the run {record.outcome}{why} (nothing may be written from it)",
        {"outcome": record.outcome, "error": record.error},
    )


def _duration(record: CalibrationRecord, samples: Sequence[CalSample]) -> float:
    ends = [m.t for m in record.marks] + [s.t for s in samples[-1:]]
    return round(max(ends), 3) if ends else 0.0


def analyze(record: CalibrationRecord) -> Report:
    """Analyse ``record`` into a ``Report``; raises ``CalibrationError`` only for a malformed
    record (marks out of order or repeated).  Missing data lowers the confidence instead."""
    samples = sorted(record.samples, key=lambda s: s.t)
    phases = _Phases.split(record, samples)
    if not record.per_process:
        return _empty_report(record, samples, Finding(
            "not-per-process",
            f"the GPU source ({record.source}) cannot attribute memory to processes, so the "
            "worker's memory cannot be measured",
            {"source": record.source},
        ))
    if record.allocated is False:
        return _empty_report(record, samples, Finding(
            "never-allocated",
            "no per-process memory seen: the worker never allocated memory of its own on the "
            f"{record.source} GPU (only its context) — a simulated worker must allocate "
            "through worker_sdk.sim (worker_sdk.sim.allocate) to be measured",
            {"source": record.source},
        ))
    visible = [s for s in samples if s.visible]
    if not visible:
        return _empty_report(record, samples, Finding(
            "no-process-samples",
            f"none of {len(samples)} samples saw the worker's processes on GPU {record.gpu}",
            {"samples": len(samples)},
        ))

    fig = _figures(record, phases)
    resident, context = fig.resident, fig.context
    weights = activation = peak = None
    if resident is not None:
        weights = Measure(
            resident.value_mib - (context.value_mib if context else 0),
            resident.spread_mib, resident.samples,
        )
    run_spread = _spread(fig.run_peaks)
    if resident is not None and fig.predict_peak is not None:
        activation = Measure(
            max(0, fig.predict_peak - resident.value_mib), run_spread, fig.predict_samples
        )
    if fig.predict_peak is not None:
        top = max(fig.predict_peak, fig.load_peak or 0)
        used = len(_totals(phases.get(*LOAD_PHASES))) + fig.predict_samples
        peak = Measure(top, run_spread, used)

    findings: list[Finding] = []
    lows: list[str] = []
    mediums: list[str] = []

    def add(finding: Finding | None, level: list[str] | None = None) -> None:
        if finding is not None:
            findings.append(finding)
            if level is not None:
                level.append(finding.message)

    if record.outcome != "completed":
        add(_incomplete(record), lows)
    if peak is not None and peak.value_mib == 0:
        add(Finding(
            "zero-memory",
            "every reading of the worker was 0 MiB: the GPU source does not report its "
            "memory (a 0 MiB footprint is not believable)",
            {"samples": len(visible)},
        ), lows)
    if resident is None:
        add(Finding("no-load-samples",
                    "no sample of the worker after it was ready (settle-load)", {}), lows)
    if fig.predict_peak is None:
        add(Finding("no-predict-samples",
                    "no sample of the worker while it ran a request", {}), lows)
    for check in (
        _check_load_peak(fig),
        _check_activation(weights, activation),
        _check_lazy(weights, activation, fig),
        _check_shutdown(record, phases, fig),
    ):
        add(check)
    add(_check_leak(fig), mediums)
    add(_check_warmup(fig))
    add(_check_foreign(phases))
    add(_check_gaps(record, samples), mediums)
    add(_check_windows(record, phases), mediums)
    if fig.predict_peak is not None and any(p is None for p in fig.run_peaks):
        missing = [i + 1 for i, p in enumerate(fig.run_peaks) if p is None]
        mediums.append(f"runs {missing} have no sample")
    if context is None and resident is not None:
        add(Finding(
            "context-not-seen",
            "no reading before load or after unload: the CUDA context is counted in weights",
            {},
        ), mediums)
    runs = sum(p is not None for p in fig.run_peaks)
    if fig.predict_peak is not None and runs < 2:
        add(Finding(
            "single-run",
            f"{runs} request measured: leaks and warm-up cannot be told apart (use repeats >= 2)",
            {"runs": runs},
        ), mediums)
    sleep_residual, wake_s = _sleep_figures(phases)
    if sleep_residual is not None and resident is not None and \
            sleep_residual.value_mib > resident.value_mib - NOISE_MIB:
        add(Finding(
            "sleep-gives-nothing",
            f"asleep it still held {sleep_residual.value_mib} MiB of its {resident.value_mib} "
            "MiB: its @worker_sdk.sleep gives nothing back (the engine stops it instead)",
            {"asleep_mib": sleep_residual.value_mib, "resident_mib": resident.value_mib},
        ))
    if resident is not None and resident.spread_mib > NOISE_MIB:
        add(Finding(
            "memory-unsettled",
            f"after ready the worker's memory still moved by {resident.spread_mib} MiB "
            "(a longer settle_s may help)",
            {"spread_mib": resident.spread_mib},
        ), mediums)

    if lows:
        confidence, reason = "low", "; ".join(lows)
    elif mediums:
        confidence, reason = "medium", "; ".join(mediums)
    else:
        confidence = "high"
        reason = (
            f"{len(visible)} samples of the worker at {record.sample_hz:g} Hz; every phase "
            f"seen; {runs} runs within {run_spread} MiB of each other"
        )
    return Report(
        backend=record.backend, gpu=record.gpu, source=record.source, outcome=record.outcome,
        error=record.error, repeats=record.repeats, sample_count=len(samples),
        duration_s=_duration(record, samples), started_wall=record.started_wall,
        context=context, weights=weights, activation=activation, peak=peak, resident=resident,
        load_peak_mib=fig.load_peak, predict_peak_mib=fig.predict_peak,
        run_peaks=tuple(fig.run_peaks), run_settled=tuple(fig.run_settled),
        findings=tuple(findings), confidence=confidence, reason=reason,
        analysis_version=ANALYSIS_VERSION, sleep_residual=sleep_residual, wake_s=wake_s,
    )


def _sleep_figures(phases: _Phases) -> tuple[Measure | None, float | None]:
    """What the worker kept asleep (the ``asleep`` phase's median) and its wake's time."""
    asleep = _totals(phases.get(ASLEEP))
    residual = Measure(_ceil_median(asleep), max(asleep) - min(asleep), len(asleep)) \
        if asleep else None
    starts = phases.starts
    wake_s = round(starts[WOKEN] - starts[WAKE], 3) if WAKE in starts and WOKEN in starts \
        else None
    return residual, wake_s
