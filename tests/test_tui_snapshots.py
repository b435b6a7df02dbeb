"""Snapshot tests of every screen at 80x24, 120x40 and 160x48, fed by the fixed source.

The data (clock, GPUs, backends, jobs, log) is fixed, so a changed SVG means the UI changed.
Update the baselines in tests/__snapshots__/ with ``pytest tests/test_tui_snapshots.py
--snapshot-update`` after looking at the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tui_scenes import SCENES, SIZES, make_app

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_SCENES = ("dashboard", "job", "backend", "help", "submit", "calibration",
                   "processes", "reload")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("scene", SNAPSHOT_SCENES)
def test_screen(snap_compare: Any, scene: str, size: tuple[int, int], tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> None:
    shoot(snap_compare, scene, size, tmp_path, monkeypatch)


# Where a newcomer tripped (issue 29): events that came while the processes were shown, and
# the demo's toast beside them; at the smallest and the largest size only (they are slow).
@pytest.mark.parametrize("size", (SIZES[0], SIZES[-1]), ids=lambda s: f"{s[0]}x{s[1]}")
def test_events_after_processes(snap_compare: Any, size: tuple[int, int], tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    shoot(snap_compare, "events-after-processes", size, tmp_path, monkeypatch)


# Issue 29: the whole reason a job waits can be read at every size (under the jobs table).
@pytest.mark.parametrize("size", (SIZES[0], SIZES[-1]), ids=lambda s: f"{s[0]}x{s[1]}")
def test_job_note(snap_compare: Any, size: tuple[int, int], tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    shoot(snap_compare, "job-note", size, tmp_path, monkeypatch)


def shoot(snap_compare: Any, scene: str, size: tuple[int, int], tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the fixed data names examples/demo/backends.yaml
    monkeypatch.setenv("HOME", str(tmp_path))  # paths on screen: ~/.local/state/vramtui/...
    spec = next(s for s in SCENES if s.name == scene)
    app = make_app(tmp_path, simulated=spec.simulated, gpus=spec.gpus,
                   calibrating=spec.calibrating)
    assert snap_compare(app, run_before=spec.run, terminal_size=size)
