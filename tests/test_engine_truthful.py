"""What the engine tells about a backend is true (fast tier, fake workers): a preload says
when the worker is ready, and a cold backend holds no resident memory."""

from __future__ import annotations

from fake_worker import Script, fake_engine
from waiting import wait_until


def test_a_preload_says_ready_and_a_cold_backend_shows_no_resident_memory() -> None:
    desc = {"vram": {"weights": "1024MiB", "activation": "256MiB"}, "safety": "0MiB"}
    with fake_engine({"a": desc}, scripts={"a": Script(weights_mib=1024,
                                                       activation_mib=256)}) as fe:
        fe.sup.preload("a")
        wait_until(lambda: (b := fe.sup.snapshot().backend("a")) is not None
                   and b.state == "ready" and b.observed_mib, what="a preloaded and seen")
        wait_until(lambda: any("a ready on GPU0 after" in line.text and "(preloaded)"
                               in line.text for line in fe.sup.snapshot().log),
                   what="the ready event")
        fe.sup.evict("a")
        wait_until(lambda: fe.sup.snapshot().backend("a").state == "cold",  # type: ignore
                   what="a cold")
        cold = fe.sup.snapshot().backend("a")
        assert cold is not None and cold.observed_mib is None and cold.pid is None
