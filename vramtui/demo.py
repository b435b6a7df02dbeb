"""The simulated demo as the faces use it at run time: how to tell that the engine loaded the
simulated demo backends, and the mixed workload that ``d`` (and the command palette) submits.

The engine loads the demo backends (``examples/demo/backends.yaml``) when nothing is configured
and says so in its snapshot's notice (``supervisor.facade``).  This module only reads snapshots
and submits through the facade (`supervisor.api.EngineAPI`); it imports no Textual, and the TUI
calls `submit_workload` from a thread worker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.api import EngineAPI
    from supervisor.snapshot import EngineSnapshot

# The engine says so in its snapshot's notice when it loaded the simulated demo backends
# (nothing was configured: supervisor.facade); the workload goes to those present.
DEMO_NOTICE = "simulated demo backends"
DEMO_BACKENDS = ("sdxl-sim", "llm-8b-sim", "whisper-sim", "flux-sim")

DemoRequest = tuple[str, dict[str, Any], int | None]
"""(backend, request, priority or None for the backend's)."""


def chat(question: str, max_tokens: int) -> dict[str, Any]:
    """A request for llm-8b-sim, which speaks OpenAI's chat (one canned word a step)."""
    return {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens}


# A mix that needs more than the 24 GiB GPU at once, so admission, the queue, affinity (a warm
# worker takes the next job for it) and eviction (flux-sim needs 18 GiB) all show within a
# minute.
DEMO_WORKLOAD: tuple[DemoRequest, ...] = (
    ("sdxl-sim", {"steps": 20, "step_s": 0.15}, None),
    ("llm-8b-sim", chat("What fits on a 24 GiB GPU?", 10), None),
    ("whisper-sim", {"steps": 8, "step_s": 0.15}, None),
    ("sdxl-sim", {"steps": 16, "step_s": 0.15}, None),
    ("flux-sim", {"steps": 25, "step_s": 0.2}, 5),
    ("llm-8b-sim", chat("Why does flux-sim wait?", 12), None),
    ("sdxl-sim", {"steps": 20, "step_s": 0.15}, None),
    ("whisper-sim", {"steps": 6, "step_s": 0.2}, 30),
    ("llm-8b-sim", chat("Which model is evicted next?", 8), None),
    ("flux-sim", {"steps": 20, "step_s": 0.2}, 0),
    ("sdxl-sim", {"steps": 12, "step_s": 0.15}, None),
    ("whisper-sim", {"steps": 8, "step_s": 0.1}, None),
)


def demo_loaded(snap: EngineSnapshot | None) -> bool:
    """The engine loaded the simulated demo backends (it says so in its notice)."""
    return (snap is not None and DEMO_NOTICE in (snap.notice or "")
            and any(snap.backend(n) is not None for n in DEMO_BACKENDS))


def demo_plan(snap: EngineSnapshot) -> list[DemoRequest]:
    """The demo workload's requests whose backend ``snap`` has, in order."""
    return [w for w in DEMO_WORKLOAD if snap.backend(w[0]) is not None]


@dataclass(frozen=True)
class DemoSubmitted:
    """What submitting a plan did: the accepted job ids, and one line per refusal."""

    plan: tuple[DemoRequest, ...]
    job_ids: tuple[str, ...]
    refused: tuple[str, ...]

    def summary(self) -> str:
        """The notice the TUI shows once the workload is in."""
        names = len({b for b, _r, _p in self.plan})
        text = (f"Submitted {len(self.job_ids)} demo jobs to {names} backends: watch "
                "admission, the queue, affinity and evictions in the GPU bar, the tables and "
                "the events.")
        if self.refused:
            text += f" {len(self.refused)} refused ({self.refused[0]})."
        return text


def submit_workload(api: EngineAPI, plan: list[DemoRequest]) -> DemoSubmitted:
    """Submit each request of ``plan`` (job metadata ``{"demo": n}``, from 1); a refusal is
    noted and the rest still go.  Blocks on the facade: call it from a thread."""
    submitted: list[str] = []
    refused: list[str] = []
    for i, (backend, request, priority) in enumerate(plan, 1):
        try:
            submitted.append(api.submit(backend, json.dumps(request).encode(),
                                        priority=priority, metadata={"demo": i}))
        except Exception as exc:  # noqa: BLE001 - reported in the summary
            refused.append(f"{backend}: {exc}")
    return DemoSubmitted(tuple(plan), tuple(submitted), tuple(refused))
