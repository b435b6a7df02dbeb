"""scripts/policy-compare: two versions of the scheduler on the same random traces.

Its verdicts come from ``compare`` (pure: fed here with outcomes made by hand, a loop of
loads given up among them), its runs from real worker processes over ``git archive``'s copy
of a ref; the same scheduler on both sides must differ nowhere.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "policy-compare"


def script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("policy_compare", str(SCRIPT))
    spec = importlib.util.spec_from_loader("policy_compare", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def outcome(waits: dict[str, float], *, given_up: int = 0, unfinished: int = 0,
            over: bool = False) -> dict[str, Any]:
    return {"makespan": 10.0, "loads": 2, "given_up": given_up, "over": over,
            "unfinished": unfinished, "waits": waits,
            "priority": {"chat-0": 10, "chat-1": 10, "batch-0": 0}}


def test_compare_counts_the_top_prioritys_worst_wait_and_flags_what_the_old_did_not_do(
        ) -> None:
    pc = script()
    same = {"chat-0": 0.0, "chat-1": 0.2, "batch-0": 5.0}
    old = {"1": outcome(same), "2": outcome(same), "3": outcome(same), "4": outcome(same),
           "5": outcome(same, given_up=2)}
    new = {"1": outcome(same),
           "2": outcome({"chat-0": 0.0, "chat-1": 4.2, "batch-0": 1.0}),  # the chat waits
           "3": outcome({"chat-0": 0.0, "chat-1": 0.2, "batch-0": 9.0}, unfinished=1),
           "4": {"crash": "ZeroDivisionError: division by zero"},
           "5": outcome(same, given_up=2 + pc.LOOP + 1, over=True)}
    f, flags = pc.compare(old, new)
    # (seed 3's unfinished job has no wait to weigh: it is flagged, not counted)
    assert (f["traces"], f["differ"], f["better"], f["worse"]) == (5, 1, 0, 1)
    assert f["top_up"] == ["2 (+4.0 s)"] and f["low_up"] == []
    assert (f["top_old"], f["top_new"]) == pytest.approx((0.2, 4.2))
    assert flags == ["seed 3: 1 unfinished (old 0)",
                     "seed 4: crash: ZeroDivisionError: division by zero",
                     "seed 5: over-commit", f"seed 5: {2 + pc.LOOP + 1} loads given up (old 2)"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)


@pytest.mark.process
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_a_ref_is_its_supervisor_package_as_git_archive_gives_it(tmp_path: Path) -> None:
    root = Path(script().checkout("HEAD", tmp_path / "old"))
    assert root == tmp_path / "old"
    assert (root / "supervisor" / "scheduler" / "plan.py").is_file()
    assert script().checkout(".", tmp_path) == str(ROOT)


@pytest.mark.process
def test_the_same_scheduler_on_both_sides_differs_nowhere() -> None:
    done = run("--old", ".", "--new", ".", "--families", "alt,beside1", "--seeds", "3",
               "--first", "7")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()
            if line.split()[:1] in (["alt"], ["beside1"])}
    assert set(rows) == {"alt", "beside1"}, done.stdout
    assert all(row[1] == "0" for row in rows.values()), done.stdout
    assert "FLAG" not in done.stdout


@pytest.mark.process
@pytest.mark.parametrize("args, says", [
    (("--families", "nope"), "unknown family: nope"),
    (("--seeds", "0"), "--seeds and --jobs must be at least 1"),
    (("--old", "no-such-ref-here", "--seeds", "1", "--families", "alt"), "no such git ref"),
    (("--old", "FIRST", "--seeds", "1", "--families", "alt"), "has no supervisor/"),
])
def test_a_bad_argument_is_one_line_and_no_traceback(args: tuple[str, ...], says: str) -> None:
    if "FIRST" in args:  # the first commit, before there was a supervisor package
        if not (ROOT / ".git").exists():
            pytest.skip("not a git checkout")
        first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"],
                               capture_output=True, text=True, check=True).stdout.split()[0]
        args = tuple(first if a == "FIRST" else a for a in args)
    done = run(*args)
    assert done.returncode != 0
    assert says in done.stderr.strip().splitlines()[-1], done.stderr  # (after argparse's usage)
    assert "Traceback" not in done.stderr
