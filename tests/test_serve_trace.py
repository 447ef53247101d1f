"""Continuous batching against static and against one request at a time on one trace
(kvlab.measure.serving_trace, serving_run, serving_workloads, serving_rates; rules serve_trace and serve_rates):
every request of every way as `generate` alone gives it, counted; continuous finishes a trace whose
lengths vary in fewer forward steps, its slots fuller; the engine's own records time each step; the
tables' columns; one-line refusals naming the config key; the built files and what reruns when a knob
changes."""
import json
import math

import pytest
import yaml

from kvlab.config import ConfigError, check_serving
from kvlab.facts.results import FIGURES, REPORT_READS, RESULTS
from kvlab.facts.serving import ServingSettings
from kvlab.io import read_csv_rows
from kvlab.measure import kv_waste, serving_rates, serving_run, serving_trace, serving_workloads
from kvlab.present import serving_figures

from helpers import ROOT, SMALL_EXTRAS, course_config, dry_run_jobs, snakemake
from serving_helpers import VOCAB, one_thread, prompts_of, tiny_model  # noqa: F401

DEFAULTS = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))["extras"]["serving"]
# a tiny trace: 6 requests on 2 slots, max_tokens 1-10 (lengths that vary), blocks of 4 tokens
SETTINGS = ServingSettings.of(DEFAULTS).changed(
    requests=6, prompt_min=4, prompt_cap=20, max_tokens_min=1, max_tokens_max=10, rate=2.0, slots=2, block_size=4,
    num_blocks=48, tight_blocks=8, max_batched_tokens=128, prefix_requests=3, question_tokens=4, parallel_requests=2,
    parallel_n=2, repeats=1, rate_fractions=(1.0, 2.0), rate_max_seconds=5)
COUNT_COLUMNS = {"trace", "run", "policy", "forward_steps", "slot_utilisation", "peak_blocks", "mean_blocks",
                 "preemptions", "prefix_hit_rate", "blocks_saved_by_sharing", "memory_saved_share",
                 "greedy_mismatches", "seeded_mismatches", "checked_requests"}


def bos_prompts(count: int, seed: int = 1) -> list[list[int]]:
    """Validation-like prompts as document_prompts cuts them: bos (1), then tokens up to prompt_cap."""
    return [[1] + prompt for prompt in prompts_of([SETTINGS.prompt_cap - 1] * count, seed)]


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


@pytest.fixture(scope="module")
def measured(model):
    system_prompt = [1] + prompts_of([23], seed=7)[0]  # 24 tokens: six full blocks shared
    return serving_trace.measure(model, bos_prompts(6), system_prompt, SETTINGS, bytes_per_token=512)


# --- the traces ------------------------------------------------------------------------------------


def test_a_trace_is_seeded_its_lengths_in_range_and_the_same_at_any_rate():
    prompts = bos_prompts(6)
    trace = serving_workloads.main_trace(prompts, SETTINGS, SETTINGS.rate)
    assert trace == serving_workloads.main_trace(prompts, SETTINGS, SETTINGS.rate)
    assert all(4 <= len(r.prompt) <= 20 and r.prompt[0] == 1 and 1 <= r.params.max_tokens <= 10 for r in trace)
    assert [r.params.seed is None for r in trace] == [True, False] * 3  # every other request greedy
    assert all(r.params.eos_token_id is None for r in trace)  # each runs to its max_tokens
    steps = [r.arrival_step for r in trace]
    assert steps == sorted(steps) and steps[0] == 0
    slower = serving_workloads.main_trace(prompts, SETTINGS, 0.1)
    assert [(r.prompt, r.params) for r in slower] == [(r.prompt, r.params) for r in trace]
    assert [r.arrival_step for r in slower] != steps
    made = serving_workloads.traces(prompts, [1, 2, 3], SETTINGS)
    assert all(r.prompt[:3] == [1, 2, 3] and len(r.prompt) == 3 + 4 for r in made["prefix"])
    assert all(r.params.n == 2 and r.params.seed is not None for r in made["parallel"])


# --- serving it both ways ------------------------------------------------------------------------


def test_every_run_matches_generate_alone_greedy_and_seeded(measured):
    counts = measured["counts"]
    assert {row["run"] for row in counts} >= {"static", "continuous", "continuous, tight pool",
                                              "continuous, prefix cache on", "continuous, n = 2"}
    for row in counts:
        assert row["checked_requests"] == row["requests"], row["run"]
        assert (row["greedy_mismatches"], row["seeded_mismatches"]) == (0, 0), row["run"]
    assert all(record["same_as_alone"] for record in measured["events"])


def test_the_trace_is_served_three_ways_each_held_against_generate_alone(measured):
    """One at a time through the fastest single path, static and continuous on the compiled engine: the
    same answers, each way's exact steps, every way timed in each repeat on both clocks."""
    detail = measured["detail"]
    assert detail["one_at_a_time"] == {"greedy_mismatches": 0, "seeded_mismatches": 0, "checked": 6}
    ways = detail["way_counts"]
    tokens = sum(r["max_tokens"] for r in detail["traces"]["trace"])
    assert ways["one_at_a_time"] == {"forward_steps": tokens, "slots": 1, "slot_utilisation": 1.0, "tokens": tokens}
    assert ways["continuous"]["forward_steps"] < ways["static"]["forward_steps"] < tokens
    for way in serving_run.WAYS:
        (run,) = detail["timings"][way]  # repeats: 1
        assert run["tokens"] == tokens and run["wall_s"] > 0 and 0 < run["cpu_s"] <= run["wall_s"] * 1.05
        assert run["tokens_per_s"] == pytest.approx(tokens / run["wall_s"])
    ready = detail["ready_steps"]  # each compiled step kept in a file of the cache, compiled or loaded
    assert ready["engine"]["seconds"] >= 0 and ready["one_at_a_time"]["seconds"] > 0
    assert len(ready["engine"]["files"]) == 1 and ready["one_at_a_time"]["files"]


def test_the_engine_records_each_steps_seconds_no_method_patched(model):
    """A run's step records (the engine's own) split each step into the scheduler's and the forward's
    seconds, the thread's CPU seconds beside; the on_schedule hook sees every plan."""
    trace = serving_workloads.main_trace(bos_prompts(6), SETTINGS, SETTINGS.rate)
    run = serving_run.serve(model, trace, serving_trace.engine_config(SETTINGS, "continuous"), "continuous")
    assert len(run.held) == len(run.steps) > 0
    for step in run.steps:
        assert 0 < step.schedule_s + step.forward_s <= step.step_s and 0 < step.cpu_s
    assert run.wall_s == pytest.approx(sum(step.step_s for step in run.steps))


def test_continuous_takes_fewer_steps_than_static_with_fuller_slots(measured):
    runs = {row["run"]: row for row in measured["counts"]}
    static, continuous = runs["static"], runs["continuous"]
    assert continuous["forward_steps"] < static["forward_steps"]
    assert continuous["slot_utilisation"] > static["slot_utilisation"]
    # the same tokens answered: useful slot-steps are the trace's, whatever the policy
    assert continuous["useful_slot_steps"] == static["useful_slot_steps"] == sum(
        r["max_tokens"] for r in measured["detail"]["traces"]["trace"])
    assert static["slot_utilisation"] == pytest.approx(static["useful_slot_steps"] / (2 * static["forward_steps"]))


def test_the_variants_preempt_hit_the_prefix_cache_and_share_blocks(measured):
    runs = {row["run"]: row for row in measured["counts"]}
    tight = runs["continuous, tight pool"]
    assert tight["preemptions"] > 0 and tight["recomputed_tokens"] > 0 and tight["peak_blocks"] <= 8
    on, off = runs["continuous, prefix cache on"], runs["continuous, prefix cache off"]
    assert on["prefix_hit_blocks"] > 0 and off["prefix_hit_blocks"] == 0
    assert 0 < on["prefix_hit_rate"] < 1 and on["peak_blocks"] < off["peak_blocks"]
    assert 0 < runs["continuous, n = 2"]["memory_saved_share"] < 1
    assert runs["continuous, n = 2"]["blocks_saved_by_sharing"] > 0


def test_the_memory_table_replays_kv_wastes_policies_beside_the_engine(measured):
    rows = measured["memory"]
    assert [row["policy"] for row in rows[:4]] == list(kv_waste.POLICIES)
    assert [row["source"] for row in rows] == ["replayed"] * 4 + ["measured"] * 2
    for row in rows:
        parts = sum(row[f"{key}_share"] for key in kv_waste.SPLIT)
        assert parts == pytest.approx(1.0), row["policy"]
    replayed = {row["policy"]: row for row in rows[:4]}
    assert replayed["exact"]["internal_fragmentation_share"] == 0
    # paging holds the requests' tokens about as the blocks policy's replay does
    assert rows[4]["token_share"] == pytest.approx(replayed["blocks"]["token_share"], abs=0.15)
    tight = rows[5]
    assert tight["budget_blocks"] == 8 and 1 <= tight["ran_at_once_peak"] <= 2


def test_the_timing_table_has_every_quantity_with_its_interval(measured):
    rows = {(row["comparison"], row["quantity"]): row for row in measured["timing"]}
    for quantity in ("throughput", "wall", "throughput_cpu", "ttft_p50", "ttft_p90", "ttft_max", "tpot_p50",
                     "latency_p90", "latency_max", "scheduler_share", "forward_share", "cpu_share", "step_fixed",
                     "step_per_row"):
        assert ("continuous vs static", quantity) in rows, quantity
    for quantity in ("throughput", "wall", "throughput_cpu"):
        alone = rows["continuous vs one at a time", quantity]
        assert (alone["baseline"], alone["subject"]) == ("one_at_a_time", "continuous")
        assert alone["ratio_low"] <= alone["ratio"] <= alone["ratio_high"]
        assert isinstance(alone["contended"], bool) and 0 < alone["subject_cpu_share"] <= 1.05
    throughput = rows["continuous vs static", "throughput"]
    assert throughput["ratio_low"] <= throughput["ratio"] <= throughput["ratio_high"]
    assert throughput["ratio"] == pytest.approx(rows["continuous vs static", "wall"]["ratio"])  # the same tokens
    assert math.isnan(rows["continuous vs static", "scheduler_share"]["ratio"])
    assert 0 < rows["continuous vs static", "scheduler_share"]["subject_median"] < 1
    assert 0 < rows["continuous vs static", "cpu_share"]["subject_median"] <= 1.05
    prefix = rows["prefix cache on vs off", "ttft_p50"]
    assert (prefix["baseline"], prefix["subject"]) == ("cache off", "cache on") and prefix["ratio"] > 0


def test_a_tight_budget_keeps_two_repeats_and_says_what_it_cut(model):
    system_prompt = [1] + prompts_of([23], seed=7)[0]
    tight = serving_trace.measure(model, bos_prompts(6), system_prompt, SETTINGS.changed(repeats=4, budget_s=1e-9),
                                bytes_per_token=512)
    detail = tight["detail"]
    assert detail["repeats"] == 2 and [cut["rung"] for cut in detail["budget"]["cut"]] == ["repeats of the three ways 3-4"]
    assert all(len(detail["timings"][way]) == 2 for way in detail["timings"])
    assert all(len(detail["prefix_ttft_s"][caching]) == 2 for caching in ("on", "off"))


def test_the_timeline_and_the_events_say_what_happened_when(measured):
    line = measured["detail"]["timelines"]["continuous"]
    assert len(line["requests"]) == 6 and len(line["steps"]) == len(line["blocks_in_use"])
    for request in line["requests"]:
        assert request["arrival"] <= request["admissions"][0] <= request["first_token"] <= request["finish"]
    tight = measured["detail"]["timelines"]["continuous, tight pool"]
    assert any(request["preemptions"] for request in tight["requests"])
    phases = serving_figures.phases({"arrival": 0, "admissions": [2, 6], "preemptions": [4], "first_token": 2,
                                     "finish": 8})
    assert phases == [("waiting", 0, 2), ("prefill", 2, 3), ("decoding", 3, 4), ("waiting", 4, 6),
                      ("prefill", 6, 7), ("decoding", 7, 9)]
    kinds = [event["kind"] for event in measured["events"][0]["events"]]
    assert kinds[:3] == ["arrival", "admission", "first_token"] and kinds[-1] == "finish"



@pytest.mark.parametrize("language", ["en", "ko"])
def test_the_latency_figures_note_sits_under_the_panels_clear_of_every_line(language, monkeypatch, tmp_path):
    """The note on the times (runs cut, the CPU taken) is drawn under both panels, so no saturation line
    or point runs through it (inside the seconds' panel it once sat on the static saturation line)."""
    rows = [{"policy": policy, "fraction": fraction, "rate_per_step": fraction * 2, "normalized_latency_steps": 1 + i,
             "normalized_latency_s": 0.01 * (1 + i), "cut": fraction == 1.5, "cpu_share": 0.5, "requests": 24,
             "saturation_fraction_static": 0.6}
            for policy in ("static", "continuous") for i, fraction in enumerate((0.5, 1.0, 1.5))]
    figures = []

    def keep(fig, path, rect=None):
        fig.tight_layout(rect=rect)
        fig.canvas.draw()
        figures.append(fig)

    monkeypatch.setattr(serving_figures, "save", keep)
    serving_figures.serve_latency(rows, tmp_path / "serve_latency.png", language)
    [fig] = figures
    renderer = fig.canvas.get_renderer()
    [note] = [text for text in fig.texts if text.get_gid() == serving_figures.NOTE]
    box = note.get_window_extent(renderer)
    assert len(note.get_text().splitlines()) >= 2  # both notes: a run cut, and the CPU taken
    for axis in fig.axes:
        assert not box.overlaps(axis.get_window_extent(renderer)), axis.get_title()


@pytest.mark.parametrize("requests", [4, 24, 64])
@pytest.mark.parametrize("language", ["en", "ko"])
def test_the_timelines_legend_sits_between_the_figures_title_and_the_first_panels(requests, language, monkeypatch,
                                                                                 tmp_path):
    """The legend over the static panel touches neither the figure's title nor the panel's, however many
    requests make the panels tall (its offset once grew with them and met the title at 24)."""
    import matplotlib.text

    line = {"requests": [{"arrival": i, "admissions": [i + 1], "preemptions": [], "first_token": i + 1,
                          "finish": i + 4} for i in range(requests)],
            "steps": list(range(requests + 5)), "blocks_in_use": [3] * (requests + 5), "slots": 8}
    data = {"timelines": {"static": line, "continuous": line},
            "summaries": {policy: {"forward_steps": requests + 5, "slot_utilisation": 0.5}
                          for policy in ("static", "continuous")}}
    boxes = {}

    def measure(fig, path, rect=None):
        fig.tight_layout(rect=rect)
        renderer = fig.canvas.get_renderer()
        fig.canvas.draw()
        first = fig.axes[0]
        panel_title = first.get_title(loc="left")
        titles = [t for t in fig.findobj(matplotlib.text.Text) if t.get_text() == panel_title and t.get_visible()]
        boxes.update(figure_title=fig._suptitle.get_window_extent(renderer),
                     legend=first.get_legend().get_window_extent(renderer),
                     panel_title=titles[0].get_window_extent(renderer))

    monkeypatch.setattr(serving_figures, "save", measure)
    serving_figures.serve_timeline(data, tmp_path / "timeline.png", language)
    legend = boxes["legend"]
    assert not legend.overlaps(boxes["figure_title"]) and legend.y1 <= boxes["figure_title"].y0, boxes
    assert not legend.overlaps(boxes["panel_title"]) and legend.y0 >= boxes["panel_title"].y1, boxes

def test_the_rate_sweep_measures_saturation_then_each_fraction(model):
    settings = SETTINGS.changed(requests=4, max_tokens_max=4, rate_fractions=(0.5, 2.0))
    rows, runs = serving_rates.rate_sweep(model, bos_prompts(4), settings)
    assert [(row["policy"], row["fraction"]) for row in rows] == [(p, f) for p in ("static", "continuous")
                                                                  for f in (0.5, 2.0)]
    saturation = runs["saturation"]
    per_step = saturation["continuous"]["requests_per_step"]
    assert per_step == 4 / saturation["continuous"]["forward_steps"]
    assert rows[0]["saturation_fraction_static"] == pytest.approx(saturation["static"]["requests_per_step"] / per_step)
    assert all(row["rate_per_step"] == pytest.approx(row["fraction"] * per_step) for row in rows)
    for row in rows:
        assert row["finished"] == 4 and not row["cut"], row
        # a request never kept waiting spends one step a token; none can do better
        assert row["normalized_latency_steps"] >= 1 and row["normalized_latency_s"] > 0
        assert 1 <= row["ttft_p50_steps"] <= row["ttft_p90_steps"] <= row["latency_p90_steps"]
    # a run bounded in time keeps what finished
    cut = serving_run.serve(model, serving_workloads.main_trace(bos_prompts(4), settings, 0.5),
                            serving_trace.engine_config(settings, "continuous"), "bounded", max_seconds=0.0)
    assert cut.cut and serving_rates.rate_row(cut, 0.1, 0.5)["finished"] < 4


# --- one-line refusals ---------------------------------------------------------------------------


def test_a_request_longer_than_the_pool_is_refused_naming_the_key(model):
    trace = serving_workloads.main_trace(bos_prompts(6), SETTINGS, 1.0)
    with pytest.raises(ValueError) as error:
        serving_workloads.check_fits(trace, serving_trace.engine_config(SETTINGS, "continuous", num_blocks=2),
                               "extras.serving.tight_blocks")
    assert str(error.value).startswith("config key 'extras.serving.tight_blocks': 2 blocks of 4 tokens cannot hold")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"^config key 'extras.serving.block_size': 7 does not divide"):
        serving_trace.measure(model, bos_prompts(6), [1], SETTINGS.changed(block_size=7), 512)


@pytest.mark.parametrize("change, key", [
    ({"max_batched_tokens": 25}, "max_batched_tokens': 25 fits nothing"),
    ({"num_blocks": 10}, "num_blocks': 10 blocks of 4 tokens cannot hold"),
    ({"tight_blocks": 3}, "tight_blocks': 3 blocks of 4 tokens cannot hold the trace's longest request"),
    ({"tight_blocks": 48}, "tight_blocks': 48 is no tighter than num_blocks (48)"),
    ({"parallel_n": 3}, "parallel_n': 3 samples run together, more than the 2 slots"),
    ({"max_tokens_min": 11}, "max_tokens_min': 11 is more than max_tokens_max (10)"),
])
def test_settings_that_serve_nothing_are_refused_at_parse_time(change, key):
    check_serving(SETTINGS.as_dict(), lab_prompt_len=24)
    with pytest.raises(ConfigError) as error:
        check_serving(SETTINGS.as_dict() | change, lab_prompt_len=24)
    assert str(error.value).startswith(f"config key 'extras.serving.{key}")


# --- in the built workflow -----------------------------------------------------------------------


def test_the_build_writes_the_serving_results(course_build):
    results = course_build / "results"
    counts = {row["run"]: row for row in read_csv_rows(results / "serving" / "serve_counts.csv")}
    assert set(counts) >= {"static", "continuous", "continuous, tight pool", "continuous, n = 2"}
    assert all(row["greedy_mismatches"] == row["seeded_mismatches"] == 0 for row in counts.values())
    assert counts["continuous"]["forward_steps"] < counts["static"]["forward_steps"]
    assert counts["continuous"]["slot_utilisation"] > counts["static"]["slot_utilisation"]
    assert counts["continuous, tight pool"]["preemptions"] > 0
    assert counts["continuous, prefix cache on"]["prefix_hit_blocks"] > 0
    assert COUNT_COLUMNS <= set(next(iter(counts.values())))
    timing = read_csv_rows(results / "serving" / "serve_timing.csv")
    assert timing[0]["quantity"] == "throughput" and timing[0]["ratio_low"] <= timing[0]["ratio_high"]
    rates = read_csv_rows(results / "serving" / "serve_rates.csv")
    assert {(row["policy"], row["fraction"]) for row in rates} == {(p, f) for p in ("static", "continuous")
                                                                   for f in SMALL_EXTRAS["serving"]["rate_fractions"]}
    lines = (results / "serving" / "serve_events.jsonl").read_text(encoding="utf-8").splitlines()
    assert {json.loads(line)["run"] for line in lines} == set(counts)
    for name in ("serve_timeline", "serve_latency"):
        figure = FIGURES[name]
        assert figure.drawn_by == "kvlab.present.serving_figures" and figure.category == "Beyond the lab"
        assert (course_build / figure.path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the report reads the tables and the JSON, not the events' JSON Lines
    assert {"serve_counts", "serve_trace", "serve_rates"} <= set(REPORT_READS) and "serve_events" not in REPORT_READS
    assert RESULTS["serve_events"].category is None


@pytest.mark.parametrize("language", ["ko", "en"])
def test_the_report_says_once_what_compiling_the_serving_steps_took(course_build, tmp_path, language):
    """beyond.md's serving section says, from compiled_steps.json, each compiled step's seconds and
    whether this build compiled it or loaded an earlier build's; nothing where the steps ran eager
    (the tests' build)."""
    from kvlab.facts.results import report_inputs
    from kvlab.present.report import render_report

    paths = {name: course_build / path for name, path in report_inputs().items()}
    template = ROOT / "templates" / "report" / "beyond.md.j2"
    eager = json.loads(paths["compiled_steps"].read_text(encoding="utf-8"))
    assert not eager["steps"]["engine"]["files"]
    assert "compile_steps" not in render_report(template, paths, language)
    kept = {"one_at_a_time": {"seconds": 26.24, "loaded": False, "files": ["a.pt2"]},
            "engine": {"seconds": 0.83, "loaded": True, "files": ["b.pt2"]}}
    paths["compiled_steps"] = tmp_path / "compiled_steps.json"
    paths["compiled_steps"].write_text(json.dumps({**eager, "steps": kept}), encoding="utf-8")
    report = render_report(template, paths, language)
    if language == "ko":
        assert "단일 요청 경로의 스텝: 이 빌드에서 컴파일함, 26.2초. 엔진의 스텝: 불러옴(앞선 빌드가 컴파일해 둔 것), 0.8초." in report
    else:
        assert ("the single-request path's step compiled here, 26.2 s; the engine's loaded (an earlier build "
                "compiled it), 0.8 s.") in report


def test_changing_the_rate_sweep_reruns_only_it_and_its_readers(course_build, course):
    config = course_config(course)
    serving = {**config["extras"]["serving"], "rate_fractions": [1.0]}
    config["extras"] = {**config["extras"], "serving": serving}
    # the sheet's report reads the trace's timings (it counts the disturbed ones), not the rates: only the report
    # beyond it is rendered again
    assert dry_run_jobs(course_build, config=config) == {"serve_rates": 1, "figure_serve_latency": 1, "beyond": 1,
                                                         "lab_report": 1, "all": 1}
    config["extras"]["serving"] = {**serving, "rate_fractions": [1.0, 2.0], "tight_blocks": 3}
    result = snakemake(course_build, "-n", config=config, check=False)
    assert result.returncode == 1
    assert (result.stdout + result.stderr).strip().splitlines()[-1].startswith(
        "config key 'extras.serving.tight_blocks': 3 blocks of 4 tokens cannot hold the trace's longest request")
