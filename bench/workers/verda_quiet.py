"""Run ``python -m verda_io`` with its logging at WARNING instead of its default INFO.

Usage: ``python verda_quiet.py SCRIPT --control-socket P --data-socket P --name N``.
verda-io calls ``logging.basicConfig(level=INFO)`` when ``verda_io.worker`` is imported, so the
levels are lowered after that import and before the worker runs.
"""

from __future__ import annotations

import logging
import runpy
import sys

import verda_io.worker  # noqa: F401 - configures logging at INFO as a side effect

logging.getLogger().setLevel(logging.WARNING)
logging.getLogger("verda_io").setLevel(logging.WARNING)
sys.argv = ["python -m verda_io", *sys.argv[1:]]
runpy.run_module("verda_io", run_name="__main__", alter_sys=True)
