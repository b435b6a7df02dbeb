"""The memory ledger and the admission inputs, as pure code: figures, holdings, the book."""

from __future__ import annotations

from supervisor.admission import WorkerFacts, decide_inputs, reload_cost_s
from supervisor.ledger import Declared, Device, Learned, figures, foreign_mib
from supervisor.scheduler import BackendInfo, QueuedJob, plan


def test_figures_never_size_a_known_peak_as_zero() -> None:
    # A peak alone: the whole peak is resident (the split is unknown).
    assert figures(Declared(5300, None), Learned()) == (5300, None)
    # weights + context known: the rest of the peak is per job.
    assert figures(Declared(5300, 4352), Learned()) == (5300, 948)
    # Nothing declared: alone until a measured job confirms a peak.
    assert figures(Declared(), Learned(peak_mib=6000, resident_mib=4000)) == (None, None)
    assert figures(Declared(), Learned(6000, 4000, peak_confirmed=True)) == (6000, 2000)


def test_learned_figures_replace_declared_ones_that_proved_too_small() -> None:
    declared = Declared(2200, 1024)
    # Seen at 13,500 with a job: the peak follows, and the declared split goes with it.
    assert figures(declared, Learned(peak_mib=13_500)) == (13_500, None)
    # Seen at 16,640 idle: the resident follows (and so does the peak).
    assert figures(declared, Learned(resident_mib=16_640)) == (16_640, 0)
    # Smaller observations change nothing: declared figures are a floor.
    assert figures(declared, Learned(peak_mib=1500, resident_mib=900)) == (2200, 1176)


def test_a_worker_holds_the_larger_of_its_figures_and_what_was_seen() -> None:
    info = BackendInfo("a", 10_000, 2_000, safety_mib=500)
    devices = [Device(0, 24_000, 12_000, 12_000)]
    seen_below = WorkerFacts("a#1", "a", 0, "ready", observed_mib=7_000)
    seen_above = WorkerFacts("a#1", "a", 0, "ready", observed_mib=15_000)
    for facts, held in ((seen_below, 8_000), (seen_above, 15_000)):
        snap, book = decide_inputs(devices, {"a": info}, [facts], ())
        assert snap.workers["a"].reserved_mib == held == book.gpus[0].held_mib


def test_foreign_memory_is_what_none_of_ours_holds() -> None:
    assert foreign_mib(10_000, {1: 3_000, 2: 4_000, 3: 500}, ours=[1, 2]) == 3_000
    assert foreign_mib(None, {1: 3_000}, ours=[]) == 0  # no reading: nothing is assumed


def test_memory_of_a_job_that_just_ended_comes_back_without_an_eviction() -> None:
    # a's last sample saw its job's activation; the job ended since. b needs that room: it
    # waits for the next sample instead of evicting a (which would be reloaded at once).
    a = BackendInfo("a", 12_000, 2_000)
    b = BackendInfo("b", 5_000, 1_000)
    devices = [Device(0, 16_000, 12_000, 4_000)]
    settling = WorkerFacts("a#1", "a", 0, "ready", observed_mib=12_000, settling=True,
                           idle_since=0.0)
    queue = (QueuedJob("jb", "b", 0, 1, 0.0), QueuedJob("ja", "a", 0, 2, 0.0))
    snap, book = decide_inputs(devices, {"a": a, "b": b}, [settling], queue)
    assert book.gpus[0].held_mib == 12_000  # still counted in full
    assert snap.gpus[0].leaving_mib == 2_000 and snap.workers["a"].reserved_mib == 10_000
    p = plan(snap, 1.0)
    assert p.evictions == () and p.starts == ()
    assert p.waiting["jb"] == "waiting for 1 worker to stop on GPU0"
    # The next sample sees the activation gone: b starts beside a, nothing evicted.
    fresh = WorkerFacts("a#1", "a", 0, "ready", observed_mib=10_000, idle_since=0.0)
    now = [Device(0, 16_000, 10_000, 6_000)]
    p2 = plan(decide_inputs(now, {"a": a, "b": b}, [fresh], queue)[0], 1.1)
    assert p2.evictions == () and [s.job_id for s in p2.starts] == ["jb"]


def test_reload_cost_is_learned_from_measured_loads() -> None:
    assert reload_cost_s(None, []) == 1.0  # the default prior
    assert reload_cost_s(30.0, []) == 30.0  # the descriptor's prior
    assert reload_cost_s(30.0, [50.0, 60.0]) == 55.0  # measurements replace it


def test_a_distrusted_backend_is_never_sized_below_what_it_declares() -> None:
    # Caught above its figures while two jobs ran (no per-job peak is learned then), with a
    # peak confirmed earlier: distrust must not lower its reservation below its claim.
    from supervisor.admission import backend_info
    from supervisor.backends.schema import BackendSpec, VramSpec

    spec = BackendSpec(name="m", command=("true",), concurrency=2,
                       vram=VramSpec(weights_mib=3000, activation_mib=2000))
    learned = Learned(peak_mib=4000, resident_mib=3000, peak_confirmed=True)
    trusted = backend_info(spec, learned)
    distrusted = backend_info(spec, learned, distrusted=True)
    assert distrusted.peak_mib is not None and trusted.peak_mib is not None
    assert distrusted.peak_mib >= trusted.peak_mib
    assert distrusted.holds_mib(2) >= trusted.holds_mib(2)
    # Until a job of it is measured again, it runs alone.
    fresh = backend_info(spec, Learned(peak_mib=4000, resident_mib=3000), distrusted=True)
    assert fresh.peak_mib is None


def test_the_figures_follow_a_replaced_descriptor_even_at_a_reused_address() -> None:
    # BackendRuntime.info() is cached; a replaced spec may be freed and its address reused
    # by the next one, which must not bring the old figures back.
    import dataclasses

    from supervisor.backends.schema import BackendSpec, VramSpec
    from supervisor.engine import BackendRuntime

    base = BackendSpec(name="m", command=("true",), vram=VramSpec(peak_mib=1000))
    claims = [VramSpec(peak_mib=1000 + 1000 * i) for i in range(1, 200)]
    rt = BackendRuntime(dataclasses.replace(base))
    assert rt.info().peak_mib == 1000
    for vram in claims:  # two replacements between reads, as two quick reloads make
        rt.spec = dataclasses.replace(base, vram=VramSpec(peak_mib=1))
        rt.spec = dataclasses.replace(base, vram=vram)
        assert rt.info().peak_mib == vram.peak_mib
