"""``GET /metrics``: the engine in the Prometheus text format, read at scrape time.

Built from one snapshot and the engine's :class:`~supervisor.counters.Counters` per scrape
(nothing is kept between scrapes).  Names follow Prometheus' conventions: the ``vramtui_``
prefix, base units (bytes, seconds), ``_total`` on counters, and no label that input can
grow (no job ids).  GPU series carry ``gpu`` (the index, as a string) and ``UUID`` — the
labels NVIDIA's dcgm-exporter uses — and ``modelName``, so the two exporters join on them.
``vramtui_gpu_info{simulated="true"}`` marks a simulated GPU, ``kind="host memory"`` the host
device (``--gpus host``: RAM read from /proc, UUID ``HOST-<index>``);
``vramtui_backend_info{simulated="true"}`` a backend whose memory figures are simulated (its
own declaration, or the device it runs on: as ``vramtui backends --json`` says it), so that
its ``vramtui_backend_memory_bytes`` and peers are labelled too, by a join on ``backend``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from ..counters import EVICTION_REASONS, OUTCOMES, REFUSAL_REASONS, Histogram
from ..doors.codec import backend_simulated
from ..workers.handle import WorkerState

if TYPE_CHECKING:
    from ..engine import Engine

MIB = 1024 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BACKEND_STATES = tuple(s.value for s in WorkerState)


class EngineCollector(Collector):
    """Every vramtui series, from the engine's snapshot and counters at collect time."""

    def __init__(self, engine: Engine, version: str, uuids: dict[int, str]) -> None:
        self.engine = engine
        self.version = version
        self.uuids = uuids

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        snap = engine.snapshot()
        counters = engine.counters
        info = GaugeMetricFamily("vramtui_build_info", "vramtui's version, Python and GPU "
                                 "source (always 1)", labels=["version", "python", "source"])
        info.add_metric([self.version, snap.python, snap.source], 1)
        yield info
        yield _gauge("vramtui_engine_uptime_seconds", "Seconds since the engine started",
                     snap.uptime_s)
        yield _gauge("vramtui_engine_stopping", "1 while the engine stops (it takes no jobs)",
                     1 if snap.stopping else 0)

        gpu_labels = ["gpu", "UUID", "modelName"]
        gpu_info = GaugeMetricFamily("vramtui_gpu_info", "Each GPU (always 1); simulated=\"true\" "
                                     "for a simulated GPU; kind: GPU, SIMULATED or host memory "
                                     "(--gpus host: the host's RAM, read from /proc)",
                                     labels=[*gpu_labels, "simulated", "kind"])
        fams = {
            "total": GaugeMetricFamily("vramtui_gpu_memory_total_bytes", "GPU memory in all",
                                       labels=gpu_labels),
            "used": GaugeMetricFamily("vramtui_gpu_memory_used_bytes",
                                      "GPU memory in use, as the device reports it",
                                      labels=gpu_labels),
            "reserved": GaugeMetricFamily("vramtui_gpu_memory_reserved_bytes",
                                          "GPU memory held by admission for vramtui's workers",
                                          labels=gpu_labels),
            "ours": GaugeMetricFamily("vramtui_gpu_memory_workers_bytes",
                                      "GPU memory vramtui's worker processes really use",
                                      labels=gpu_labels),
            "foreign": GaugeMetricFamily("vramtui_gpu_memory_foreign_bytes",
                                         "GPU memory used by processes that are not vramtui's",
                                         labels=gpu_labels),
            "others": GaugeMetricFamily("vramtui_gpu_memory_others_held_back_bytes",
                                        "GPU memory admission holds back for processes that "
                                        "are not vramtui's (with hysteresis)",
                                        labels=gpu_labels),
            "yielded": GaugeMetricFamily("vramtui_gpu_yielded",
                                         "1 while the GPU is yielded (vramtui yield): nothing "
                                         "of vramtui's runs there", labels=gpu_labels),
            "budget": GaugeMetricFamily("vramtui_gpu_memory_budget_bytes",
                                        "GPU memory admission may still hand out",
                                        labels=gpu_labels),
            "reserve": GaugeMetricFamily("vramtui_gpu_memory_kept_free_bytes",
                                         "GPU memory always kept free (the reserve)",
                                         labels=gpu_labels),
        }
        util = GaugeMetricFamily("vramtui_gpu_utilization_ratio", "GPU utilisation (0-1)",
                                 labels=gpu_labels)
        for g in snap.gpus:
            labels = [str(g.index), self.uuids.get(g.index, ""), g.name]
            gpu_info.add_metric([*labels, "true" if g.simulated else "false", g.kind], 1)
            fams["total"].add_metric(labels, g.total_mib * MIB)
            if g.used_mib is not None:
                fams["used"].add_metric(labels, g.used_mib * MIB)
            fams["reserved"].add_metric(labels, g.reserved_mib * MIB)
            fams["ours"].add_metric(labels, g.ours_mib * MIB)
            if g.foreign_mib is not None:
                fams["foreign"].add_metric(labels, g.foreign_mib * MIB)
            fams["others"].add_metric(labels, g.others_mib * MIB)
            fams["yielded"].add_metric(labels, 1 if g.yielded_by is not None else 0)
            fams["budget"].add_metric(labels, g.budget_mib * MIB)
            fams["reserve"].add_metric(labels, g.reserve_mib * MIB)
            if g.util_pct is not None:
                util.add_metric(labels, g.util_pct / 100.0)
        yield gpu_info
        yield from fams.values()
        yield util

        backend_info = GaugeMetricFamily("vramtui_backend_info", "Each backend (always 1); "
                                         "simulated=\"true\" when its memory figures are "
                                         "simulated", labels=["backend", "simulated"])
        state = GaugeMetricFamily("vramtui_backend_state", "1 for the state each backend's "
                                  "worker is in, 0 for the others", labels=["backend", "state"])
        gpu_of = GaugeMetricFamily("vramtui_backend_gpu", "The GPU index a backend's worker "
                                   "runs on (absent when none runs)", labels=["backend"])
        mem = GaugeMetricFamily("vramtui_backend_memory_bytes", "GPU memory a backend's worker "
                                "processes use (last sample)", labels=["backend"])
        reserved = GaugeMetricFamily("vramtui_backend_memory_reserved_bytes", "GPU memory "
                                     "admission holds for a backend", labels=["backend"])
        peak = GaugeMetricFamily("vramtui_backend_peak_bytes", "A backend's peak: declared "
                                 "(descriptor or calibration overlay), learned (measured in "
                                 "production), observed_p95 (of recent jobs)",
                                 labels=["backend", "kind"])
        queued = GaugeMetricFamily("vramtui_backend_jobs_queued", "Jobs waiting per backend",
                                   labels=["backend"])
        running = GaugeMetricFamily("vramtui_backend_jobs_running", "Jobs admitted per backend",
                                    labels=["backend"])
        keep = GaugeMetricFamily("vramtui_backend_keep_alive_remaining_seconds", "Seconds "
                                 "until an idle backend is unloaded", labels=["backend"])
        for b in snap.backends:
            backend_info.add_metric([b.name, "true" if backend_simulated(snap, b) else "false"],
                                    1)
            for s in BACKEND_STATES:
                state.add_metric([b.name, s], 1 if b.state == s else 0)
            if b.gpu is not None:
                gpu_of.add_metric([b.name], b.gpu)
            if b.observed_mib is not None:
                mem.add_metric([b.name], b.observed_mib * MIB)
            reserved.add_metric([b.name], b.reserved_mib * MIB)
            for kind, value in (("declared", b.declared_peak_mib),
                                ("learned", b.learned_peak_mib),
                                ("observed_p95", b.observed_p95_mib)):
                if value is not None:
                    peak.add_metric([b.name, kind], value * MIB)
            queued.add_metric([b.name], b.queued)
            running.add_metric([b.name], b.running)
            if b.keep_alive_left_s is not None:
                keep.add_metric([b.name], b.keep_alive_left_s)
        residual = GaugeMetricFamily("vramtui_backend_sleep_residual_bytes", "GPU memory a "
                                     "backend's worker kept asleep, as last measured",
                                     labels=["backend"])
        for b in snap.backends:
            if b.sleep_residual_mib is not None:
                residual.add_metric([b.name], b.sleep_residual_mib * MIB)
        yield from (backend_info, state, gpu_of, mem, reserved, peak, queued, running, keep,
                    residual)
        yield _gauge("vramtui_sleep_host_memory_bytes", "Host memory that sleeping workers "
                     "take", engine.sleeper.host_held_mib() * MIB)
        yield _gauge("vramtui_sleep_host_budget_bytes", "Host memory sleeping workers may take "
                     "in all (sleep_host_budget)", engine.sleeper.budget_mib * MIB)

        names = [b.name for b in snap.backends]
        yield _per_backend("vramtui_backend_loads", "Worker loads that reached ready",
                           names, counters.loads)
        yield _per_backend("vramtui_backend_load_failures", "Workers that failed before ready",
                           names, counters.load_failures)
        yield _per_backend("vramtui_backend_crashes", "Ready workers that exited unasked",
                           names, counters.crashes)
        yield _per_backend("vramtui_backend_sleeps", "Workers put to sleep (for room, or asked)",
                           names, counters.sleeps)
        yield _per_backend("vramtui_backend_wakes", "Sleeping workers woken", names,
                           counters.wakes)
        yield _per_backend("vramtui_backend_sleep_failures", "Sleeps and wakes that failed "
                           "(or lied): the worker stopped instead", names,
                           counters.sleep_failures)
        ev = CounterMetricFamily("vramtui_backend_evictions", "Idle workers stopped to free "
                                 "memory, by reason (asked, room, idle, overuse)",
                                 labels=["backend", "reason"])
        for name in names:
            for reason in EVICTION_REASONS:
                ev.add_metric([name, reason], counters.evictions.get((name, reason), 0))
        yield ev
        jobs = CounterMetricFamily("vramtui_jobs", "Jobs that ended, by outcome",
                                   labels=["backend", "outcome"])
        for name in names:
            for outcome in OUTCOMES:
                jobs.add_metric([name, outcome], counters.jobs.get((name, outcome), 0))
        yield jobs
        ref = CounterMetricFamily("vramtui_refusals", "Submits refused, by reason",
                                  labels=["reason"])
        for reason in REFUSAL_REASONS:
            ref.add_metric([reason], counters.refusals.get(reason, 0))
        yield ref
        yield _gauge("vramtui_jobs_queued", "Jobs waiting in the queue", len(snap.queued))
        yield _gauge("vramtui_jobs_running", "Jobs admitted or running", len(snap.running))
        yield _histograms("vramtui_backend_load_duration_seconds", "Seconds from spawning a "
                          "worker to its ready", names, counters.load_seconds)
        yield _histograms("vramtui_backend_wake_duration_seconds", "Seconds from asking a "
                          "sleeping worker to wake to its answer", names, counters.wake_seconds)
        yield _histograms("vramtui_job_queue_wait_seconds", "Seconds from submit to start, "
                          "of the jobs that started", names, counters.queue_wait)
        yield _histograms("vramtui_job_duration_seconds", "Seconds from start to end, of the "
                          "jobs that started", names, counters.duration)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _per_backend(name: str, doc: str, names: list[str], table: dict[str, int]
                 ) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=["backend"])
    for backend in names:
        fam.add_metric([backend], table.get(backend, 0))
    return fam


def _histograms(name: str, doc: str, names: list[str], table: dict[str, Histogram]
                ) -> HistogramMetricFamily:
    """One histogram per configured backend that observed something (as every per-backend
    family: a backend a reload removed has no series left)."""
    fam = HistogramMetricFamily(name, doc, labels=["backend"])
    for backend in names:
        hist = table.get(backend)
        if hist is not None:
            fam.add_metric([backend], hist.cumulative(), sum_value=hist.total)
    return fam


class Exporter:
    """A registry holding only the engine's collector; ``render()`` is the page."""

    def __init__(self, engine: Engine, version: str, uuids: dict[int, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = EngineCollector(engine, version, uuids)
        self.registry.register(self.collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)
