"""Several models in one DAG (rules/compare.smk): one job per model, the lab's own first, every row's
counts against its formulas, staleness per model, and bad entries refused before any job runs."""
import json
from collections import Counter

import pandas as pd
import pytest

from kvlab.engine.checkpoint import save_checkpoint
from kvlab.config import ConfigError, check_entries
from kvlab.facts.formulas import fed_formulas

from helpers import course_config, random_model, snakemake

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 400}
WIDE = {"hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 400}


def compare_config(course, entries):
    return {**course_config(course), "compare": entries}


def dry_run_jobs(workdir, *targets, config):
    result = snakemake(workdir, "-n", *targets, config=config)
    jobs = Counter()
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith("rule ") or line.startswith("localrule "):
            jobs[line.split()[1].rstrip(":")] += 1
    return dict(jobs)


@pytest.fixture(scope="module")
def compared(tmp_path_factory, course):
    workdir = tmp_path_factory.mktemp("compare")
    entries = [{"name": "tiny", "architecture": TINY},
               {"name": "wide", "architecture": WIDE},
               {"name": "sft-copy", "checkpoint": str(course["sft"])}]
    snakemake(workdir, "results/compare.csv", "results/figures/compare.png", config=compare_config(course, entries))
    return workdir, entries


def test_one_row_a_model_the_lab_first_and_counts_equal_the_formulas(compared):
    workdir, entries = compared
    table = pd.read_csv(workdir / "results" / "compare.csv")
    assert list(table["name"]) == ["lab", "tiny", "wide", "sft-copy"]
    assert list(table["weights"]) == ["checkpoint", "random (cost only)", "random (cost only)", "checkpoint"]
    for row in table.to_dict("records"):
        assert (row["prompt_len"], row["new_tokens"]) == (20, 6)
        formulas = fed_formulas(20, 6)
        assert row["fed_with_cache"] == row["formula_with_cache"] == formulas["with_cache"]
        assert row["fed_without_cache"] == row["formula_without_cache"] == formulas["without_cache"]
        assert row["same_ids"]
        assert row["kv_bytes_per_token_measured"] == row["kv_bytes_per_token_formula"] == \
            2 * row["layers"] * row["kv_heads"] * row["head_dim"] * 4
        assert row["speedup"] == pytest.approx(row["without_cache_s"] / row["with_cache_s"])
        assert row["token_ratio"] == pytest.approx(formulas["without_cache"] / formulas["with_cache"])
    wide = table.set_index("name").loc["wide"]
    assert (wide["layers"], wide["heads"], wide["kv_heads"], wide["head_dim"]) == (2, 4, 2, 24)
    assert table.set_index("name").loc["tiny", "parameters"] < wide["parameters"]


def test_each_cost_file_holds_the_timing_runs_and_the_fit(compared):
    workdir, _ = compared
    cost = json.loads((workdir / "results" / "compare" / "wide" / "cost.json").read_text())
    assert cost["name"] == "wide" and cost["dtype"] == "float32" and cost["device"] == "cpu"
    assert (cost["warmup"], cost["repeats"]) == (0, 1)
    assert cost["ttft_with_cache_s"] > 0 and cost["tpot_without_cache_s"] > 0 and cost["predicted_speedup"] > 0
    assert set(cost) >= {"fit_fixed_s", "fit_per_token_s", "fit_r2", "kv_bytes_per_token_formula"}
    assert set(cost) >= {"contended", "contention", "with_cache_cpu_share", "without_cache_cpu_share"}
    assert len(cost["generate_usage"]["with_cache"]["wall_s"]) == cost["with_cache_n"]


def test_the_figure_is_a_png(compared):
    workdir, _ = compared
    assert (workdir / "results" / "figures" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_adding_a_model_runs_only_its_job_and_the_collectors(compared, course):
    workdir, entries = compared
    added = compare_config(course, entries + [{"name": "extra", "architecture": TINY}])
    jobs = dry_run_jobs(workdir, "results/compare.csv", "results/figures/compare.png", config=added)
    assert jobs == {"compare_cost": 1, "compare_table": 1, "figure_compare": 1}
    assert "results/compare/extra/cost.json" in snakemake(workdir, "-n", "results/compare.csv", config=added).stdout


def test_removing_a_model_reruns_no_other_models_job(compared, course):
    workdir, entries = compared
    removed = compare_config(course, entries[:1] + entries[2:])
    jobs = dry_run_jobs(workdir, "results/compare.csv", "results/figures/compare.png", config=removed)
    assert jobs == {"compare_table": 1, "figure_compare": 1}


def test_a_checkpoint_with_too_small_a_vocabulary_fails_its_job_naming_the_entry(tmp_path, course):
    small = tmp_path / "small_vocab.pth"
    save_checkpoint(random_model(0, vocab_size=8), small)
    config = compare_config(course, [{"name": "small-vocab", "checkpoint": str(small)}])
    result = snakemake(tmp_path, "results/compare/small-vocab/cost.json", config=config, check=False)
    assert result.returncode != 0
    line = next(line for line in (result.stdout + result.stderr).splitlines() if "kvlab error" in line)
    assert "compare entry 'small-vocab'" in line and "vocab_size is 8" in line
    assert not (tmp_path / "results" / "compare" / "small-vocab" / "cost.json").exists()


@pytest.mark.parametrize("entries, settings, message", [
    ([{"name": "a b", "architecture": TINY}], {}, "compare[0]'.name: 'a b' must be letters"),
    ([{"name": "x", "architecture": TINY}, {"name": "x", "architecture": TINY}], {}, "(x).name: 'x' is used twice"),
    ([{"name": "lab", "architecture": TINY}], {}, "'lab' is the lab's own model"),
    ([{"name": "sft", "checkpoint": "sft.pth"}], {}, "'sft' names the lab's SFT checkpoint"),
    ([{"name": "x", "architecture": TINY, "checkpoint": "a.pth"}], {}, "exactly one of 'checkpoint' and 'architecture' (found both)"),
    ([{"name": "x"}], {}, "(found neither)"),
    ([{"name": "x", "architecture": {**TINY, "num_key_value_heads": 3, "num_attention_heads": 4}}], {},
     "(x).architecture.num_key_value_heads: 3 does not divide num_attention_heads=4"),
    ([{"name": "x", "architecture": {**TINY, "hidden_size": 30, "num_attention_heads": 4, "num_key_value_heads": 2}}],
     {}, "(x).architecture.num_attention_heads: 4 does not divide hidden_size=30"),
    ([{"name": "x", "architecture": {**TINY, "head_dim": 15}}], {}, "(x).architecture.head_dim: 15 must be even"),
    ([{"name": "x", "architecture": {"hidden_size": 32}}], {}, "(x).architecture: missing num_hidden_layers"),
    ([], {"prompt_tokens": 500}, "'extras.compare.prompt_tokens': 500 is longer than the lab's prompt"),
])
def test_bad_entries_are_one_line_naming_the_entry_and_key(entries, settings, message):
    with pytest.raises(ConfigError) as err:
        check_entries(entries, settings.get("prompt_tokens", 20), 65)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_bad_entry_stops_the_workflow_before_any_job(tmp_path, course):
    config = compare_config(course, [{"name": "x", "architecture": {**TINY, "num_key_value_heads": 3}}])
    result = snakemake(tmp_path, "-n", config=config, check=False)
    assert result.returncode != 0
    assert "config key 'compare[0]' (x).architecture.num_key_value_heads: 3 does not divide" in result.stdout + result.stderr
    missing = compare_config(course, [{"name": "gone", "checkpoint": str(tmp_path / "nowhere.pth")}])
    result = snakemake(tmp_path, "-n", config=missing, check=False)
    assert "config key 'compare[0]' (gone).checkpoint: file not found" in result.stdout + result.stderr
