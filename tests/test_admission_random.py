"""A short fixed-seed run of the randomized admission checker (``tests/admission_checker.py``;
``scripts/admission-soak`` runs it long): random GPUs, backends in every descriptor form,
honest and dishonest, random traces with cancels, the simulated device read independently."""

from __future__ import annotations

import pytest
from admission_checker import FORMS, make_scenario, run_scenario

# Seeds picked to cover one GPU and two, every descriptor form, and a liar that does
# over-commit the device (seed 114) besides one that is caught before it can.
CASES = [(1, True), (5, True), (3, False), (114, False)]


@pytest.mark.process
@pytest.mark.parametrize(("seed", "honest"), CASES, ids=[f"seed{s}" for s, _ in CASES])
def test_admission_holds_in_a_random_scenario(seed: int, honest: bool) -> None:
    scenario = make_scenario(seed, honest=honest)
    verdict = run_scenario(scenario)
    assert verdict.ok, (scenario.describe(), verdict.problems)
    assert sum(verdict.outcomes.values()) == len(scenario.jobs)


def test_the_fixed_seeds_cover_every_descriptor_form() -> None:
    forms = {b.form for seed, honest in CASES for b in make_scenario(seed, honest=honest).backends}
    assert forms == set(FORMS)
