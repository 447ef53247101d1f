"""Every timing with its spread, and every sentence true to its numbers: the statistics and the rule
for an unstable timing (kvlab.facts.timing), repeats that adapt to the machine, the report's words on
data made to hit each case (ties, overlaps, proportions, number formats) in both languages, and a
timed job sharing its core with other work, which the results, the report and `check` must flag."""
import json
import math
import shutil
import subprocess
import sys
import time

import pytest

from kvlab.grade import check
from kvlab.facts import timing

from helpers import ROOT, course_config, snakemake

# --- the statistics and the rule -------------------------------------------------------------------


def test_summary_keeps_the_quartiles_and_flags_a_wide_spread():
    steady = timing.summary([1.00, 1.01, 0.99, 1.02, 1.00])
    assert steady["n"] == 5 and steady["median_s"] == 1.00 and not steady["unstable"]
    assert steady["iqr_s"] == pytest.approx(steady["q3_s"] - steady["q1_s"]) and steady["std_s"] > 0
    noisy = timing.summary([1.0, 1.3, 0.8, 1.1, 1.5])
    assert noisy["iqr_share"] == pytest.approx((1.3 - 1.0) / 1.1) and noisy["unstable"]
    # the rule is IQR / median >= 10%, exactly at the edge included
    edge = timing.summary([0.95, 0.95, 1.0, 1.05, 1.05])
    assert edge["iqr_share"] == pytest.approx(0.10) and edge["unstable"]


def test_the_speedups_interval_comes_from_the_quartiles_of_both_modes():
    fast, slow = timing.summary([0.9, 1.0, 1.1]), timing.summary([3.6, 4.0, 4.4])
    ratio = timing.ratio_interval(slow, fast)
    assert ratio["ratio"] == pytest.approx(4.0)
    assert ratio["low"] == pytest.approx(3.8 / 1.05) and ratio["high"] == pytest.approx(4.2 / 0.95)
    assert timing.overlap((1, 2), (2, 3)) and not timing.overlap((1, 2), (2.1, 3))


def test_repeats_adapt_to_a_steady_or_a_noisy_machine():
    """A steady machine stops at the configured repeats; a noisy one repeats until its spread is
    under the rule or its time is up (a clock that advances by each run's own length)."""
    def runner(durations):
        clock = {"now": 0.0, "left": list(durations)}

        def run():
            clock["now"] += clock["left"].pop(0)

        return run, lambda: clock["now"]

    run, clock = runner([1.0, 1.01, 0.99] + [1.0] * 50)
    assert len(timing.repeat(run, 3, max_seconds=100, clock=clock)) == 3
    run, clock = runner([1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0] + [1.0] * 50)
    samples = timing.repeat(run, 3, max_seconds=100, clock=clock)
    assert 3 < len(samples) < 20 and not timing.summary(samples)["unstable"]
    run, clock = runner([1.0, 2.0] * 50)  # never steady: the cap ends it
    samples = timing.repeat(run, 3, max_seconds=10, clock=clock)
    assert sum(samples) >= 10 and sum(samples) < 13 and timing.summary(samples)["unstable"]
    run, clock = runner([1.0, 2.0] * 50)
    assert len(timing.repeat(run, 3, max_seconds=0, clock=clock)) == 3  # 0: never past the repeats


# --- a timed job that shares its core ----------------------------------------------------------------

# Bursts of work and rest about as long as a timed run (0.1 to 0.3 s here): some runs share the core
# throughout, some not at all, most in part, so their times spread (shorter bursts would average out
# within every run and only slow them all alike).
BURN = """
import random, time
random.seed(0)
while True:
    end = time.perf_counter() + random.uniform(0.1, 0.4)
    while time.perf_counter() < end:
        pass
    time.sleep(random.uniform(0.1, 0.4))
"""


@pytest.fixture(scope="module")
def contended(tmp_path_factory, course_build, course):
    """A copy of the shared build, then step 3 timed again on CPU 0 while bursts of other work run on
    CPU 0, and what reads it (the report, check) made again."""
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed: the timed job cannot share a core on purpose")
    workdir = shutil.copytree(course_build, tmp_path_factory.mktemp("contended") / "run")
    config = course_config(course)  # the shared build's: only step 3 (and what reads it) runs again
    quiet = json.loads((workdir / "results" / "time_runs.json").read_text())
    (workdir / "results" / "time.json").unlink()
    burner = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", BURN])
    try:
        time.sleep(0.5)
        command = ["taskset", "-c", "0", sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
                   "--directory", str(workdir), "--cores", "1", "results/time.json"]
        config_file = workdir / "contended.yaml"
        config_file.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
        result = subprocess.run([*command, "--configfile", str(config_file)], capture_output=True, text=True,
                                cwd=workdir)
    finally:
        burner.kill()
        burner.wait()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    snakemake(workdir, "results/report.md", "results/check.json", config=config)
    return workdir / "results", quiet


def test_a_shared_core_is_flagged_unstable_in_the_results_the_report_and_check(contended):
    results, quiet = contended
    runs = json.loads((results / "time_runs.json").read_text())
    unstable = [mode for mode, stats in runs["summary"].items() if stats["unstable"]]
    assert unstable, runs["summary"]
    # an unstable mode stopped repeating only when its time was up: past the configured 5 runs, or
    # after timing.max_seconds of them (5 runs on a shared core may already take longer)
    for mode in unstable:
        assert runs["summary"][mode]["n"] > 5 or sum(runs["runs_s"][mode]) >= runs["max_seconds"], runs["summary"][mode]
    assert set(runs) >= {"runs_s", "summary", "speedup", "warmup", "repeats", "max_seconds", "device", "processor",
                         "torch_threads"}
    assert runs["torch_threads"] == 1 and all(len(runs["runs_s"][m]) == runs["summary"][m]["n"] for m in unstable)
    report = (results / "report.md").read_text(encoding="utf-8")
    head = report.split("## KV 캐시")[0]
    assert "조심해서 읽을 측정" in head and "3단계" in head
    verdicts = json.loads((results / "check.json").read_text())
    assert any("step 3's timing is unstable" in warning for warning in verdicts["warnings"])
    table = (results / "logs" / "check.log").read_text(encoding="utf-8")
    assert table.index("WARNING: step 3's timing is unstable") < table.index("verdict")  # it opens the table
    time_json = json.loads((results / "time.json").read_text())
    assert set(time_json) == {"with_cache_s", "without_cache_s", "speedup"}  # the sheet's three keys only


def test_no_sentence_contradicts_the_intervals(contended):
    """Whatever the shared core did to the numbers, the report states a comparison only where the
    intervals allow it."""
    results, _ = contended
    runs = json.loads((results / "time_runs.json").read_text())
    speedup = runs["speedup"]
    report = (results / "report.md").read_text(encoding="utf-8")
    kv_section = report.split("## KV 캐시")[1].split("## 온도")[0]
    assert f"({speedup['low']:.2f}–{speedup['high']:.2f}×)" in kv_section
    if speedup["low"] <= 1 <= speedup["high"]:
        assert "말할 수 없습니다" in kv_section and "배, 시간을" not in kv_section
    elif speedup["low"] > 1:
        assert "배, 시간을" in kv_section and "말할 수 없습니다" not in kv_section
    assert math.isfinite(speedup["ratio"])


def test_the_check_passes_or_fails_the_same_way_with_a_warning_on_top(contended):
    results, _ = contended
    verdicts = check.check_results(results, check.Settings((0.3, 1.5), 6, (0.5, 0.9, 0.99)))
    table = check.verdict_table(verdicts)
    assert table.splitlines()[1].startswith("WARNING: step 3's timing is unstable")


# --- the report's sentences on data made to hit each case ---------------------------------------------

def curve_rows(flat, sharp, vocab_size=1884):
    ps = [round(0.25 * k, 2) for k in range(1, len(flat) + 1)]
    return [{"p": p, "flat": f, "sharp": s, "lab_p": False, "vocab_size": vocab_size, "flat_prefix": "민수는",
             "sharp_prefix": "가람 마을의 특산물은"} for p, f, s in zip(ps, flat, sharp)]


@pytest.mark.parametrize("language", ["ko", "en"])
def test_ties_proportions_and_numbers_in_the_top_p_curve(contended, tmp_path, language):
    """A tie at one p is no crossing; a cut tail is counted, not called "a few"; every count over 999
    has its thousands separator."""
    from kvlab.io import write_csv_atomic
    from kvlab.present.report import render_report

    results, _ = contended
    paths = {name: results / file for name, file in {
        "prompt": "prompt.json", "model_card": "model_card.json", "same": "same.json", "counts": "count.json",
        "time": "time.json", "time_runs": "time_runs.json", "kvbytes": "kvbytes.json", "temp": "temp.json",
        "temp_answers": "temp_answers.json", "topp": "topp.json", "topp_sharp": "topp_sharp.json"}.items()}
    paths["topp_curve"] = tmp_path / "topp_curve.csv"
    paths["figure_topp_survivors"] = results / "figures" / "topp_survivors.png"
    write_csv_atomic(paths["topp_curve"], curve_rows([1, 20, 200, 1707], [1, 1, 5, 1502]))
    report = render_report(ROOT / "templates" / "report" / "beyond.md.j2", paths, language)
    curve = report.split("## 모든 p에서의 top-p" if language == "ko" else "## Top-p for every p")[1].split("\n## ")[0]
    if language == "ko":  # a tie at one p is no crossing
        assert '"민수는" 뒤에 남는 후보가 "가람 마을의 특산물은" 뒤보다 적은 적이 없습니다' in curve and "교차" not in curve
        assert "어휘에서 177개와 382개를 자릅니다" in curve
    else:
        assert 'never fewer candidates survive after "민수는" than after "가람 마을의 특산물은"' in curve
        assert "cross" not in curve and "the rule cuts 177 and 382 tokens" in curve
    write_csv_atomic(paths["topp_curve"], curve_rows([1, 2000, 200, 1707], [1, 1, 5, 1884]))
    crossing = render_report(ROOT / "templates" / "report" / "beyond.md.j2", paths, language)
    assert ("두 곡선이 교차합니다" if language == "ko" else "the curves cross") in crossing
    assert "last few tokens" not in curve and "마지막 토큰 몇 개" not in curve
