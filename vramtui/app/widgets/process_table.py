"""`ProcessTable`: every process on each GPU, ours named by backend, or foreign."""

from __future__ import annotations

from rich.text import Text

from supervisor.snapshot import EngineSnapshot

from .. import fmt
from .row_table import Col, RowTable


class ProcessTable(RowTable):
    """Every process on each GPU (as nvitop lists them): ours named by backend, or foreign."""

    COLUMNS = (
        Col("gpu", "GPU", 3),
        Col("pid", "PID", 7),
        Col("user", "User", 8),
        Col("mem", "Memory", 7),
        Col("owner", "Backend", None),
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._owners: dict[str, str | None] = {}

    def owner(self, key: str) -> str | None:
        return self._owners.get(key)

    def rows_for(self, snap: EngineSnapshot, query: str) -> list[tuple[str, dict[str, object]]]:
        rows = []
        self._owners = {}
        style = fmt.SIM_FIGURE if snap.simulated else ""
        for g in snap.gpus:
            for p in g.processes:
                owner = p.backend
                if not fmt.matches(query, str(p.pid), p.user, owner or "others", p.name):
                    continue
                key = f"{g.index}:{p.pid}"
                self._owners[key] = owner
                rows.append((key, {
                    "gpu": str(g.index), "pid": str(p.pid), "user": p.user,
                    "mem": Text(fmt.mib(p.used_mib, compact=True), style=style),
                    "owner": Text(owner) if owner else Text(f"others: {p.name or '?'}",
                                                            style=fmt.SEG_FOREIGN),
                }))
        return rows
