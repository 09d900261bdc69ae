"""``hpp plan`` is never worse than the project's own solvers at the same budget.

On every bundled GPU scenario but the 4,096-GPU one, ``hpp plan --work-limit U`` (deterministic) returns a plan whose
predicted time is at most, and a bound at least, what ``hpp instances solve NAME --solver S --work-limit U`` returns
for each bundled solver S: with a budget the planner runs each exact solver from the same start as a run of it
alone, and the same cost-model local search after it (:func:`hpp.formulation.composition.solve.solve`, its
``portfolio``), so each of those runs' answers is among its own.
"""

from __future__ import annotations

import json

import pytest

from hpp.cli import main
from hpp.formulation.composition.settings import SOLVER_NAMES
from hpp.scenarios import SCENARIOS

#: The bundled GPU scenarios (``hpp scenarios``) but opt350-4096-6types (minutes of candidates alone).
SCENARIOS_7 = [n for n, s in SCENARIOS.items() if not s.device_types and n != "opt350-4096-6types"]
WORK = "0.06"         # work units: small (the test's time), above the default 0.05 (the budgeted path)


def _json(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out[out.index("{"):])


@pytest.mark.parametrize("name", SCENARIOS_7)
def test_plan_is_never_worse_than_each_bundled_solver_at_the_same_budget(name, capsys):
    assert len(SCENARIOS_7) == 7
    assert main(["plan", "--scenario", name, "--no-baselines", "--work-limit", WORK, "--workers", "1", "--json",
                 "--quiet"]) == 0
    plan = _json(capsys)["search"]
    for solver in SOLVER_NAMES:
        assert main(["instances", "solve", name, "--solver", solver, "--work-limit", WORK, "--workers", "1",
                     "--json"]) == 0
        got = _json(capsys)
        assert plan["objective_s"] <= got["objective_s"] * (1 + 1e-12), (solver, plan, got)
        assert plan["bound_s"] >= got["bound_s"] * (1 - 1e-12), (solver, plan, got)
