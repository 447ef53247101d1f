"""Where a step's time goes (kvlab.measure.anatomy) and the preallocated cache (kvlab.engine.model.StaticCache):
the same tokens as MiniMind's torch.cat cache, parts that add up, and the workflow's rule."""
import json

import pytest
import torch

from kvlab.engine import model as engine_model
from kvlab.engine import sampling
from kvlab.engine.model import StaticCache, kv_cache_bytes, left_pad
from kvlab.measure import anatomy, steps

from helpers import ROOT, course_config, dry_run_jobs, random_model, snakemake

PROMPT = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11]])


@pytest.fixture(scope="module")
def model():
    return random_model(0)


# --- the preallocated cache gives MiniMind's tokens ------------------------------------------------


def test_greedy_and_seeded_samples_are_identical_with_both_caches(model):
    greedy = {kv: model.generate(PROMPT, max_new_tokens=40, kv_cache=kv, **steps.GREEDY_NO_EOS) for kv in ("cat", "static")}
    assert torch.equal(greedy["cat"], greedy["static"])
    sampled = {}
    for kv in ("cat", "static"):
        torch.manual_seed(3)
        sampled[kv] = model.generate(PROMPT, max_new_tokens=30, temperature=1.2, top_p=0.9, num_return_sequences=6,
                                     eos_token_id=None, kv_cache=kv)
    assert torch.equal(sampled["cat"], sampled["static"]) and len(set(map(tuple, sampled["cat"].tolist()))) > 1


def test_padded_rows_and_half_precision_are_identical_too(model):
    ids, mask = left_pad([[1, 5, 6], [1, 7, 8, 9, 10, 11, 12]])
    both = [model.generate(ids, mask, max_new_tokens=12, kv_cache=kv, **steps.GREEDY_NO_EOS) for kv in ("cat", "static")]
    assert torch.equal(*both)
    half = random_model(1).half()
    both = [half.generate(PROMPT, max_new_tokens=12, kv_cache=kv, **steps.GREEDY_NO_EOS) for kv in ("cat", "static")]
    assert torch.equal(*both)


def test_the_static_cache_is_written_in_place_and_reserves_its_length(model):
    config = model.config
    cache = StaticCache(config, 1, 20, torch.float32, "cpu")
    before = [t.data_ptr() for t in cache.keys]
    with torch.inference_mode():
        out = model(PROMPT, past_key_values=cache, use_cache=True)
        model(PROMPT[:, :1], past_key_values=out.past_key_values, use_cache=True)
    assert out.past_key_values is cache and cache.length == PROMPT.shape[1] + 1
    assert [t.data_ptr() for t in cache.keys] == before  # never reallocated
    assert kv_cache_bytes(cache) == 20 * config.kv_bytes_per_token("float32")
    with torch.inference_mode():  # its positions hold MiniMind's cache after the same two calls, bit for bit
        reference = model(PROMPT, use_cache=True).past_key_values
        reference = model(PROMPT[:, :1], past_key_values=reference, use_cache=True).past_key_values
    for layer, (k, v) in enumerate(reference):
        assert torch.equal(cache.keys[layer][:, :cache.length], k) and torch.equal(cache.values[layer][:, :cache.length], v)
    with pytest.raises(ValueError, match="holds 20 positions; this call needs 29"):
        with torch.inference_mode():
            model(torch.ones(1, 20, dtype=torch.long), past_key_values=cache, use_cache=True)


def test_the_lab_keeps_minimind_s_cache_and_an_unknown_kind_is_refused(model):
    with steps.recording_forward(model) as calls:
        model.generate(PROMPT, max_new_tokens=3, **steps.GREEDY_NO_EOS)
    assert isinstance(calls.last_output.past_key_values, list)  # per layer (K, V), grown by torch.cat
    with pytest.raises(ValueError, match="kv_cache must be one of cat, static, got 'paged'"):
        model.generate(PROMPT, max_new_tokens=3, kv_cache="paged", **steps.GREEDY_NO_EOS)


# --- the anatomy of a step --------------------------------------------------------------------------


def test_labelled_parts_come_off_again(model):
    originals = (engine_model.apply_rope, engine_model.extend_cache, StaticCache.write, sampling.pick)
    with anatomy.labelled_parts(model):
        assert "forward" in vars(model.model.layers[0].mlp.up_proj)
    assert (engine_model.apply_rope, engine_model.extend_cache, StaticCache.write, sampling.pick) == originals
    assert not any("forward" in vars(module) for module in model.modules())


def test_runs_of_gives_each_operator_its_run_its_part_and_its_self_time():
    events = [  # (start, end, name) as the profiler's raw events give them, in no order
        (15, 45, "aten::mm"), (0, 100, "kvlab::step|model|0"), (12, 48, "aten::linear"), (10, 50, "kvlab::matmul"),
        (60, 70, "aten::add"), (62, 66, "aten::empty"), (200, 210, "aten::outside"),
        (300, 340, "kvlab::step|shrunk|0"), (305, 315, "kvlab::norm"), (306, 314, "aten::rsqrt"),
    ]
    runs = anatomy.runs_of(events)
    assert set(runs) == {"step|model|0", "step|shrunk|0"}  # aten::outside belongs to no run
    mine = runs["step|model|0"]
    # linear's self time is 36 less its child mm's 30; add's 10 less empty's 4
    assert mine.self_ns == {**dict.fromkeys(anatomy.COMPUTE_PARTS, 0), "matmul": 6 + 30, "other_operators": 6 + 4}
    assert mine.names == {"aten::linear": 1, "aten::mm": 1, "aten::add": 1, "aten::empty": 1}
    assert mine.calls == 2  # linear and add, called from Python; mm and empty from inside operators
    assert runs["step|shrunk|0"].self_ns["norm"] == 8 and runs["step|shrunk|0"].calls == 1


def test_the_shrunk_copy_has_the_model_s_architecture_at_tiny_widths(model):
    shrunk = anatomy.shrunk_copy(model)
    kept = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size", "qk_norm",
            "tie_word_embeddings", "max_position_embeddings")
    assert all(getattr(shrunk.config, key) == getattr(model.config, key) for key in kept)
    assert (shrunk.config.hidden_size, shrunk.config.head_dim, shrunk.config.intermediate_size) == (8, 2, 8)
    assert anatomy.shrunk_copy(model).state_dict()["lm_head.weight"].equal(shrunk.state_dict()["lm_head.weight"])
    assert shrunk.lm_head.weight.dtype == model.lm_head.weight.dtype


def test_fixed_cost_and_computation_add_up_to_each_step(model):
    result = anatomy.step_anatomy(model, PROMPT[0].tolist(), 40, warmup=1, repeats=4, rounds=2, profile_repeats=3,
                                  device="cpu")
    assert result["context_tokens"] == PROMPT.shape[1] + 40 - 1  # the last step attends over P + N - 1
    assert result["steps"] == list(anatomy.STEPS) and result["profiled_pairs"] == 6
    for name in anatomy.STEPS:
        step = result[name]
        assert step["step"]["n"] == step["fixed"]["n"] == 4 and len(step["compute_pairs_ms"]) == 6
        assert len(step["step_usage"]["wall_s"]) == len(step["fixed_usage"]["wall_s"]) == 4  # each call's clocks
        assert step["step"]["contention"] == step["fixed"]["contention"] == "judged"
        paired = [a - b for a, b in zip(step["step_samples_s"], step["fixed_samples_s"])]  # each call, the copy's next
        assert step["width_ms"] == pytest.approx(1e3 * (sorted(paired)[1] + sorted(paired)[2]) / 2)
        assert step["ms"]["fixed"] == pytest.approx(step["step_ms"] - step["width_ms"])
        assert sorted(step["compute_pairs_ms"])[2] <= step["compute_ms"] <= sorted(step["compute_pairs_ms"])[3]
        assert sum(step["ms"][part] for part in anatomy.COMPUTE_PARTS) == pytest.approx(max(step["compute_ms"], 0.0))
        assert sum(step["ms"].values()) == pytest.approx(step["sum_ms"])
        assert sum(step["shares"].values()) == pytest.approx(1.0, abs=1e-9)
        # the computation's parts are clipped at zero; the fixed cost is the step less the widths' cost, a
        # difference of two timings that a busy machine can take below zero: its sign is not asserted
        assert all(step["ms"][part] >= 0 for part in anatomy.COMPUTE_PARTS)
        assert step["sum_of_parts_off"] == pytest.approx(step["sum_ms"] / step["step_ms"] - 1)
        assert step["same_operators"] and step["adds_up"] == (abs(step["sum_of_parts_off"]) <= anatomy.ADDS_UP_WITHIN)
        assert step["operator_calls"] > 4 * model.config.num_hidden_layers
    assert result["without_cache"]["ms"]["cache"] == 0  # no cache, nothing appended
    # no timing is asserted against another (a neighbour on the core can reorder any two): that the uncached
    # step computes more than the cached one is for the report to judge, from the build's own numbers


def test_a_copy_that_calls_other_operators_never_adds_up(model, monkeypatch):
    # with one KV head, repeat_kv's reshape is a view where the model's is a copy: other operators
    monkeypatch.setitem(anatomy.SHRUNK_SIZES, "num_key_value_heads", 1)
    result = anatomy.step_anatomy(model, PROMPT[0].tolist(), 4, warmup=0, repeats=1, rounds=1, profile_repeats=1,
                                  device="cpu")
    assert not result["with_cache_cat"]["same_operators"] and not result["with_cache_cat"]["adds_up"]


def test_the_cache_curve_times_a_step_at_each_context_and_checks_the_tokens(model):
    curve = anatomy.cache_curve(model, PROMPT[0].tolist(), [16, 40, 100], warmup=0, repeats=3, max_seconds=0,
                                new_tokens=12, samples=3, seed=0, device="cpu")
    assert curve["identical_tokens"] == {"greedy": True, "sampled": True, "new_tokens": 12, "sampled_rows": 3,
                                         "all": True}
    for kv in ("cat", "static"):
        assert len(curve[kv]["step_ms"]) == 3 and all(row["n"] >= 3 for row in curve[kv]["steps"])
        assert [len(clocks["wall_s"]) for clocks in curve[kv]["usage"]] == [row["n"] for row in curve[kv]["steps"]]
        assert all(row["contention"] == "judged" for row in curve[kv]["steps"])
        assert all(q1 <= m <= q3 for q1, m, q3 in zip(curve[kv]["q1_ms"], curve[kv]["step_ms"], curve[kv]["q3_ms"]))
    ratio = curve["cat_over_static"]
    assert ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert ratio["contended"] == (curve["cat"]["steps"][-1]["contended"] or curve["static"]["steps"][-1]["contended"])
    assert curve["static_reserved_bytes"] == 100 * model.config.kv_bytes_per_token("float32")
    assert "compiled" not in curve  # compiling is off unless asked for
    with pytest.raises(ValueError, match=r"extras.step_anatomy.contexts: 5000 tokens, more than the model's "
                                         r"max_position_embeddings \(1024\)"):
        anatomy.cache_curve(model, PROMPT[0].tolist(), [5000], 0, 1, 0, 4, 1, 0, "cpu")


def test_a_static_cache_copied_from_one_prefill_steps_as_one_it_prefilled_itself(model):
    """The curve prefills each context once for both caches: the StaticCache gets MiniMind's K and V
    copied in, and its step gives what a StaticCache filled by its own prefill gives."""
    ids = PROMPT.repeat(1, 5)
    held = ids.shape[1] - 1
    own = StaticCache(model.config, 1, ids.shape[1], torch.float32, "cpu")
    with torch.inference_mode():
        model(ids[:, :held], past_key_values=own, use_cache=True)
        own.length = held
        expected_out, expected_token = model.decode_step(ids, None, own, True, **anatomy.GREEDY_KNOBS)
    shared = anatomy._prefilled(model, ids)
    for kv_cache in ("static", "cat"):
        out, token = anatomy._decode_step_at(model, ids, kv_cache, "cpu", shared)()
        assert torch.equal(token, expected_token), kv_cache
        torch.testing.assert_close(out.logits, expected_out.logits, rtol=0, atol=1e-5)
    assert [k.shape[1] for k, _ in shared] == [held] * model.config.num_hidden_layers  # left as it was


def test_a_compiled_step_is_timed_apart_from_its_compiling():
    # one layer and one context: compiling takes some 15 s on two cores
    model = random_model(0, num_hidden_layers=1)
    curve = anatomy.cache_curve(model, PROMPT[0].tolist(), [24], warmup=0, repeats=2, max_seconds=0, new_tokens=4,
                                samples=1, seed=0, device="cpu", compile_mode="default")
    compiled = curve["compiled"]
    assert compiled["mode"] == "default" and compiled["same_next_token"] == [True]
    assert max(compiled["max_logit_difference"]) < 1e-3
    # the first call compiles (seconds); the steps timed after it do not
    assert all(first > 10 * row["median_s"] for first, row in zip(compiled["first_call_s"], compiled["steps"]))
    ratio = curve["static_over_compiled"]
    assert ratio["low"] <= ratio["ratio"] <= ratio["high"]
    assert "forward" not in vars(model)  # the eager forward is back


# --- the workflow's rule ---------------------------------------------------------------------------


def test_the_build_writes_the_anatomy_and_its_report_section(course_build):
    data = json.loads((course_build / "results" / "step_anatomy.json").read_text(encoding="utf-8"))
    for name in ("with_cache_cat", "with_cache_static", "without_cache"):
        assert sum(data["anatomy"][name]["shares"].values()) == pytest.approx(1.0)
        assert data["anatomy"][name]["step"]["n"] >= 2
    assert data["curve"]["identical_tokens"]["all"] is True
    beyond = (course_build / "results" / "beyond.md").read_text(encoding="utf-8")
    section = beyond.split("## 한 스텝의 해부")[1].split("\n## ")[0]
    cached = data["anatomy"]["with_cache_cat"]
    assert f"| {100 * cached['shares']['fixed']:.0f}% |" in section
    assert "같은 토큰을 냈습니다" in section and "](figures/step_anatomy.png)" in section
    # a header and a separator line, then one row per step, at most six columns
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert len(table) == 5 and table[1].startswith("|---|") and table[2].startswith("| 캐시 사용 (torch.cat)")
    assert all(line.count("|") == 7 for line in table)


@pytest.mark.parametrize("language", ["ko", "en"])
def test_a_compiled_curve_gets_its_paragraph_from_its_numbers(course_build, tmp_path, language):
    from kvlab.facts import timing
    from kvlab.present.report import render_report
    from test_workflow import REPORT_INPUTS

    results = course_build / "results"
    data = json.loads((results / "step_anatomy.json").read_text(encoding="utf-8"))
    fixed_s = data["anatomy"]["with_cache_static"]["ms"]["fixed"] / 1e3
    compiled = timing.summary([fixed_s / 10 * f for f in (0.9, 1.0, 1.1)])  # far under the eager fixed cost
    data["curve"]["compiled"] = {**anatomy._summarised([compiled], data["curve"]["contexts"]), "mode": "default",
                                 "first_call_s": [15.0], "same_next_token": [True], "max_logit_difference": [2e-6]}
    data["curve"]["kinds"].append("compiled")
    data["curve"]["static_over_compiled"] = timing.ratio_interval(data["curve"]["static"]["steps"][-1], compiled)
    paths = {name: results / f"{stem}.json" for name, stem in REPORT_INPUTS.items()}
    paths["step_anatomy"] = tmp_path / "step_anatomy.json"
    paths["step_anatomy"].write_text(json.dumps(data), encoding="utf-8")
    paths["figure_step_anatomy"] = results / "figures" / "step_anatomy.png"
    report = render_report(ROOT / "templates" / "report" / "beyond.md.j2", paths, language)
    ratio = data["curve"]["static_over_compiled"]
    if language == "ko":
        assert "eager보다 빠릅니다" in report and "(컴파일 15.0초는 따로 셈)" in report
    else:
        assert "faster than eager at 64 tokens" in report and "(compiling took 15.0 s, kept apart)" in report
    assert f"**{ratio['ratio']:.2f}×** ({ratio['low']:.2f}–{ratio['high']:.2f}×)" in report


def test_changing_a_knob_reruns_only_the_anatomy_and_its_readers(course_build, course):
    config = course_config(course)
    config["extras"] = {**config["extras"], "step_anatomy": {**config["extras"]["step_anatomy"], "contexts": [16, 80]}}
    # the sheet's report reads no result beyond the sheet: neither it nor check (which reads it) reruns
    assert dry_run_jobs(course_build, config=config) == {"step_anatomy": 1, "figure_step_anatomy": 1, "beyond": 1,
                                                        "lab_report": 1, "all": 1}
    config["extras"]["step_anatomy"]["contexts"] = [64, 16]
    result = snakemake(course_build, "-n", config=config, check=False)
    assert result.returncode == 1
    assert (result.stdout + result.stderr).strip().splitlines()[-1] == (
        "config key 'extras.step_anatomy.contexts': [64, 16] should rise, each length once")


def test_the_anatomy_runs_the_rounds_its_budget_holds_and_says_which_it_cut(model):
    """With a budget it cannot meet, the anatomy runs its three kept rounds (their profiled pairs and
    unprofiled calls, no more) and records the rest as cut; without one it runs every round."""
    from kvlab.facts.budget import Budget

    args = (model, PROMPT[0].tolist(), 4)
    knobs = dict(warmup=0, repeats=5, rounds=5, profile_repeats=1, device=torch.device("cpu"))
    cut = anatomy.step_anatomy(*args, **knobs, budget=Budget(1e-6))
    assert cut["rounds"] == anatomy.ROUNDS_KEPT and cut["profiled_pairs"] == anatomy.ROUNDS_KEPT
    assert [c["rung"] for c in cut["budget"]["cut"]] == ["round 4", "round 5"]
    assert all(len(cut[name]["step_samples_s"]) == anatomy.ROUNDS_KEPT for name in anatomy.STEPS)
    full = anatomy.step_anatomy(*args, **knobs)
    assert full["rounds"] == 5 and full["budget"]["cut"] == []
