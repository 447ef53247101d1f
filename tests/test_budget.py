"""Work sized to the model (kvlab.facts.budget): a ladder measured from its cheapest rung up, cut where
the next rung's predicted seconds no longer fit; the sweep walking its Ns under a budget, and its report
saying what it left out."""
import json
import shutil

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvlab.facts.budget import KEPT_RUNGS, Budget, scaled
from kvlab.measure.curves import cost_sweep

from helpers import random_model


class Clock:
    """A clock that moves only when a rung is measured: as many seconds as the rung says it took."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@settings(max_examples=300, deadline=None)
@given(costs=st.lists(st.floats(0.01, 50), min_size=1, max_size=8), seconds=st.floats(0.01, 200))
def test_a_ladder_keeps_what_fits_and_cuts_the_rest_in_order(costs, seconds):
    """Rungs are measured in order while the next one's prediction fits what is left: the first
    KEPT_RUNGS always, none measured after one cut, every cut rung recorded, and (predictions being
    exact here) the measured ones never overrun the budget past the kept ones."""
    clock = Clock()
    budget = Budget(seconds, clock=clock)

    def measure(rung):
        clock.now += costs[rung]
        return rung, costs[rung]

    measured = budget.take(list(range(len(costs))), measure, lambda rung, done: costs[rung])
    assert measured == list(range(len(measured)))  # a prefix, in order
    assert len(measured) >= min(KEPT_RUNGS, len(costs))
    assert [cut["rung"] for cut in budget.cut] == [str(r) for r in range(len(measured), len(costs))]
    if len(measured) > KEPT_RUNGS:
        assert sum(costs[: len(measured)]) <= seconds + 1e-9
    if budget.cut:
        first = budget.cut[0]
        assert first["predicted_s"] == costs[len(measured)] and sum(costs[: len(measured)]) + first["predicted_s"] > seconds
    record = budget.record()
    assert record["budget_s"] == seconds and record["spent_s"] == sum(costs[: len(measured)])


def test_no_budget_measures_every_rung():
    budget = Budget(None)
    assert budget.take([1, 2, 3], lambda rung: (rung * 10, 1e9), lambda rung, done: 1e9) == [10, 20, 30]
    assert budget.cut == []


def test_scaled_follows_the_work():
    assert scaled(2.0, 100, 250) == 5.0 and scaled(2.0, 0, 5) == 2.0


def test_the_sweep_leaves_out_what_its_budget_cannot_hold():
    """A sweep with a budget it cannot meet still measures its two smallest Ns (rows as without a
    budget, the formulas held), and records each larger N as cut with a prediction that grows with N."""
    model = random_model(0)
    prompt = [1] + list(range(5, 25))
    args = (model, prompt, [3, 2, 5, 9], 1, 1, None, 1, 0.05, torch.device("cpu"))
    rows, runs = cost_sweep(*args, budget=Budget(1e-6))
    assert [row["new_tokens"] for row in rows] == [2, 3]
    cut = runs["budget"]["cut"]
    assert [c["rung"] for c in cut] == ["N=5", "N=9"] and cut[0]["predicted_s"] < cut[1]["predicted_s"]
    assert all(row["fed_with_cache"] == row["formula_with_cache"] for row in rows)
    full, _ = cost_sweep(*args)
    assert [row["new_tokens"] for row in full] == [2, 3, 5, 9]
    assert [row["fed_without_cache"] for row in full[:2]] == [row["fed_without_cache"] for row in rows]


@pytest.mark.parametrize("language", ["en", "ko"])
def test_the_report_says_which_ns_the_budget_left_out(course_build, tmp_path, language):
    """beyond.md's cost curves name every N the budget cut, the budget and the first one's prediction;
    with nothing cut it says nothing of a budget."""
    from test_clocks import render

    results = tmp_path / "results"
    shutil.copytree(course_build / "results", results)
    assert "extras.sweep.budget_s" not in render(results, "beyond", language)
    runs = json.loads((results / "sweep_runs.json").read_text(encoding="utf-8"))
    runs["budget"] = {"budget_s": 60, "spent_s": 31.0,
                      "cut": [{"rung": "N=128", "predicted_s": 240.4, "left_s": 29.0},
                              {"rung": "N=256", "predicted_s": 1100.0, "left_s": 29.0}]}
    (results / "sweep_runs.json").write_text(json.dumps(runs), encoding="utf-8")
    beyond = render(results, "beyond", language)
    assert "`extras.sweep.budget_s`" in beyond and "N=128, N=256" in beyond and "240" in beyond and "60" in beyond
