"""The lab as a DAG, with a user's own course files (random weights, tiny sizes):
every file contract against the formulas for this run's P and N, targeted builds, reruns."""
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from kvlab.facts.formulas import fed_formulas
from kvlab.facts.results import RESULTS
from kvlab.facts.sheet import LAB_RESULTS
from kvlab.engine.tokenizer import load_tokenizer

from helpers import copy_workflow, course_config, dry_run_jobs, snakemake

@pytest.fixture(scope="module")
def built(course_build):
    return course_build


def load(workdir, name):
    return json.loads((workdir / "results" / f"{name}.json").read_text(encoding="utf-8"))


def test_prompt_contract(built, course):
    prompt = load(built, "prompt")
    assert set(prompt) == {"ids", "prompt_len", "n_docs", "cut_tokens", "text"}
    tok = load_tokenizer(course["tokenizer"])
    texts = [json.loads(line)["text"] for line in course["val_data"].read_text(encoding="utf-8").splitlines()[:3]]
    assert prompt["text"] == " ".join(texts)
    assert prompt["ids"] == [tok.bos_id] + tok.encode(" ".join(texts))[:64]
    assert prompt["prompt_len"] == 65 and prompt["n_docs"] == 3 and prompt["cut_tokens"] == 64


def test_same_and_count_contracts(built):
    same, count = load(built, "same"), load(built, "count")
    assert set(same) == {"same_ids", "ids", "prompt_len", "new_tokens"}
    assert same["same_ids"] is True and len(same["ids"]) == same["new_tokens"] == 10
    assert set(count) == {"prompt_len", "new_tokens", "fed_with_cache", "fed_without_cache"}
    p, n = count["prompt_len"], count["new_tokens"]
    assert (p, n) == (65, 10)
    assert count["fed_with_cache"] == p + n - 1
    assert count["fed_without_cache"] == p * n + n * (n - 1) // 2
    assert fed_formulas(p, n) == {"with_cache": count["fed_with_cache"], "without_cache": count["fed_without_cache"]}


def test_time_contract(built):
    timing, runs = load(built, "time"), load(built, "time_runs")
    assert set(timing) == {"with_cache_s", "without_cache_s", "speedup"}
    assert timing["speedup"] == pytest.approx(timing["without_cache_s"] / timing["with_cache_s"])
    for mode in ("with_cache", "without_cache"):
        samples, summary = runs["runs_s"][mode], runs["summary"][mode]
        assert len(samples) == summary["n"] >= 5  # the configured five, more while it was unstable
        assert timing[f"{mode}_s"] == summary["median_s"] == statistics.median(samples)
        assert summary["q1_s"] <= summary["median_s"] <= summary["q3_s"]
        assert summary["unstable"] == (summary["iqr_share"] >= 0.10)
    assert runs["speedup"]["low"] <= timing["speedup"] <= runs["speedup"]["high"]
    assert runs["torch_threads"] == 1 and runs["processor"] and runs["device"] == "cpu"


def test_kvbytes_contract(built):
    kv = load(built, "kvbytes")
    assert set(kv) == {"tokens", "measured_bytes", "formula_bytes", "k_shape"}
    assert kv["tokens"] == 12 and kv["k_shape"] == [1, 12, 2, 32]
    assert kv["measured_bytes"] == kv["formula_bytes"] == 2 * 4 * 12 * 2 * 32 * 4


def test_temp_contract(built):
    temp, side = load(built, "temp"), load(built, "temp_answers")
    assert set(temp) == {"0.3", "1.5"}
    for key, row in temp.items():
        assert set(row) == {"distinct"}
        answers = side["answers"][key]
        assert len(answers) == 6 and row["distinct"] == len(set(answers))
        assert not any("<|im_end|>" in a for a in answers)


def test_topp_contract(built):
    topp, sharp = load(built, "topp"), load(built, "topp_sharp")
    assert list(topp) == ["0.5", "0.9", "0.99"]
    assert 1 <= topp["0.5"] <= topp["0.9"] <= topp["0.99"]
    assert set(sharp["survivors"]) == set(topp)


def test_report_has_the_sections_and_the_numbers(built):
    report = (built / "results" / "report.md").read_text(encoding="utf-8")
    for heading in ("## KV 캐시", "## 온도", "## top-p"):
        assert heading in report
    timing, kv, count = load(built, "time"), load(built, "kvbytes"), load(built, "count")
    assert f"{timing['speedup']:.2f}" in report
    assert f"{kv['measured_bytes']:,}" in report
    assert f"{count['fed_without_cache']:,}" in report


def test_nothing_left_to_do_after_a_build(built, course):
    dry = snakemake(built, "-n", config=course_config(course))
    assert "Nothing to be done" in dry.stdout + dry.stderr


def test_topp_alone_runs_only_its_ancestors(tmp_path, course):
    jobs = dry_run_jobs(tmp_path, "results/topp.json", config=course_config(course))
    assert jobs == {"inspect_checkpoint": 1, "topp": 1}  # the pretrained checkpoint's inspection


def test_topp_alone_from_the_embedded_default(tmp_path):
    jobs = dry_run_jobs(tmp_path, "results/topp.json")
    assert set(jobs) == {"corpus", "tokenizer", "pretrain", "inspect_checkpoint", "topp"}, jobs


def test_changing_temperatures_reruns_only_temp_its_curve_and_report(built, course):
    # the curve is measured at the sheet's temperatures too, and its figure marks them
    config = course_config(course, temp={"temperatures": [0.3, 1.0]})
    assert dry_run_jobs(built, config=config) == {"temp": 1, "temp_curve": 1, "figure_temperature_effect": 1,
                                                  "report": 1, "beyond": 1, "lab_report": 1, "lab_tables": 1,
                                                  "explore": 1, "check": 1, "all": 1}


def test_params_compare_by_value(built, course):
    """Key order, comments and how a number is written are not changes: a dry run after
    rewriting the config that way has nothing to do."""
    config = course_config(course)
    # the same architecture with its keys in reverse order (kv_capacity's params hold this dict)
    config["extras"]["capacity"]["architectures"] = [dict(reversed(arch.items()))
                                                     for arch in config["extras"]["capacity"]["architectures"]]
    config["lab"] = dict(reversed(config["lab"].items()))
    assert dry_run_jobs(built, config=config) == {}
    # YAML as a person edits it: comments, 0.30 for 0.3, 1.50 for 1.5
    text = yaml.safe_dump(course_config(course), allow_unicode=True, sort_keys=False)
    assert "- 0.3\n" in text and "- 1.5\n" in text
    text = "# my copy of the lab's config\n" + text.replace("- 0.3\n", "- 0.30  # the sheet's lowest\n")
    text = text.replace("- 1.5\n", "- 1.50\n")
    edited = built / "edited.yaml"
    edited.write_text(text, encoding="utf-8")
    result = snakemake(built, "-n", "--configfile", str(edited))
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


# The results that hold no wall-clock time (kvlab.facts.results): two clean builds write them alike.
UNTIMED = [result.path for result in RESULTS.values() if not result.timed and "{" not in result.path]


def test_a_second_clean_build_matches_and_a_copied_one_reruns_nothing(tmp_path, course, course_build):
    """A second clean build of every untimed result the shared build (tests/conftest.py) has, in a
    copy of the workflow's own files, writes them byte for byte alike (the timed jobs are not run
    again: their files would differ anyway). Copied (times kept) to another folder, it has nothing
    to rerun: no job's recorded inputs name the folder the workflow was in."""
    targets = [path for path in UNTIMED if (course_build / path).exists()]
    assert {"results/same.json", "results/count.json", "results/kvbytes.json", "results/temp.json",
            "results/topp.json", "results/kv_waste.csv", "results/serving/serve_counts.csv"} <= set(targets)
    first = copy_workflow(tmp_path / "first" / "kvlab")
    config_file = tmp_path / "course.yaml"
    config_file.write_text(json.dumps(course_config(course), ensure_ascii=False), encoding="utf-8")
    command = [sys.executable, "-m", "snakemake", "--cores", "2", *targets, "--configfile", str(config_file)]
    build = subprocess.run(command, cwd=first, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    for path in targets:
        assert (first / path).read_bytes() == (course_build / path).read_bytes(), path

    second = tmp_path / "second" / "kvlab"
    shutil.copytree(first, second, symlinks=True)
    shutil.rmtree(first)
    dry = subprocess.run([*command, "-n"], cwd=second, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "Nothing to be done" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-3000:]


def test_dag_prints_a_graph(tmp_path, course):
    dag = snakemake(tmp_path, "--dag", config=course_config(course)).stdout
    assert dag.lstrip().startswith("digraph") and "topp" in dag and "report" in dag
    mermaid = snakemake(tmp_path, "--rulegraph", "mermaid-js", config=course_config(course)).stdout
    assert "flowchart" in mermaid or "graph" in mermaid


TINY_DEFAULT_MODEL = {
    "corpus": {"train_docs": 150, "val_docs": 10, "sft_examples": 120},
    "tokenizer": {"vocab_size": 400},
    "pretrain": {"steps": 4, "batch_size": 4, "seq_len": 64},
    "sft": {"steps": 3, "batch_size": 4, "seq_len": 64},
}


def reorder_model_block(config_text: str) -> str:
    """config.yaml with the keys of default_model.model in reverse order, a comment added to the
    block and the pretraining lr written with a trailing zero: the same values."""
    lines = config_text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("  model:")) + 1
    end = start
    while lines[end].startswith("    "):
        end += 1
    assert end - start >= 4, "default_model.model should spell out its architecture"
    block = ["    # the same architecture, keys in another order\n", *reversed(lines[start:end])]
    edited = "".join(lines[:start] + block + lines[end:])
    assert "    lr: 0.006\n" in edited
    return edited.replace("    lr: 0.006\n", "    lr: 0.0060\n", 1)


def test_embedded_default_builds_the_lab_report_with_a_tiny_budget(tmp_path):
    """World 1: no course files. The default's own rules (corpus, tokenizer, pretrain, sft) run with
    a tiny training budget, then the lab's report on their outputs (the lab and the extras it reads;
    every other extra is built from checkpoints alike, in the shared build of tests/conftest.py). Then
    config.yaml is edited without changing a value (keys reordered, a comment, 0.0060 for 0.006):
    nothing reruns."""
    config = course_config({}) | {"default_model": TINY_DEFAULT_MODEL}
    workdir = copy_workflow(tmp_path / "kvlab")
    snakefile = workdir / "Snakefile"
    report = "results/report.md"
    snakemake(workdir, report, config=config, snakefile=snakefile)
    default = workdir / "results" / "default"
    state = torch.load(default / "pretrain.pth", weights_only=True)
    assert all(t.dtype == torch.float16 for t in state.values())
    assert "model.layers.3.self_attn.k_norm.weight" in state and "lm_head.weight" in state
    metrics = json.loads((default / "pretrain_metrics.json").read_text())
    assert metrics["val_loss"] > 0
    val_lines = (default / "corpus" / "pretrain_val.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(val_lines) == 10
    prompt, count, kv = load(workdir, "prompt"), load(workdir, "count"), load(workdir, "kvbytes")
    assert prompt["text"] == " ".join(json.loads(line)["text"] for line in val_lines[:3])
    p, n = count["prompt_len"], count["new_tokens"]
    assert count["fed_with_cache"] == p + n - 1 and count["fed_without_cache"] == p * n + n * (n - 1) // 2
    assert kv["measured_bytes"] == kv["formula_bytes"] == 2 * 4 * 12 * 2 * 32 * 4
    assert load(workdir, "same")["same_ids"] is True
    assert "## top-p" in (workdir / "results" / "report.md").read_text(encoding="utf-8")

    config_yaml = workdir / "config.yaml"
    original = config_yaml.read_text(encoding="utf-8")
    config_yaml.write_text(reorder_model_block(original), encoding="utf-8")
    assert dry_run_jobs(workdir, report, config=config, snakefile=snakefile) == {}
    # while a real change retrains from pretrain on
    config_yaml.write_text(original.replace("    lr: 0.006\n", "    lr: 0.005\n", 1), encoding="utf-8")
    assert {"pretrain", "sft"} <= set(dry_run_jobs(workdir, report, config=config, snakefile=snakefile))


def test_the_sheets_report_waits_for_the_sheets_jobs_alone(tmp_path):
    """results/report.md is the prompt, the six steps and their checkpoints: nothing beyond the sheet
    (no sweep, batch, anatomy, serving or compare job) is planned for it, even with --forceall."""
    workdir = copy_workflow(tmp_path / "kvlab")
    jobs = dry_run_jobs(workdir, "--forceall", "results/report.md", config={})
    assert set(jobs) == {"corpus", "tokenizer", "pretrain", "sft", "inspect_checkpoint", "prompt", "model_card",
                         "same", "timing", "kvbytes", "temp", "topp", "report"}
    assert jobs["inspect_checkpoint"] == 2  # the pretrained and the SFT checkpoint


def test_english_report_keeps_the_headings(built, course, tmp_path):
    built = Path(shutil.copytree(built, tmp_path / "copy"))  # the shared build stays Korean
    config = course_config(course) | {"report": {"language": "en"}}
    # the sheet's report shows no figure: it alone is rendered again (the figures are the report beyond's)
    assert dry_run_jobs(built, "results/report.md", config=config) == {"report": 1}
    snakemake(built, "results/report.md", config=config)
    report = (built / "results" / "report.md").read_text(encoding="utf-8")
    for heading in ("## KV 캐시", "## 온도", "## top-p"):
        assert heading in report
    assert "The cache" in report and "캐시는" not in report
    assert f"{load(built, 'time')['speedup']:.2f}" in report


# --- the report's sentences follow the numbers ---------------------------------------------------

# The report's inputs that the lab sheet's steps write: {input name: file stem}, from the registry.
REPORT_INPUTS = {name: Path(RESULTS[name].path).stem
                 for name in (*LAB_RESULTS, "prompt", "model_card", "time_runs", "temp_answers", "topp_sharp")}


def render_altered(built, tmp_path, language, **changes):
    """Copy the lab's result files, apply `changes` ({input name: function(dict) -> dict}), render the report."""
    from kvlab.present.report import render_report

    paths = {}
    for name, stem in REPORT_INPUTS.items():
        data = load(built, stem)
        if name in changes:
            data = changes[name](data)
        paths[name] = tmp_path / f"{stem}.json"
        paths[name].write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    from helpers import ROOT

    return render_report(ROOT / "templates" / "report" / "report.md.j2", paths, language)


def reverse_topp(data):
    """Make the sharp prefix keep more candidates than the flat one at every p."""
    return {p: 2 for p in data}


def widen_sharp(data):
    return {**data, "survivors": {p: 50 for p in data["survivors"]}}


def spread_low_temperature(data):
    """Many distinct answers at the lowest temperature, fewer at the highest (the opposite of usual)."""
    keys = sorted(data, key=float)
    return {key: {"distinct": 6 - 4 * i // max(len(keys) - 1, 1)} for i, key in enumerate(keys)}


def slow_cache(data):
    return {**data, "with_cache_s": 2.0, "without_cache_s": 1.0, "speedup": 0.5}


def slow_cache_runs(data):
    """time_runs.json of slow_cache's time.json: steady runs, twice as slow with the cache."""
    from kvlab.facts import timing

    runs = {"with_cache": [1.98, 2.0, 2.02], "without_cache": [0.99, 1.0, 1.01]}
    summary = {mode: timing.summary(samples) for mode, samples in runs.items()}
    return {**data, "runs_s": runs, "summary": summary,
            "speedup": timing.ratio_interval(summary["without_cache"], summary["with_cache"])}


@pytest.mark.parametrize("language", ["en", "ko"])
def test_report_sentences_follow_reversed_data(built, tmp_path, language):
    usual = render_altered(built, tmp_path, language)
    reversed_ = render_altered(built, tmp_path, language, topp=reverse_topp, topp_sharp=widen_sharp,
                               temp=spread_low_temperature, time=slow_cache, time_runs=slow_cache_runs)
    if language == "en":
        assert 'more candidates survive after "민수는"' in usual or "depends on p" in usual
        assert 'At every p more candidates survive after "가람 마을의 특산물은"' in reversed_
        assert "The distinct answers fall as the temperature rises (6 → 2)" in reversed_
        assert "Even at 0.3 the 6 answers hold 6 distinct texts" in reversed_
        assert "made the generation slower: 0.50× (0.50–0.51×)" in reversed_ and "and the time" not in reversed_
        assert "near greedy" not in reversed_
    else:
        assert '모든 p에서 "가람 마을의 특산물은" 뒤에 "민수는" 뒤보다 후보가 더 많이 남습니다' in reversed_
        assert "오히려 줄었습니다(6 → 2)" in reversed_
        assert "0.3에서도 답 6개 가운데 서로 다른 답이 6개입니다" in reversed_
        assert "생성은 오히려 느려졌습니다: 0.50배(0.50–0.51배)" in reversed_ and "배, 시간을" not in reversed_


def test_report_shows_the_model_and_warns_about_a_random_one(built, tmp_path):
    """The course's checkpoints are random: the prompt's perplexity is near the vocabulary size, which the
    report (at the top) and `check` must say."""
    card = load(built, "model_card")
    assert card["prompt_perplexity"]["perplexity"] > card["prompt_perplexity"]["vocab_size"] / 4
    head = render_altered(built, tmp_path, "ko").split("## KV 캐시")[0]
    assert "> **경고:**" in head and "perplexity" in head and card["prompt_perplexity"]["alarm"] is True
    assert f"{card['prompt_perplexity']['perplexity']:.1f}" in head
    assert f"`pretrain` (minimind-3, 파라미터 {card['models']['pretrain']['parameters']:,}개)" in head
    # where each field came from: the report beyond the sheet says it
    beyond = (built / "results" / "beyond.md").read_text(encoding="utf-8")
    assert "`pretrain`, `sft`, minimind-3: 파일에서 읽음 vocab_size" in beyond  # alike: one line for both
    check = load(built, "check")
    assert set(card["warnings"]) <= set(check["warnings"]) and check["ok"] is True  # (with any timing's)
