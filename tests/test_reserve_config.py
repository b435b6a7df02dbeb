"""``engine.reserve`` in config.yaml is checked against the devices the engine finds: a reserve
that leaves nothing is one line and exit 2 at start (it used to start, then refuse every job,
and take preloads it would never run); one for a GPU not here is said, and ignored."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from serve_support import cli, make_env, new_root

from supervisor import Supervisor
from supervisor.engine import EngineConfig
from supervisor.paths import Paths


@pytest.mark.process
def test_a_reserve_that_leaves_nothing_is_refused_at_start() -> None:
    root = new_root()
    try:
        env = make_env(root)
        (root / "cfg").mkdir()
        (root / "cfg" / "config.yaml").write_text("engine:\n  reserve: {0: 100GiB}\n")
        done = cli(env, "--serve", "--gpus", "sim:8GiB", timeout=60)
        assert done.returncode == 2, (done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "keeps 102400 MiB free on GPU0, which has 8192 MiB" in lines[0]
        assert "Traceback" not in done.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_reserve_for_a_gpu_not_here_is_said_and_ignored(tmp_path: Path) -> None:
    """A config shared by machines, or run with --gpus naming fewer: a warning, not a
    refusal to start."""
    config = EngineConfig(gpu_reserve_mib={0: 1024, 5: 1024})
    paths = Paths(tmp_path / "cfg", tmp_path / "state", tmp_path / "run")
    sup = Supervisor.from_config(gpus="sim:8GiB", paths=paths, config=config, environ={})
    assert sup.engine.snapshot().notice is not None
    assert "engine.reserve names GPU5, which this engine does not have (it has GPU0): " \
        "ignored" in sup.engine.snapshot().notice
