"""``/metrics`` against the truth, read with ``prometheus_client``'s own parser.

A real engine on the simulated GPU with its HTTP front door, real worker and model-server
processes (``tests/model_server.py``); what the page says of each backend's memory is
checked against the simulated GPU's own ledger (its per-process files), not against the
engine's idea of it; and the set of series is checked to follow the configured backends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from engine_support import sim_backend
from http_support import Front, serve_http
from prometheus_client.parser import text_string_to_metric_families
from spawning import spawns
from test_model_servers import CONTEXT_MIB, server_backend
from waiting import wait_until

pytestmark = [pytest.mark.process, pytest.mark.timeout(90)]

MIB = 1024 * 1024
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(front: Front) -> Samples:
    r = front.get("/metrics")
    assert r.status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.body.decode())
            for s in family.samples}


def backend_series(front: Front, backend: str) -> list[str]:
    return sorted({name for name, labels in samples(front) if ("backend", backend) in labels})


def ledger_mib(front: Front) -> dict[int, int]:
    """pid -> MiB with its context, as the simulated GPU's own files have it (live pids)."""
    out = {}
    for path in Path(front.sup.paths.sim_dir).glob("*.json"):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = int(entry["pid"])
        if os.path.exists(f"/proc/{pid}"):
            out[pid] = int(entry["mib"]) + CONTEXT_MIB
    return out


@pytest.fixture
@spawns
def front() -> Iterator[Front]:
    with serve_http([sim_backend("gone.model-1", 256, 64), sim_backend("kept", 256, 64),
                     server_backend("srv.calib-1", 700,
                                    args=("--tokens", "20", "--token-s", "0.05"))],
                    gpus="sim:8GiB") as f:
        yield f


def test_a_backend_removed_by_reload_leaves_no_series(front: Front) -> None:
    name = "gone.model-1"
    job = front.post("/v1/jobs", {"backend": name, "input": {}},
                     headers={"Prefer": "respond-async"}).json()
    assert front.wait_state(job["id"], "succeeded", "failed") == "succeeded"
    assert "vramtui_job_duration_seconds_count" in backend_series(front, name)
    assert "vramtui_backend_load_duration_seconds_count" in backend_series(front, name)
    assert front.post(f"/v1/backends/{name}/unload").status < 300
    wait_until(lambda: front.get(f"/v1/backends/{name}").json()["state"] == "cold", 20,
               f"{name} to unload")
    desc = Path(front.env["VRAMTUI_TEST_BACKENDS"])
    spec = yaml.safe_load(desc.read_text())
    gone_spec = next(b for b in spec["backends"] if b["name"] == name)
    spec["backends"] = [b for b in spec["backends"] if b["name"] != name]
    desc.write_text(yaml.safe_dump(spec))
    result = front.sup.reload()
    assert name in result.removed, result
    # Every series of it goes, its histograms with its counters and gauges: a scrape
    # follows the configured backends, or each rename by reload adds series for good.
    assert backend_series(front, name) == []
    assert "vramtui_backend_loads_total" in backend_series(front, "kept")
    # Configured again, it is a new backend: its counts start afresh (the engine forgot the
    # old ones: what it keeps follows the configured backends, not every name ever seen).
    desc.write_text(yaml.safe_dump({**spec, "backends": [*spec["backends"], gone_spec]}))
    assert name in front.sup.reload().added
    m = samples(front)
    assert m[("vramtui_backend_loads_total", (("backend", name),))] == 0
    assert m[("vramtui_jobs_total", (("backend", name), ("outcome", "succeeded")))] == 0
    assert ("vramtui_job_duration_seconds_count", (("backend", name),)) not in m  # (none ran)


def test_a_calibration_runs_memory_is_its_backends(front: Front) -> None:
    """While ``vramtui calibrate`` runs a model server alone on the GPU, the server's memory
    is its backend's, on /metrics and in ``backends``, as the simulated GPU's ledger says;
    and the backends' series add up to the GPU's ``workers`` figure."""
    name = "srv.calib-1"
    job_id = front.sup.calibrate(name, repeats=1, settle_s=3.0)
    truth = wait_until(lambda: (held := ledger_mib(front)) and 700 + CONTEXT_MIB in
                       held.values() and held, 20, "the server to load on the simulated GPU")

    def agrees() -> bool:
        m = samples(front)
        mine = m.get(("vramtui_backend_memory_bytes", (("backend", name),)))
        listed = front.get(f"/v1/backends/{name}").json()
        return (mine == sum(truth.values()) * MIB
                and listed["memory"]["observed_mib"] == sum(truth.values()))

    wait_until(agrees, 10, f"{name}'s memory on /metrics and /v1/backends/NAME to be "
               f"{sum(truth.values())} MiB, as the ledger says")
    m = samples(front)
    backends = sum(v for (n, _), v in m.items() if n == "vramtui_backend_memory_bytes")
    workers = sum(v for (n, _), v in m.items() if n == "vramtui_gpu_memory_workers_bytes")
    assert backends == workers == sum(truth.values()) * MIB
    # each backend's figures are labelled simulated, through its info series (sim:8GiB)
    assert {labels: v for (n, labels), v in m.items() if n == "vramtui_backend_info"} == {
        (("backend", b), ("simulated", "true")): 1.0
        for b in ("gone.model-1", "kept", "srv.calib-1")}
    assert front.wait_state(job_id, "succeeded", "failed", timeout=30) == "succeeded"
