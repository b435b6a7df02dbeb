"""``engine.reserve`` in config.yaml is checked against the devices the engine finds: a GPU it
does not have, or a reserve that leaves nothing, is one line and exit 2 at start (it used to
start, then refuse every job, and take preloads it would never run)."""

from __future__ import annotations

import shutil

import pytest
from serve_support import cli, make_env, new_root


@pytest.mark.process
@pytest.mark.parametrize(("reserve", "said"), [
    ("{0: 100GiB}", "keeps 102400 MiB free on GPU0, which has 8192 MiB"),
    ("{5: 1GiB}", "names GPU5, which this engine does not have (it has GPU0)"),
])
def test_a_reserve_the_devices_cannot_keep_is_refused_at_start(reserve: str, said: str) -> None:
    root = new_root()
    try:
        env = make_env(root)
        (root / "cfg").mkdir()
        (root / "cfg" / "config.yaml").write_text(f"engine:\n  reserve: {reserve}\n")
        done = cli(env, "--serve", "--gpus", "sim:8GiB", timeout=60)
        assert done.returncode == 2, (done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], lines
        assert "Traceback" not in done.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
