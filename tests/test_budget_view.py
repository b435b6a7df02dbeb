"""A GPU's budget, as every face shows it, is the ledger's: what admission may hand out now
(others counted as admission counts them, after they left too), 0 while the GPU is yielded."""

from __future__ import annotations

from fake_worker import fake_engine
from waiting import wait_until

from supervisor.engine import EngineConfig

GIB = 1024
STRANGER = 3_999_999  # a pid the fake GPU holds memory for, and no backend owns


def test_the_budget_shown_is_what_admission_may_hand_out() -> None:
    cfg = EngineConfig(reserve_mib=256, tick_s=0.02, sample_hz=100.0, ping_interval_s=0.05,
                       others_arrive_s=0.1, others_leave_s=60.0)
    with fake_engine({"a": {"vram": "1GiB"}}, config=cfg) as fe:
        fe.gpu.hold(STRANGER, 0, 4 * GIB)
        wait_until(lambda: fe.sup.snapshot().gpus[0].others_mib >= 4 * GIB, 5,
                   "the stranger counted")
        fe.gpu.release(STRANGER)
        wait_until(lambda: fe.sup.snapshot().gpus[0].foreign_mib == 0, 5,
                   "the stranger seen gone")
        g = fe.sup.snapshot().gpus[0]
        assert g.others_mib >= 4 * GIB  # still held back for it (hysteresis)
        assert g.budget_mib == 8 * GIB - g.reserved_mib - g.others_mib - 256, g
        fe.sup.yield_gpus([0])
        wait_until(lambda: fe.sup.snapshot().gpus[0].yielded_by is not None, 5, "yielded")
        assert fe.sup.snapshot().gpus[0].budget_mib == 0
