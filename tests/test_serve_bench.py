"""The serve_bench rule (kvlab.measure.serving_bench): the arithmetic of a run on made-up answers, and the
rule itself on the tests' course with a tiny load: its CSV's columns, every request answered, latency
rising past saturation, and its figure. One server there (a server start costs
seconds); the ways of serving differ in the engine's tests (tests/test_serving_engine.py)."""
import math
import re
import statistics
import warnings

import numpy as np
import pytest

from kvlab.io import read_csv_rows, read_json
from kvlab.facts.arrivals import poisson_arrivals
from kvlab.measure.serving_bench import PERCENTILES, Answer, percentile, summary
from kvlab.present import serving_figures

from helpers import course_config, png_text, snakemake

HANGUL = re.compile("[\uac00-\ud7a3]")

# one slot, so that past saturation the requests queue: the rise in latency the test holds is the
# queue's (several requests' service times), not a few milliseconds a busy machine could invert
TINY_BENCH = {"servers": ["continuous"], "rate_fractions": [0.5, 4.0], "prompt_tokens": 16,
              "output_tokens": 12, "lone_requests": 1, "saturation_requests": 4, "seconds_per_rate": 1.0,
              "max_requests": 8, "request_timeout_s": 30, "max_num_seqs": 1}


def test_poisson_arrivals_are_seeded_and_bounded_by_count_and_time():
    arrivals = poisson_arrivals(1000, 20.0, 3, until=5.0)
    assert arrivals == poisson_arrivals(1000, 20.0, 3, until=5.0) != poisson_arrivals(1000, 20.0, 4, until=5.0)
    assert arrivals[0] == 0 and arrivals == sorted(arrivals) and arrivals[-1] <= 5.0
    assert 0.8 < statistics.mean(np.diff(arrivals)) * 20 < 1.25  # exponential gaps of mean 1/rate
    assert len(poisson_arrivals(7, 20.0, 3, until=5.0)) == 7
    assert poisson_arrivals(4, math.inf, 0) == [0.0] * 4
    # the trace rule's steps and serve_bench's seconds are one process: the same seed, the same gaps
    assert poisson_arrivals(50, 0.5, "arrivals 0")[:3] == poisson_arrivals(3, 0.5, "arrivals 0")


def test_percentiles_are_numpys_and_goodput_counts_requests_meeting_both_slos():
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.5]
    assert [percentile(values, q) for q in PERCENTILES] == pytest.approx(np.percentile(values, PERCENTILES))
    assert math.isnan(percentile([], 50))
    answers = [Answer(0.0, [0.1, 0.2, 0.3], 200),  # TTFT 100 ms, TPOT 100 ms: meets both
               Answer(0.0, [0.5, 0.6, 0.7], 200),  # TTFT 500 ms: misses the TTFT SLO
               Answer(0.0, [0.1, 0.5, 0.9], 200),  # TPOT 400 ms: misses the TPOT SLO
               Answer(0.0, [], 503, "overloaded"), Answer(0.0, [0.1], 200, "finish_reason abort")]
    row = summary(answers, wall_s=2.0, slo_ttft=0.2, slo_tpot=0.2)
    assert (row["requests"], row["completed"], row["rejected"], row["failed"]) == (5, 3, 1, 2)
    assert row["goodput_rps"] == 0.5 and row["throughput_rps"] == 1.5 and row["slo_met_share"] == 0.2
    assert row["ttft_p50_ms"] == pytest.approx(100) and row["tpot_p50_ms"] == pytest.approx(100)
    assert row["itl_p99_ms"] == pytest.approx(400, rel=0.05) and row["e2e_p50_ms"] == pytest.approx(700)


def test_the_rule_on_a_tiny_load_gives_its_csv_and_figure_with_latency_rising_past_saturation(tmp_path, course):
    config = course_config(course)
    config["extras"] = {**config["extras"], "serve_bench": TINY_BENCH}
    snakemake(tmp_path, "results/serving/bench.csv", config=config)
    rows = read_csv_rows(tmp_path / "results" / "serving" / "bench.csv")
    assert [(row["server"], row["rate_fraction"]) for row in rows] == [
        (server, fraction) for server in TINY_BENCH["servers"] for fraction in TINY_BENCH["rate_fractions"]]
    columns = {"rate_rps", "requests", "completed", "rejected", "failed", "duration_s", "throughput_rps",
               "output_tok_s", "goodput_rps", "slo_met_share", "slo_ttft_ms", "slo_tpot_ms",
               *(f"{name}_p{q}_ms" for name in ("ttft", "tpot", "itl", "e2e") for q in PERCENTILES)}
    assert columns <= set(rows[0]), columns - set(rows[0])
    for row in rows:
        assert row["completed"] == row["requests"] > 0 and row["failed"] == 0, row
        assert row["ttft_p50_ms"] <= row["ttft_p90_ms"] <= row["ttft_p99_ms"] <= row["e2e_p99_ms"]
    for server in TINY_BENCH["servers"]:
        low, high = [row for row in rows if row["server"] == server]
        assert high["rate_rps"] > low["rate_rps"]
        assert high["ttft_p50_ms"] > low["ttft_p50_ms"] and high["e2e_p90_ms"] > low["e2e_p90_ms"], (low, high)
    side = read_json(tmp_path / "results" / "serving" / "bench_runs.json")
    assert side["saturation_rps"] == side["saturation"]["continuous"]["throughput_rps"] > 0
    assert all(row["saturation_rps"] == side["saturation_rps"] for row in rows)
    assert side["slo"]["ttft_ms"] == pytest.approx(5 * side["lone"]["continuous"]["ttft_ms"], rel=1e-3)
    # as rule figure_serve_bench draws it, in Korean (the default report.language); a missing glyph
    # warns: fail on it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        serving_figures.serve_bench(rows, tmp_path / "serve_bench.png", language="ko")
    serving_figures.serve_bench(rows, tmp_path / "serve_bench_en.png", language="en")
    korean, english = (png_text(tmp_path / name)["Description"] for name in ("serve_bench.png", "serve_bench_en.png"))
    assert HANGUL.search(korean) and not HANGUL.search(english)  # every label translated, none left in English
