"""The demo module on its own (no Textual, no engine): when the simulated demo counts as
loaded, which requests a plan keeps, and what submitting it through the facade reports.

``tests/test_tui.py`` presses ``d`` against a real engine; these pin the pieces it is made of.
"""

from __future__ import annotations

from dataclasses import replace

from fixed_source import FixedSource, demo_snapshot

from vramtui.demo import DEMO_WORKLOAD, demo_loaded, demo_plan, submit_workload


def test_the_demo_counts_as_loaded_only_when_the_engine_says_so_and_has_a_demo_backend() -> None:
    snap = demo_snapshot()
    assert demo_loaded(snap)
    assert not demo_loaded(None)
    assert not demo_loaded(replace(snap, notice=None))
    assert not demo_loaded(replace(snap, backends=tuple(b for b in snap.backends
                                                        if b.name == "echo")))


def test_a_plan_keeps_the_workload_order_and_leaves_out_absent_backends() -> None:
    snap = demo_snapshot()
    assert demo_plan(snap) == list(DEMO_WORKLOAD)
    without = replace(snap, backends=tuple(b for b in snap.backends if b.name != "flux-sim"))
    plan = demo_plan(without)
    assert plan == [w for w in DEMO_WORKLOAD if w[0] != "flux-sim"]
    assert len(plan) == len(DEMO_WORKLOAD) - 2


def test_submitting_goes_through_the_facade_and_counts_refusals() -> None:
    source = FixedSource(demo_snapshot())
    plan = demo_plan(source.snapshot())
    done = submit_workload(source, plan)
    assert [args[0] for name, args in source.calls if name == "submit"] == \
        [b for b, _r, _p in plan]
    assert [args[2] for _name, args in source.calls] == [p for _b, _r, p in plan]
    assert len(done.job_ids) == 12 and not done.refused
    assert done.summary().startswith("Submitted 12 demo jobs to 4 backends: watch admission")
    source.fail = True
    done = submit_workload(source, plan[:2])
    assert not done.job_ids and len(done.refused) == 2
    assert done.summary().startswith("Submitted 0 demo jobs to 2 backends")
    assert done.summary().endswith("2 refused (sdxl-sim: the engine is not running "
                                   "(connection refused)).")
