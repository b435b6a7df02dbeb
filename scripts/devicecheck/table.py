"""The rows of the device check, and the table they print as.

A row is one claim checked: its name, a status, what was measured, what was expected and,
for a row that did not pass, why (in words a reader can act on).  Standard library only.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

OK, FAIL, INFO, NOT_RUN = "ok", "FAIL", "info", "not run"
STATUSES = (OK, FAIL, INFO, NOT_RUN)

# The rows each stage must answer (a row missing at the end is "not run", with the reason).
STAGE_ROWS: dict[str, tuple[str, ...]] = {
    "doctor": ("doctor",),
    "probe": ("probe: context", "probe: weights", "probe: activation", "probe: released"),
    "calibrate": ("calibrate: context", "calibrate: weights", "calibrate: activation",
                  "calibrate: confidence"),
    "server": ("server: request", "server: tree measured", "server: activation",
               "server: stopped", "server calibrate: context", "server calibrate: weights",
               "server calibrate: activation", "server calibrate: confidence"),
    "trace": ("trace: jobs", "trace: out of memory", "trace: used ≤ total", "screenshot"),
}
# calibrate, server and trace share one engine (`vramtui --serve`), in one child process
ENGINE_PARTS = ("calibrate", "server", "trace")


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    measured: str = ""
    expected: str = ""
    why: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"bad row status {self.status!r}")

    @property
    def failed(self) -> bool:
        """A row that did not pass: failed, or never run (a check that did not happen)."""
        return self.status in (FAIL, NOT_RUN)

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Row:
        if not isinstance(data, dict):
            raise ValueError(f"a row must be an object, not {type(data).__name__}")
        return cls(**{k: str(data.get(k, "")) for k in ("check", "status", "measured",
                                                         "expected", "why")})


def ok(check: str, measured: str, expected: str, why: str = "") -> Row:
    return Row(check, OK, measured, expected, why)


def fail(check: str, measured: str, expected: str, why: str) -> Row:
    return Row(check, FAIL, measured, expected, why)


def info(check: str, measured: str, expected: str = "", why: str = "") -> Row:
    return Row(check, INFO, measured, expected, why)


def verdict(check: str, passed: bool, measured: str, expected: str, why: str) -> Row:
    """``ok`` when ``passed`` (``why`` kept only for a failure)."""
    return ok(check, measured, expected) if passed else fail(check, measured, expected, why)


def not_run(checks: Iterable[str], why: str) -> list[Row]:
    return [Row(c, NOT_RUN, "", "", why) for c in checks]


def complete(rows: Sequence[Row], expected: Sequence[str], why: str) -> list[Row]:
    """``rows`` plus a ``not run`` row for every expected check that has none."""
    seen = {r.check for r in rows}
    return list(rows) + not_run([c for c in expected if c not in seen], why)


def _cell(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width) or [""]


def render(rows: Sequence[Row], *, title: str = "vramtui device check",
           widths: tuple[int, int, int, int] = (30, 7, 42, 38)) -> str:
    """The table, then one paragraph per row that did not pass (and per note), then a verdict."""
    heads = ("check", "result", "measured", "expected")
    line = "+".join("-" * (w + 2) for w in widths)
    out = [title, line, "|".join(f" {h:<{w}} " for h, w in zip(heads, widths, strict=True)),
           line]
    for row in rows:
        cells = [_cell(v, w) for v, w in zip((row.check, row.status, row.measured, row.expected),
                                             widths, strict=True)]
        for i in range(max(len(c) for c in cells)):
            out.append("|".join(f" {(c[i] if i < len(c) else ''):<{w}} "
                                for c, w in zip(cells, widths, strict=True)))
    out.append(line)
    explained = [r for r in rows if r.why and (r.failed or r.status == INFO)]
    for row in explained:
        label = "note" if row.status == INFO else row.status
        out.append(textwrap.fill(f"{row.check} [{label}]: {row.why}", 100,
                                 subsequent_indent="    "))
    failed = [r for r in rows if r.failed]
    passed = sum(r.status == OK for r in rows)
    if failed:
        out.append(f"device-check: FAILED — {len(failed)} of {len(rows)} rows did not pass "
                   f"({', '.join(r.check for r in failed)})")
    else:
        out.append(f"device-check: passed — {passed} rows ok")
    return "\n".join(out)


def dump(rows: Sequence[Row]) -> str:
    return json.dumps([r.to_json() for r in rows], indent=1)
