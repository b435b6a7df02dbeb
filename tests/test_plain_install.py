"""``pip install -e .`` without the ``[http]`` extra, then ``vramtui`` (the README's first
command): the engine's settings are read without aiohttp, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

WITHOUT_AIOHTTP = """
import argparse, sys
sys.modules["aiohttp"] = None  # as if the [http] extra were not installed
from supervisor.paths import Paths
from vramtui.serve import engine_config
args = argparse.Namespace(max_queue=None)
print(engine_config(args, Paths.from_env({"HOME": sys.argv[1]})).max_queue_depth)
"""


@pytest.mark.process
def test_the_engine_settings_are_read_without_the_http_extra(tmp_path: object) -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_AIOHTTP, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "512"
