"""A first file in ``backends.d`` that fails to load never takes the demo backends away.

A real embedded engine started with nothing configured (so on the simulated demo backends);
a broken file is dropped in and the descriptors reloaded, as ``L`` or ``vramtui reload``
would: the demo stays, and the reload's answer says why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_support import scratch_dir

from supervisor import Supervisor
from supervisor.backends.loader import load_backends
from supervisor.engine import EngineConfig
from supervisor.paths import Paths


def _demo_engine(root: Path) -> Supervisor:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    (root / "cfg" / "backends.d").mkdir(parents=True, exist_ok=True)
    return Supervisor.from_config(gpus="sim:24GiB", environ=env, paths=Paths.from_env(env),
                                  config=EngineConfig(reserve_mib=0, tick_s=0.1))


@pytest.mark.process
def test_a_broken_first_file_keeps_the_demo_and_the_reload_says_so() -> None:
    root = scratch_dir()
    sup = _demo_engine(root).start_in_thread()
    try:
        demo = {b.name for b in sup.snapshot().backends}
        assert len(demo) == 5 and "sdxl-sim" in demo
        assert "loaded the simulated demo backends" in (sup.snapshot().notice or "")
        overlay = root / "cfg" / "backends.d" / "zz-calibrated-sdxl-sim.yaml"
        overlay.write_text("name: sdxl-sim\noverlay: true\nvram: {peak: 10GiB}\n")
        assert sup.reload().changed  # a calibration's overlay over the demo
        broken = root / "cfg" / "backends.d" / "mine.yaml"
        broken.write_text("name: mine\nscript: x.py\n\tvram: 2GiB\n")  # a tab: bad YAML
        result = sup.reload()
        assert result.removed == () and result.added == () and result.changed == ()
        assert len(result.errors) == 1 and "mine.yaml" in result.errors[0]  # the overlay holds
        assert result.kept[0].startswith("the demo backends stay")
        assert {b.name for b in sup.snapshot().backends} == demo
        # A file that is valid YAML but whose one backend is invalid: the same.
        broken.write_text("name: mine\nvram: 2GiB\n")  # neither script nor command
        result = sup.reload()
        assert result.removed == () and result.kept and result.errors
        assert {b.name for b in sup.snapshot().backends} == demo
        # Something valid replaces the demo (and the demo's overlay goes with it).
        overlay.unlink()
        (root / "w.py").write_text("")
        broken.write_text(f"name: mine\nscript: {root / 'w.py'}\nvram: 2GiB\n")
        result = sup.reload()
        assert result.added == ("mine",) and len(result.removed) == 5 and not result.errors
        # what status says follows: the demo's notice went with the demo (it stayed for good)
        assert "demo" not in (sup.snapshot().notice or "")
    finally:
        sup.stop(timeout=30)


def test_a_configuration_that_disables_everything_is_not_replaced_by_the_demo(
        tmp_path: Path) -> None:
    (tmp_path / "off.yaml").write_text("name: unused\nscript: w.py\nenabled: false\n")
    loaded = load_backends([tmp_path])
    assert not loaded.demo and not loaded.backends and not loaded.errors
    (tmp_path / "bad.yaml").write_text("name: [\n")
    assert not load_backends([tmp_path]).demo  # at start: the errors, no demo
    assert load_backends([tmp_path], keep_demo=True).demo  # while it runs: it stays
    assert not load_backends([tmp_path / "gone.yaml"], keep_demo=True).demo  # named: must exist


@pytest.mark.process
def test_deleting_the_last_file_and_reloading_never_brings_the_demo_in() -> None:
    """The demo stands in only when nothing was configured at start; a reload that finds the
    files gone leaves no backends (it added the five simulated demo backends)."""
    root = scratch_dir()
    (root / "w.py").write_text("")
    mine = root / "cfg" / "backends.d" / "mine.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text(f"name: mine\nscript: {root / 'w.py'}\nvram: 2GiB\n")
    sup = _demo_engine(root).start_in_thread()
    try:
        assert [b.name for b in sup.snapshot().backends] == ["mine"]
        mine.unlink()
        result = sup.reload()
        assert result.removed == ("mine",) and result.added == () and not result.errors
        assert sup.snapshot().backends == ()
        notice = sup.snapshot().notice or ""
        assert "no backends: none defined in " in notice and "vramtui reload" in notice
    finally:
        sup.stop(timeout=30)


def test_a_named_empty_file_means_no_backends_and_says_how_to_add_one() -> None:
    """``--backends empty.yaml`` (or $VRAMTUI_BACKENDS) is a configuration: no demo."""
    root = scratch_dir()
    empty = root / "empty.yaml"
    empty.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    for backends, extra in (([empty], {}), ([], {"VRAMTUI_BACKENDS": str(empty)})):
        sup = Supervisor.from_config(gpus="sim:24GiB", backends=backends,
                                     environ={**env, **extra}, paths=Paths.from_env(env))
        try:
            assert sup.engine.backends == {} and not sup.engine.descriptors.demo
            notice = sup.engine.notice() or ""
            assert "no backends: none defined in " in notice and "empty.yaml" in notice
            assert "vramtui reload" in notice and "demo" not in notice
        finally:
            sup.engine.probe.close()
