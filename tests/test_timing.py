"""Every timing with its spread, and every sentence true to its numbers: the statistics and the rule
for an unstable timing (kvlab.facts.timing), repeats that adapt to the machine, the report's words on
data made to hit each case (ties, overlaps, proportions, number formats) in both languages, and a
timed job sharing its core with other work, which the results, the report and `check` must flag."""
import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest

from kvlab.grade import check
from kvlab.grade.folder import DEFAULT_MAX_BYTES, Folder
from kvlab.facts import timing
from kvlab.facts.disturbed import contended_timings

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


# --- a machine that takes from the timed process: the contention rule --------------------------------


def usage_of(shares, wall=0.1, switches=0, load=1.0):
    """Per-run clocks (kvlab.facts.timing.USAGE_KEYS) of runs whose timing thread had these shares of
    their wall time on a CPU."""
    return {"wall_s": [wall] * len(shares), "thread_cpu_s": [share * wall for share in shares],
            "cpu_s": [share * wall for share in shares], "switches": [switches] * len(shares),
            "load_1m": [load] * len(shares)}


def test_the_contention_rule_on_made_up_clocks():
    """A run is contended below 90% of its wall time on a CPU; a timing when a quarter of its runs or
    more are. On a GPU the share is not judged; without clocks nothing is measured. Every existing key
    keeps its meaning."""
    assert timing.run_contended(1.0, 0.89) and not timing.run_contended(1.0, 0.90)  # 90% is not contended
    quiet = timing.summary([1.0] * 8, usage_of([0.99] * 8, switches=1, load=0.5))
    assert not quiet["contended"] and quiet["contention"] == "judged" and quiet["contended_runs"] == 0
    assert quiet["cpu_share"] == pytest.approx(0.99) and quiet["switches_per_s"] == pytest.approx(10.0)
    assert quiet["load_1m"] == 0.5 and quiet["median_s"] == 1.0 and not quiet["unstable"]
    # the case: a neighbour on the core slows every run alike, the spread stays small
    calm_and_wrong = timing.summary([1.5, 1.51, 1.49, 1.5], usage_of([0.66, 0.67, 0.65, 0.66], switches=40))
    assert calm_and_wrong["contended"] and not calm_and_wrong["unstable"]
    assert calm_and_wrong["contended_runs"] == 1 and calm_and_wrong["cpu_share"] == pytest.approx(0.66)
    assert timing.summary([1.0] * 8, usage_of([0.5] * 2 + [0.99] * 6))["contended"]  # a quarter: contended
    assert not timing.summary([1.0] * 8, usage_of([0.5] + [0.99] * 7))["contended"]  # one in eight: not yet
    on_gpu = timing.summary([1.0] * 4, usage_of([0.3] * 4), judged=False)
    assert on_gpu["contention"] == "not judged" and not on_gpu["contended"] and on_gpu["cpu_share"] == pytest.approx(0.3)
    assert timing.judged_on("cpu") and not timing.judged_on("cuda:0") and not timing.judged_on("cuda")
    unmeasured = timing.summary([1.0, 1.1])
    assert unmeasured["contention"] == "not measured" and unmeasured["contended"] is False
    assert unmeasured["cpu_share"] is None and unmeasured["n"] == 2
    # with several threads the process's share passes 1; the rule reads the timing thread's
    threads = usage_of([0.95] * 4)
    threads["cpu_s"] = [0.19] * 4
    busy = timing.summary([0.1] * 4, threads)
    assert busy["process_cpu_share"] == pytest.approx(1.9) and not busy["contended"]
    # a speedup from a contended timing is contended; the table's columns say so beside `unstable`
    ratio = timing.ratio_interval(calm_and_wrong, quiet)
    assert ratio["contended"] and ratio["ratio"] == pytest.approx(1.5)
    assert not timing.ratio_interval(quiet, quiet)["contended"]
    assert not timing.ratio_interval({"median_s": 2, "q1_s": 2, "q3_s": 2}, quiet)["contended"]  # an old summary
    columns = timing.spread_columns({"with_cache": quiet, "without_cache": calm_and_wrong}, ratio)
    assert columns["contended"] and not columns["unstable"] and columns["contention"] == "judged"
    assert columns["without_cache_cpu_share"] == pytest.approx(0.66) and columns["with_cache_cpu_share"] == pytest.approx(0.99)


def test_repeat_reads_each_runs_clocks():
    """With a `usage`, every run records what the clocks read around it; without one `repeat` returns
    its seconds as it always did."""
    now = {"wall": 0.0, "cpu": 0.0, "switches": 0}

    def run():  # 1 s of wall time, half of it on a CPU, 3 involuntary switches
        now["wall"] += 1.0
        now["cpu"] += 0.5
        now["switches"] += 3

    def read():
        return timing.Reading(now["wall"], now["cpu"], 2 * now["cpu"], now["switches"], 2.5)

    usage = timing.empty_usage()
    samples = timing.repeat(run, 4, max_seconds=0, clock=lambda: now["wall"], usage=usage, read=read)
    assert samples == [1.0] * 4 and set(usage) == set(timing.USAGE_KEYS)
    assert usage == {"wall_s": [1.0] * 4, "thread_cpu_s": [0.5] * 4, "cpu_s": [1.0] * 4, "switches": [3] * 4,
                     "load_1m": [2.5] * 4}
    stats = timing.summary(samples, usage)
    assert stats["contended"] and stats["switches_per_s"] == 3.0 and stats["process_cpu_share"] == 1.0
    assert timing.repeat(run, 2, 0, clock=lambda: now["wall"]) == [1.0, 1.0]  # the old call, unchanged
    reading = timing.read_usage()
    assert reading.wall > 0 and reading.thread_cpu >= 0 and reading.switches >= 0


def busy_loop():
    """About 50 ms of pure Python on this machine."""
    total = 0
    for i in range(400_000):
        total += i
    return total


def runqueue_wait_s() -> float | None:
    """Seconds this thread has waited on a run queue (the kernel's schedstat), None where unknown."""
    try:
        return int(open("/proc/thread-self/schedstat").read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def timed(work, runs=5):
    usage = timing.empty_usage()
    waited = runqueue_wait_s()
    samples = timing.repeat(work, runs, 0, usage=usage)
    waited = None if waited is None else runqueue_wait_s() - waited
    return timing.summary(samples, usage), waited


@pytest.fixture
def one_core():
    """This process pinned to one of its CPUs, and the CPUs it had (given back after the test)."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("os.sched_setaffinity is not available here: a burner cannot be put on the test's core")
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        yield min(allowed), allowed
    finally:
        os.sched_setaffinity(0, allowed)


def burner_on(core: int) -> subprocess.Popen:
    """`while True: pass` pinned to `core`, already spinning."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    time.sleep(0.3)
    return burner


def test_a_burner_on_the_timed_core_is_flagged_contended_and_the_same_work_alone_is_not(one_core):
    """Real clocks: a busy loop timed beside a burner pinned to its core gets about half of it and is
    flagged contended; the same loop on the machine alone is not, unless the kernel's run queue says
    that other work did take from it (this machine may be shared: the rule is then right to flag)."""
    core, allowed = one_core
    burner = burner_on(core)
    try:
        shared, _ = timed(busy_loop)
    finally:
        burner.kill()
        burner.wait()
    assert shared["contended"] and shared["cpu_share"] < 0.75 and shared["contended_runs"] == 1, shared
    os.sched_setaffinity(0, allowed)  # alone: on whichever of its CPUs is free
    for _ in range(3):
        alone, waited = timed(busy_loop)
        if not alone["contended"]:
            break
    if alone["contended"]:
        total = alone["n"] * alone["median_s"]
        print(f"alone, still contended: CPU share {alone['cpu_share']:.2f}, runqueue wait {waited} s of {total:.2f} s, "
              f"load {alone['load_1m']}")
        assert waited is not None and waited > 0.05 * total, (alone, waited)  # the kernel agrees: it waited
    else:
        assert alone["cpu_share"] > shared["cpu_share"] + 0.2, (alone, shared)


def test_step_3_timed_beside_a_burner_is_contended_in_its_runs(one_core):
    """Step 3's own function (what rule `timing` calls), on a small random MiniMind beside a burner on its
    core: time_runs.json's per-run clocks, both modes flagged contended, the speedup too, and time.json
    keeps the sheet's three keys."""
    import torch

    from kvlab.measure import steps
    from helpers import random_model

    torch.set_num_threads(1)
    model = random_model(0)
    burner = burner_on(one_core[0])
    try:
        result, runs = steps.time_generation(model, list(range(3, 40)), 8, 1, 3, 0.0, "cpu")
    finally:
        burner.kill()
        burner.wait()
    assert set(result) == {"with_cache_s", "without_cache_s", "speedup"}
    for mode, stats in runs["summary"].items():
        assert stats["contended"] and stats["contention"] == "judged" and stats["cpu_share"] < 0.75, stats
        assert len(runs["usage"][mode]["wall_s"]) == len(runs["runs_s"][mode]) == stats["n"]
        assert set(runs["usage"][mode]) == set(timing.USAGE_KEYS)
    assert runs["speedup"]["contended"]
    found = contended_timings({"time_runs": runs})
    assert [(item["what"], item["mode"]) for item in found] == [("step3", "with_cache"), ("step3", "without_cache")]
    # each with what the rule saw: how many of its runs waited, and their CPU share (under the rule's)
    assert all(item["cpu_share"] < 0.75 and item["waited"] / item["runs"] >= timing.CONTENDED_RUNS_SHARE for item in found)


def test_the_reports_list_of_contended_timings_reads_every_result():
    """contended_timings (kvlab.facts.disturbed) on results made to hit each kind, as load_results
    gives them; quiet and unmeasured timings (older results) list nothing."""
    hot = timing.summary([1.0] * 4, usage_of([0.5] * 4, switches=20, load=3.0))
    calm = timing.summary([1.0] * 4, usage_of([0.99] * 4))
    old = {key: value for key, value in calm.items() if key in ("n", "median_s", "q1_s", "q3_s", "iqr_share", "unstable")}
    speedup = timing.ratio_interval(hot, calm)
    results = {
        "time_runs": {"summary": {"with_cache": calm, "without_cache": hot}, "speedup": speedup},
        "sweep": [{"new_tokens": 8, "speedup": 2.0, "speedup_low": 1.8, "speedup_high": 2.2,
                   **timing.spread_columns({"with_cache": calm, "without_cache": calm}, timing.ratio_interval(calm, calm))},
                  {"new_tokens": 16, "speedup": 3.0, "speedup_low": 2.5, "speedup_high": 3.5,
                   **timing.spread_columns({"with_cache": hot, "without_cache": calm}, speedup)}],
        "latency": {"with_cache": {"generate": hot}, "without_cache": {"generate": old},
                    "measured": timing.ratio_interval(old, hot)},
        "compare": [{"name": "lab", "speedup": 3.0, "speedup_low": 2.5, "speedup_high": 3.5, "unstable": False,
                     "with_cache_iqr_share": 0.0, "without_cache_iqr_share": 0.0}],  # written before the rule
        "batch": [{"mode": "shared", "B": 4, "contended": True, "cpu_share": 0.5},
                  {"mode": "distinct", "B": 4, "contended": False, "cpu_share": 0.99}],
        "step_anatomy": {"anatomy": {"steps": ["with_cache_cat", "without_cache"], "with_cache_cat": {"step": hot},
                                     "without_cache": {"step": calm}},
                         "curve": {"kinds": ["cat", "static"], "contexts": [16, 64], "cat": {"steps": [calm, hot]},
                                   "static": {"steps": [old, calm]}, "cat_over_static": timing.ratio_interval(hot, calm)}},
    }
    found = contended_timings(results)
    assert [(item["what"], item.get("mode"), item.get("n"), item.get("name")) for item in found] == [
        ("step3", "without_cache", None, None), ("sweep", None, 16, None), ("latency", "with_cache", None, None),
        ("batch", "shared", 4, None), ("anatomy", "with_cache_cat", None, None), ("curve", "cat", 64, None)]
    # what the rule saw, from the summary's own numbers where the result keeps no runs' clocks
    assert found[0] == {"what": "step3", "mode": "without_cache", "runs": 4, "waited": 4, "cpu_share": 0.5}
    assert found[1]["cpu_share"] == pytest.approx(0.5) and found[1]["waited"] == 4  # the sweep's columns
    assert found[3] == {"what": "batch", "mode": "shared", "n": 4, "runs": None, "waited": None, "cpu_share": None}
    assert contended_timings({"time_runs": {"summary": {"with_cache": old, "without_cache": old}}}) == []


def test_check_warns_about_a_contended_step_3(tmp_path):
    """check's warnings: a contended step 3 gets its line (with its CPU share), an unstable one its own."""
    hot = timing.summary([1.5, 1.51, 1.49], usage_of([0.48] * 3))
    calm = timing.summary([1.0] * 3, usage_of([0.99] * 3))
    (tmp_path / "time_runs.json").write_text(json.dumps({"summary": {"with_cache": calm, "without_cache": hot}}))
    warnings = check.timing_warnings(Folder(tmp_path, DEFAULT_MAX_BYTES))
    assert len(warnings) == 1 and warnings[0].startswith("step 3's timing is contended")
    assert "without cache (a median 48% of the wall time on a CPU; 100% of the runs under 90%)" in warnings[0]
    assert "with cache (" not in warnings[0]


# --- a timed job that shares its core ----------------------------------------------------------------

# Bursts of other work about as long as a timed run, on the timed job's core (tests/bursts.py).
BURSTS = ROOT / "tests" / "bursts.py"


@pytest.fixture(scope="module")
def contended(tmp_path_factory, course_build, course):
    """A copy of the shared build, then step 3 timed again on CPU 0 while bursts of other work run on
    CPU 0, and what reads it (the report, check) made again. The bursts fall where they fall: a
    timing they left stable or uncontended anyway (about one in ten on this VM), or slowed so that
    the cache side came out slower, is timed again, at most five times, so the tests below read one
    that was disturbed both ways and that the sheet's check can pass."""
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed: the timed job cannot share a core on purpose")
    workdir = shutil.copytree(course_build, tmp_path_factory.mktemp("contended") / "run")
    config = course_config(course)  # the shared build's: only step 3 (and what reads it) runs again
    quiet = json.loads((workdir / "results" / "time_runs.json").read_text())
    config_file = workdir / "contended.yaml"
    config_file.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    command = ["taskset", "-c", "0", sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"),
               "--directory", str(workdir), "--cores", "1", "results/time.json", "--configfile", str(config_file)]
    for _ in range(5):
        (workdir / "results" / "time.json").unlink()
        burner = subprocess.Popen(["taskset", "-c", "0", sys.executable, str(BURSTS)])
        try:
            time.sleep(0.5)
            result = subprocess.run(command, capture_output=True, text=True, cwd=workdir)
        finally:
            burner.kill()
            burner.wait()
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        summary = json.loads((workdir / "results" / "time_runs.json").read_text())["summary"]
        # disturbed both ways, and still with the cache side faster: a burst that made it slower fails the
        # sheet's own check (`cache_faster`), which these tests do not ask about
        faster = json.loads((workdir / "results" / "time.json").read_text())["speedup"] > 1
        if any(s["unstable"] for s in summary.values()) and any(s["contended"] for s in summary.values()) and faster:
            break
    snakemake(workdir, "results/report.md", "results/check.json", config=config)
    return workdir / "results", quiet


def test_a_shared_core_is_flagged_unstable_and_contended_in_the_results_the_report_and_check(contended):
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
    # the runs the bursts took from are flagged contended too, and the speedup read from them
    contended = [mode for mode, stats in runs["summary"].items() if stats["contended"]]
    assert contended and runs["speedup"]["contended"], {m: runs["summary"][m] for m in runs["summary"]}
    assert all(len(runs["usage"][m]["thread_cpu_s"]) == runs["summary"][m]["n"] for m in runs["summary"])
    report = (results / "report.md").read_text(encoding="utf-8")
    head = report.split("## KV 캐시")[0]
    assert "3단계의 측정이 흔들렸습니다" in head and "3단계" in head
    verdicts = json.loads((results / "check.json").read_text())
    assert any("step 3's timing is unstable" in warning for warning in verdicts["warnings"])
    assert any("step 3's timing is contended" in warning for warning in verdicts["warnings"])
    # what the report lists at its top (kvlab.facts.disturbed, from the files the report reads)
    from kvlab.present.report import load_results
    loaded, _ = load_results({"time_runs": results / "time_runs.json"})
    assert {item["mode"] for item in contended_timings(loaded)} == set(contended)
    # and the report says so at its top (each mode once, with what each rule saw), and that the speedup is not
    # the machine's
    assert "3단계 캐시" in head.split("3단계의 측정이 흔들렸습니다")[1] and "CPU" in head
    kv_section = report.split("## KV 캐시")[1].split("## 온도")[0]
    assert "재는 동안 프로세스가 CPU를 기다렸습니다" in kv_section and "이 기계의 값이 아닙니다" in kv_section
    table = (results / "logs" / "check.log").read_text(encoding="utf-8")
    assert table.index("WARNING: step 3's timing is unstable") < table.index("verdict")  # it opens the table
    time_json = json.loads((results / "time.json").read_text())
    assert set(time_json) == {"with_cache_s", "without_cache_s", "speedup"}  # the sheet's three keys only


def test_no_sentence_contradicts_the_intervals(contended):
    """Whatever the shared core did to the numbers, the report states a comparison only where the
    intervals allow it: time.json's wall-clock speedup in the table, the verdict on the clock it is
    judged on (the CPU clock's when a mode was contended)."""
    from kvlab.present.clocks import step3_speedup
    from kvlab.present.verdicts import on_clock

    results, _ = contended
    runs = json.loads((results / "time_runs.json").read_text())
    speedup = runs["speedup"]
    judged = on_clock(*step3_speedup(runs).values())
    report = (results / "report.md").read_text(encoding="utf-8")
    kv_section = report.split("## KV 캐시")[1].split("## 온도")[0]
    assert f"({speedup['low']:.2f}–{speedup['high']:.2f}×)" in kv_section
    assert f"{judged['low']:.2f}–{judged['high']:.2f}" in kv_section
    assert ("CPU 시계" in kv_section) == (judged["clock"] == "cpu")
    if judged["low"] <= 1 <= judged["high"]:
        assert "말할 수 없습니다" in kv_section and "배, 시간을" not in kv_section and "일을" not in kv_section
    elif judged["low"] > 1:
        assert ("배, 시간을" in kv_section or "일을" in kv_section) and "말할 수 없습니다" not in kv_section
    assert math.isfinite(speedup["ratio"]) and math.isfinite(judged["ratio"])


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
    """A tie at one p is no crossing; p = 1 is said as `generate` behaves there, no tail counted as cut."""
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
        assert "p = 1에서 `generate`는 이 규칙을 건너뛰고" in curve and "자릅니다" not in curve
    else:
        assert 'never fewer candidates survive after "민수는" than after "가람 마을의 특산물은"' in curve
        assert "cross" not in curve and "At p = 1 `generate` skips the rule" in curve and "cuts" not in curve
    write_csv_atomic(paths["topp_curve"], curve_rows([1, 2000, 200, 1707], [1, 1, 5, 1884]))
    crossing = render_report(ROOT / "templates" / "report" / "beyond.md.j2", paths, language)
    assert ("두 곡선이 교차합니다" if language == "ko" else "the curves cross") in crossing
    assert "last few tokens" not in curve and "마지막 토큰 몇 개" not in curve
