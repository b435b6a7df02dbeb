"""Sizes no device has (a typo's extra digits) are one line at load, not an engine that cannot
answer.

A newcomer's walk found that ``vram: {weights: 99999999999999999999GiB}`` loaded, and from
then on every ``vramtui backends`` and ``status`` failed with "the engine cannot serialise its
reply: Integer value out of range" (the control socket's integers are 64-bit); ``--gpus
sim:<20 digits>GiB`` did the same, and ``--gpus sim:<400 digits>`` died in a traceback
(OverflowError).  :func:`supervisor.units.parse_size` (and the simulated GPUs' spec) refuse
more than 1 PiB.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from serve_support import PYTHON, Served, cli, echo_backend, make_env, new_root, reap, start_serve
from spawning import spawns

from supervisor.units import MAX_SIZE_MIB, parse_size

ABSURD = "99999999999999999999GiB"


@pytest.mark.parametrize("value", [ABSURD, "1025TiB", MAX_SIZE_MIB + 1, float(2**60)])
def test_more_than_a_pebibyte_is_no_size(value: object) -> None:
    with pytest.raises(ValueError, match="more than 1 PiB"):
        parse_size(value)
    assert parse_size("1024TiB") == MAX_SIZE_MIB  # the largest there is still reads


@pytest.fixture(scope="module")
@spawns
def served() -> Iterator[Served]:
    root = new_root()
    absurd = {"name": "absurd", "script": echo_backend()["script"],
              "vram": {"weights": ABSURD, "activation": "1GiB"}}
    s = start_serve(make_env(root, [echo_backend(), absurd]), root)
    yield s
    reap(s)


@pytest.mark.process
def test_an_absurd_vram_figure_is_a_load_error_and_the_engine_still_answers(
        served: Served) -> None:
    for command in (("backends", "--json"), ("status", "--json")):
        done = cli(served.env, *command)
        assert done.returncode == 0, done.stderr
    names = [b["name"] for b in json.loads(cli(served.env, "backends", "--json").stdout)]
    assert names == ["echo"]
    assert "field 'vram.weights'" in served.stderr() and "more than 1 PiB" in served.stderr()


@pytest.mark.process
@pytest.mark.parametrize("spec", [f"sim:{ABSURD}", "sim:" + "9" * 400],
                         ids=["20-digit-GiB", "400-digit-MiB"])
def test_an_absurd_simulated_gpu_is_one_line_and_exit_2(spec: str) -> None:
    root = new_root()
    env = make_env(root)
    done = subprocess.run([PYTHON, "-m", "vramtui", "--serve", "--gpus", spec,
                           "--backends", env["VRAMTUI_TEST_BACKENDS"]],
                          env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "at most" in lines[0] and "1 PiB" in lines[0]


@pytest.mark.parametrize(("key", "value", "says"), [
    ("concurrency", 99999999999999999999, "too large (the most is 65536)"),
    ("priority", 99999999999999999999, "too large (the most is 1000000)"),
    ("priority", -(10**20), "too small (the least is -1000000)"),
])
def test_a_descriptors_absurd_concurrency_or_priority_is_one_error(
        tmp_path: Path, key: str, value: object, says: str) -> None:
    """Loaded as written, they showed as a concurrency no worker has (and a priority past
    the journal's 64-bit integers)."""
    from supervisor.backends.loader import load_backends

    file = tmp_path / "b.yaml"
    file.write_text(yaml.safe_dump({"backends": [
        {"name": "x", "command": ["/bin/true"], key: value},
        {"name": "fine", "command": ["/bin/true"], "keep_alive": "366d", "concurrency": 65536,
         "priority": 1_000_000}]}))
    result = load_backends([file], demo_fallback=False)
    assert list(result.backends) == ["fine"]
    assert len(result.errors) == 1
    line = str(result.errors[0])
    assert f"backend 'x': field '{key}': " in line and says in line and "\n" not in line


@pytest.mark.parametrize("value", ["9999h", "367d", 99999999, 99999999999999999999999])
def test_a_keep_alive_of_more_than_a_year_is_never(tmp_path: Path, value: object) -> None:
    """``keep_alive: 9999h`` is how many files say 'never': it loaded, and must still load
    (it was refused, and the backend was gone); past a float's range it is 'never' too."""
    import math

    from supervisor.backends.loader import load_backends

    file = tmp_path / "b.yaml"
    file.write_text(yaml.safe_dump({"backends": [
        {"name": "x", "command": ["/bin/true"], "keep_alive": value},
        {"name": "year", "command": ["/bin/true"], "keep_alive": "366d"}]}))
    result = load_backends([file], demo_fallback=False)
    assert not result.errors, result.errors
    assert result.backends["x"].keep_alive_s == math.inf
    assert result.backends["year"].keep_alive_s == 366 * 86400
