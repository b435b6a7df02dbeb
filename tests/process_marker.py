"""The ``process`` marker, kept honest: a test that starts a process must carry it.

``pytest -m "not process"`` is the fast tier (the engine's rules on fakes, the pure modules,
the protocol, the TUI on fixed scenes).  So that the tier stays what it says, every way this
interpreter starts a process (``subprocess``, asyncio's subprocesses, ``fork``,
``posix_spawn``) is watched while the tests run: a test without the marker that starts one —
in its body, in a fixture, or on an engine's thread — fails, naming what it started.

A fixture that starts processes is declared with ``spawning.spawns`` (under
``@pytest.fixture``): every test that uses it, directly or through another fixture, is
marked for it.

``VRAMTUI_PROCESS_AUDIT=FILE`` records the node ids of such tests in FILE instead of failing
them (to find which tests to mark).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from spawning import declared

MARKER = "process"
_state = threading.local()
_current: list[pytest.Item | None] = [None]
_violations: dict[str, list[str]] = {}
_audit = os.environ.get("VRAMTUI_PROCESS_AUDIT")
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(getattr(item, "module", None), "__name__", "").rsplit(".", 1)[-1]
        names = getattr(item, "fixturenames", ())
        if any(declared(module, n) for n in names):
            item.add_marker(MARKER)


def _check(what: str) -> None:
    item = _current[0]
    if item is None or item.get_closest_marker(MARKER) is not None:
        return
    if getattr(_state, "inside", False):  # a spawn inside a spawn (posix_spawn in Popen)
        return
    _violations.setdefault(item.nodeid, []).append(what)
    if _audit is None:
        raise RuntimeError(f"{item.nodeid} starts a process ({what}) but is not marked "
                           f"@pytest.mark.{MARKER}")


def _wrap(owner: Any, name: str) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    def watched(*args: Any, **kwargs: Any) -> Any:
        what = name
        if name == "_execute_child" and len(args) > 1:
            argv = args[1]
            what = " ".join(map(str, argv))[:120] if isinstance(argv, list | tuple) \
                else str(argv)[:120]
        _check(what)
        _state.inside = True
        try:
            return original(*args, **kwargs)
        finally:
            _state.inside = False

    setattr(owner, name, watched)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: starts real processes (workers, the CLI, "
                            "an engine, another user); the fast tier is -m 'not process'")
    _wrap(subprocess.Popen, "_execute_child")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        _wrap(os, name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                            ) -> Iterator[None]:
    _current[0] = item
    try:
        yield
    finally:
        _current[0] = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    outcome = yield
    report = outcome.get_result()
    found = _violations.get(item.nodeid)
    if not found:
        return
    if _audit is not None:
        if call.when == "teardown":
            with open(_audit, "a", encoding="utf-8") as f:
                f.write(f"{item.nodeid}\t{found[0]}\n")
        return
    if call.when == "call" and report.passed:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} started a process ({found[0]}) without the "
                           f"@pytest.mark.{MARKER} marker")
