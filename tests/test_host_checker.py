"""A short fixed-seed run of the admission checker's host mode (``tests/host_checker.py``;
``scripts/host-soak`` runs it long): workers holding real memory on a small host budget, and
/proc, read on its own, as the oracle."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from host_checker import FORMS, ProcOracle, make_host_scenario, run_host_scenario
from waiting import wait_until

from supervisor.gpu.host import ENGINE_MARK

SEED = 2  # two learned ("none") backends beside a declared one, on a budget that fits one


@pytest.mark.process
def test_the_workers_pss_never_exceeds_the_host_budget() -> None:
    scenario = make_host_scenario(SEED, jobs=8)
    verdict = run_host_scenario(scenario)
    assert verdict.ok, (scenario.describe(), verdict.problems)
    assert verdict.outcomes == {"succeeded": 8}
    assert verdict.max_pss_mib > 20  # the workers really held memory, the oracle saw it


@pytest.mark.process
def test_the_oracle_sees_memory_over_the_budget() -> None:
    env = {**os.environ, ENGINE_MARK: str(os.getpid())}
    hold = "b = bytearray(30 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n" \
           "print(1, flush=True)\ninput()\n"
    child = subprocess.Popen([sys.executable, "-c", hold], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline()
        with ProcOracle(os.getpid()) as oracle:
            oracle.budget_mib = 10
            wait_until(lambda: oracle.over, deadline=10, what="the oracle to see 30 MiB")
        assert max(mib for _t, mib in oracle.over) >= 30
    finally:
        child.kill()
        child.wait()


def test_the_fixed_seed_has_learned_and_declared_backends() -> None:
    forms = {b.form for b in make_host_scenario(SEED, jobs=8).backends}
    assert "none" in forms and forms & (set(FORMS) - {"none"})
