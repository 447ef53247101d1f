"""Work sized to the model (kvlab.facts.budget): a ladder measured from its cheapest rung up, cut where
the next rung's predicted seconds no longer fit; the sweep walking its Ns under a budget, and its report
saying what it left out."""
import json
import shutil

import time

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
    assert budget.record() == {"budget_s": seconds, "cut": budget.cut}
    assert budget.spent() == sum(costs[: len(measured)])


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
def test_the_report_says_what_each_budget_left_out(course_build, tmp_path, language):
    """beyond.md's cost curves and batch sections name every rung their budget cut, the budget's key and
    seconds and the first one's prediction; with nothing cut they say nothing of a budget."""
    from test_clocks import render

    results = tmp_path / "results"
    shutil.copytree(course_build / "results", results)
    before = render(results, "beyond", language)
    assert "budget_s" not in before
    for name, cut in (("sweep_runs", ["N=128", "N=256"]), ("batch_runs", ["B=32", "B=64"]),
                      ("temp_curve_answers", ["T=0.2", "T=0.4"]), ("latency", ["without_cache timed generations 3-3"])):
        runs = json.loads((results / f"{name}.json").read_text(encoding="utf-8"))
        runs["budget"] = {"budget_s": 60, "spent_s": 31.0,
                          "cut": [{"rung": rung, "predicted_s": 240.4 * (1 + index), "left_s": 29.0}
                                  for index, rung in enumerate(cut)]}
        (results / f"{name}.json").write_text(json.dumps(runs), encoding="utf-8")
    beyond = render(results, "beyond", language)
    for key, cut in (("sweep", "N=128, N=256"), ("batch", "B=32, B=64"), ("temp_curve", "T=0.2, T=0.4"),
                     ("latency", "without_cache timed generations 3-3")):
        assert beyond.split(f"`extras.{key}.budget_s`")[1].split("\n")[0].count(cut) == 1, key
    assert beyond.count("240") >= 2 and "60" in beyond


def test_the_batch_bench_leaves_out_the_sizes_its_budget_cannot_hold():
    """With a budget it cannot meet, llama-batched-bench's table keeps B = 1 and 2 in both modes (rows
    mode by mode, each row's tokens held against its prompt alone) and records the larger Bs as cut."""
    from kvlab.measure.batch import batch_bench

    model = random_model(0)
    prompts = [[1] + list(range(5 + i, 13 + i)) for i in range(8)]
    rows, runs = batch_bench(model, prompts[0], prompts, 3, [1, 2, 4, 8], 0, 1, 0.05, 1.0, torch.device("cpu"),
                             Budget(1e-6))
    assert [(row["mode"], row["B"]) for row in rows] == [("shared", 1), ("shared", 2), ("distinct", 1), ("distinct", 2)]
    assert all(row["same_as_single"] for row in rows)
    assert [cut["rung"] for cut in runs["budget"]["cut"]] == ["B=4", "B=8"]


def test_the_temperature_curve_thins_its_grid_to_its_budget_and_keeps_the_sheets_points(tokenizer_dir):
    """Within a budget it cannot meet, the curve measures the sheet's temperatures (at least two points)
    and cuts the rest, recorded; its rows are by temperature and each point is the one a full curve
    measures (every temperature reseeded as the lab does)."""
    from kvlab.engine.tokenizer import load_tokenizer
    from kvlab.measure.curves import coarse_first, temp_curve

    grid = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]
    order = coarse_first(grid, [1.0])
    assert order[:3] == [1.0, 0.5, 2.0] and sorted(order) == grid
    assert order.index(1.5) < order.index(0.75)  # every 4th point before every 2nd
    tokenizer = load_tokenizer(tokenizer_dir)
    model = random_model(2, vocab_size=tokenizer.vocab_size)
    args = (model, tokenizer, "가람 마을의 특산물은?", grid, [1.0, 1.5], 4, 5, 0, torch.device("cpu"))
    rows, answers, budget = temp_curve(*args, budget=Budget(1e-6))
    assert [row["temperature"] for row in rows] == [1.0, 1.5] and list(answers) == ["1.0", "1.5"]
    assert [cut["rung"] for cut in budget["cut"]] == [f"T={t}" for t in order if t not in (1.0, 1.5)]
    full, full_answers, nothing = temp_curve(*args)
    assert nothing["cut"] == [] and [row["temperature"] for row in full] == grid
    assert [row for row in full if row["temperature"] in (1.0, 1.5)] == rows
    assert {key: full_answers[key] for key in answers} == answers


def test_the_latency_split_plans_its_runs_from_its_warm_up():
    """With a budget it cannot meet, each mode times LATENCY_RUNS generations (planned from its warm-up)
    and records the rest as cut; without one, `repeats` (or more while unstable)."""
    from kvlab.measure.curves import LATENCY_RUNS, step_latency

    model = random_model(0)
    args = (model, [1] + list(range(5, 25)), 4, 1, 4, 0.05, torch.device("cpu"))
    tight = step_latency(*args, budget=Budget(1e-6))
    for label in ("with_cache", "without_cache"):
        assert len(tight[label]["generate_samples_s"]) == LATENCY_RUNS
    assert [cut["rung"] for cut in tight["budget"]["cut"]] == [
        f"with_cache timed generations {LATENCY_RUNS + 1}-4", f"without_cache timed generations {LATENCY_RUNS + 1}-4"]
    assert tight["warmups"] == {"with_cache": 0, "without_cache": 0}  # the probe was their only warm-up
    full = step_latency(*args)
    assert all(len(full[label]["generate_samples_s"]) >= 4 for label in ("with_cache", "without_cache"))
    assert full["budget"]["cut"] == [] and full["warmups"] == {"with_cache": 1, "without_cache": 1}
    # the prefill alone, both modes in alternation, for the TTFTs' difference
    from kvlab.measure.curves import PREFILL_PAIRS
    alone = full["prefill_alone"]
    assert alone["pairs"] == PREFILL_PAIRS and alone["with_cache"]["n"] == alone["without_cache"]["n"] == PREFILL_PAIRS
    assert alone["ratio"]["low"] <= alone["ratio"]["ratio"] <= alone["ratio"]["high"]
    roomy = step_latency(*args, budget=Budget(3600))
    assert roomy["warmups"] == {"with_cache": 1, "without_cache": 1} and roomy["budget"]["cut"] == []


def test_a_probe_of_the_first_steps_predicts_a_whole_generation():
    """Without the cache every step feeds the whole sequence: a probe's fit over its first steps
    predicts that generation dearer than the cached one, and about what it then takes."""
    from kvlab.measure.curves import PROBE_STEPS, predicted_generation_s
    from kvlab.measure.steps import GREEDY_NO_EOS, prompt_tensor

    model = random_model(0)
    new_tokens = 3 * PROBE_STEPS
    prompt = prompt_tensor(model, [1] + [5 + i % 50 for i in range(160)], new_tokens, torch.device("cpu"))
    with_cache = predicted_generation_s(model, prompt, new_tokens, use_cache=True)
    without = predicted_generation_s(model, prompt, new_tokens, use_cache=False)
    assert 0 < with_cache < without
    began = time.perf_counter()
    model.generate(prompt, max_new_tokens=new_tokens, use_cache=False, **GREEDY_NO_EOS)
    assert without / 4 < time.perf_counter() - began < without * 4


def test_runs_after_a_first_one_fill_what_is_left_and_keep_the_least():
    clock = iter([0.0, 10.0, 10.0, 10.0]).__next__
    budget = Budget(40, clock=clock)  # made at 0 s; 10 s spent by the first run: 30 s left
    assert budget.runs_after_first(10.0, 5, 2, "repeats") == 4 and budget.cut[0]["rung"] == "repeats 5-5"
    assert Budget(40, clock=iter([0.0, 39.0]).__next__).runs_after_first(10.0, 5, 2, "repeats") == 2
    assert Budget(None).runs_after_first(10.0, 5, 2, "repeats") == 5


def test_a_compared_model_within_its_budget_times_two_runs_a_mode_and_its_row_says_so():
    from kvlab.facts.compare import compare_rows
    from kvlab.measure.cost import measure_cost

    model = random_model(0)
    args = (model, [1] + list(range(5, 25)), 6, 1, 3, 0.05, 4, 0, torch.device("cpu"))
    tight = measure_cost(*args, budget=Budget(1e-9))
    assert {label: len(runs) for label, runs in tight["generate_samples_s"].items()} == {"with_cache": 2,
                                                                                        "without_cache": 2}
    [row] = compare_rows({"lab": tight}, {"lab": "checkpoint"})
    assert row["runs_cut"] == "with_cache timed generations 3-3; without_cache timed generations 3-3"
    assert row["budget_s"] == 1e-9 and "budget" not in row
    [free] = compare_rows({"lab": measure_cost(*args)}, {"lab": "checkpoint"})
    assert free["runs_cut"] == "" and free["budget_s"] is None
