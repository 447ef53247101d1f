"""Beyond the lab sheet (rules/extras.smk): the curves against the lab's own files and formulas,
the capacity arithmetic, the figures and report sections, and the self-check on a good folder
and on a folder with one number altered. One tiny build, shared by the module."""
import base64
import json
import math
import os
import subprocess
import sys
import re
import shutil
import statistics
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib import font_manager

import kvlab.config as lab_config
from kvlab.grade import check
from kvlab.measure import curves, steps
from kvlab.present import beyond_figures, drawing, fonts, i18n, marks, sheet_figures, tables
from kvlab.measure.capacity import GIB, capacity_rows, vllm_line
from kvlab.engine.config import MiniMindConfig
from kvlab.facts.formulas import fed_formulas

from helpers import (ROOT, SMALL_LAB, assert_hangul_drawn_in_the_pages_own_face, chromium_and_playwright, course_config,
                     dry_run_jobs, png_text, random_model, snakemake)

def extras_config(course, **extras):
    config = course_config(course)
    config["extras"] = {**config["extras"], **extras}
    return config


@pytest.fixture(scope="module")
def built(course_build):
    """The shared build (tests/conftest.py): its config is extras_config(course)'s."""
    return course_build / "results"


def load(results, name):
    return json.loads((results / name).read_text(encoding="utf-8"))


# --- the curves, checked against the lab's files and formulas ---------------------------------


def test_sweep_measured_tokens_equal_the_formulas_at_every_n(built):
    sweep = pd.read_csv(built / "sweep.csv")
    prompt_len = load(built, "prompt.json")["prompt_len"]
    assert sweep["new_tokens"].tolist() == [2, 5, 9]
    for row in sweep.to_dict("records"):
        n = row["new_tokens"]
        assert row["prompt_len"] == prompt_len
        assert row["fed_with_cache"] == row["formula_with_cache"] == prompt_len + n - 1
        assert row["fed_without_cache"] == row["formula_without_cache"] == prompt_len * n + n * (n - 1) // 2
        assert row["same_ids"] and row["timed_runs"] == 1
        assert row["speedup"] == pytest.approx(row["without_cache_s"] / row["with_cache_s"])
        assert row["contention"] == "judged" and 0 < row["with_cache_cpu_share"] <= 1.05  # beside `unstable`
    runs = load(built, "sweep_runs.json")["by_new_tokens"]
    for row in sweep.to_dict("records"):
        timed = runs[str(row["new_tokens"])]
        assert bool(row["contended"]) == any(timed["summary"][mode]["contended"] for mode in timed["summary"])
        assert all(len(timed["usage"][mode]["wall_s"]) == timed["summary"][mode]["n"] for mode in timed["summary"])


def test_latency_steps_fit_and_prediction(built):
    latency, timing = load(built, "latency.json"), load(built, "time.json")
    p, n = latency["prompt_len"], latency["new_tokens"]
    assert n == SMALL_LAB["time"]["new_tokens"] and latency["repeats"] == 2
    with_cache, without_cache = latency["with_cache"], latency["without_cache"]
    assert with_cache["fed_tokens"] == [p] + [1] * (n - 1)
    assert without_cache["fed_tokens"] == list(range(p, p + n))
    assert sum(with_cache["fed_tokens"]) == fed_formulas(p, n)["with_cache"]
    assert sum(without_cache["fed_tokens"]) == fed_formulas(p, n)["without_cache"]
    for mode in (with_cache, without_cache):
        assert mode["context_tokens"] == list(range(p, p + n))
        assert len(mode["step_s"]) == n and min(mode["step_s"]) > 0
        assert mode["ttft_s"] == mode["step_s"][0]
        assert mode["tpot_s"] == statistics.median(mode["step_s"][1:])
    # one line through every step of both modes
    per_token, fixed = np.polyfit(with_cache["fed_tokens"] + without_cache["fed_tokens"],
                                  with_cache["step_s"] + without_cache["step_s"], 1)
    assert latency["fit"]["fixed_s"] == pytest.approx(fixed, rel=1e-6, abs=1e-9)
    assert latency["fit"]["per_token_s"] == pytest.approx(per_token, rel=1e-6, abs=1e-12)
    predicted = latency["predicted"]
    assert predicted["with_cache_s"] == pytest.approx(n * fixed + per_token * fed_formulas(p, n)["with_cache"])
    assert predicted["speedup"] == pytest.approx(predicted["without_cache_s"] / predicted["with_cache_s"])
    for mode in (with_cache, without_cache):  # each generation's clocks, and the contention they show
        assert len(mode["usage"]["wall_s"]) == mode["generate"]["n"] and mode["generate"]["contention"] == "judged"
    assert latency["measured"]["contended"] == (with_cache["generate"]["contended"] or without_cache["generate"]["contended"])
    assert n == load(built, "time_runs.json")["new_tokens"] and timing["speedup"] > 0  # step 3's generation


def test_kv_capacity_rows(built):
    rows = pd.read_csv(built / "kv_capacity.csv").to_dict("records")
    assert len(rows) == 2 * 2 * 2 * 2  # (lab model, tiny) x dtypes x budgets x contexts
    assert {row["model"] for row in rows} == {"lab pretrain", "tiny GQA"}
    for row in rows:
        element = 4 if row["dtype"] == "float32" else 2
        layers, kv_heads, head_dim = (4, 2, 32) if row["model"] == "lab pretrain" else (2, 2, 16)
        assert (row["layers"], row["kv_heads"], row["head_dim"]) == (layers, kv_heads, head_dim)
        assert row["bytes_per_token_formula"] == row["bytes_per_token_measured"] == 2 * layers * kv_heads * head_dim * element
        per_request = row["bytes_per_token_formula"] * row["context_tokens"]
        assert row["max_requests"] == int(row["budget_gib"] * GIB) // per_request
        assert row["vllm_line"].endswith(
            f"Maximum concurrency for {row['context_tokens']:,} tokens per request: {row['max_concurrency']:.2f}x")
    # 0.001 GiB (1,073,741 bytes) against 2,048 bytes per token in float32: 32 requests of 16 tokens, 5 of 100
    small = [r for r in rows if r["budget_gib"] == 0.001 and r["model"] == "lab pretrain" and r["dtype"] == "float32"]
    assert [r["max_requests"] for r in small] == [32, 5]


def test_topp_curve_agrees_with_the_lab_step(built):
    curve = pd.read_csv(built / "topp_curve.csv").to_dict("records")
    # the grid (step 0.25) and the lab sheet's own p values
    assert [row["p"] for row in curve] == [0.25, 0.5, 0.75, 0.9, 0.99, 1.0]
    topp, sharp = load(built, "topp.json"), load(built, "topp_sharp.json")
    at_lab_ps = {str(row["p"]): row for row in curve if row["lab_p"]}
    assert set(at_lab_ps) == set(topp)
    for key, row in at_lab_ps.items():
        assert row["flat"] == topp[key] and row["sharp"] == sharp["survivors"][key]
    for column in ("flat", "sharp"):
        values = [row[column] for row in curve]
        assert values == sorted(values) and values[0] >= 1
        assert values[-1] == curve[-1]["vocab_size"]  # at p = 1 generate skips top-p: every token stays


def test_temperature_curve_agrees_with_the_lab_step(built):
    curve = pd.read_csv(built / "temp_curve.csv").to_dict("records")
    # the grid (0.5 to 1.5 by 0.5) and the lab sheet's own temperatures (0.3 and 1.5), marked
    assert [row["temperature"] for row in curve] == [0.3, 0.5, 1.0, 1.5]
    assert [row["temperature"] for row in curve if row["lab_temperature"]] == SMALL_LAB["temp"]["temperatures"]
    # same question, samples, seed and rule as step 5: at the lab's temperatures the counts must be the lab's
    temp, answers = load(built, "temp.json"), load(built, "temp_curve_answers.json")["answers"]
    for row in curve:
        if row["lab_temperature"]:
            key = str(row["temperature"])
            assert row["distinct"] == temp[key]["distinct"]
            assert answers[key] == load(built, "temp_answers.json")["answers"][key]
    for row in curve:
        assert row["samples"] == 6 and row["distinct"] == len(set(answers[str(row["temperature"])]))
        assert 0 < row["mean_entropy_nats"] <= math.log(row["vocab_size"]) + 1e-6
        assert 6 <= row["sampled_tokens"] <= 6 * 5
    entropies = [row["mean_entropy_nats"] for row in curve]
    assert entropies == sorted(entropies)  # a hotter softmax is flatter


def test_figures_are_pngs_linked_from_the_report_beyond_the_sheet(built):
    report = (built / "report.md").read_text(encoding="utf-8")
    beyond = (built / "beyond.md").read_text(encoding="utf-8")
    for name in ("cost_curves", "step_times", "topp_survivors", "temperature_effect"):
        path = built / "figures" / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"](figures/{name}.png)" in beyond and f"figures/{name}.png" not in report
    for heading in ("## KV 캐시", "## 온도", "## top-p"):
        assert heading in report
    assert "## 서빙에서" in beyond and "## 서빙에서" not in report  # the chain into serving is beyond the sheet
    for heading in ("## 비용 곡선", "## 지연 시간 분해", "## 모든 p에서의 top-p, 촘촘한 온도"):
        assert heading in beyond and heading not in report
    assert "`results/beyond.md`" in report


@pytest.fixture(scope="module")
def html_report(built, course):
    """The README's command as printed: no --cores."""
    snakemake(built.parent, "--report", "results/report.html", config=extras_config(course), cores=None)
    return built / "report.html"


def test_html_report_holds_every_marked_result(html_report):
    html = html_report.read_text(encoding="utf-8")
    for name in ("same.json", "count.json", "time.json", "kvbytes.json", "temp.json", "topp.json",
                 "report.md", "beyond.md", "lab_report.html", "sweep.csv", "latency.json", "kv_capacity.csv", "topp_curve.csv",
                 "temp_curve.csv", "cost_curves.png", "step_times.png", "topp_survivors.png",
                 "temperature_effect.png", "lab_tables.html", "explore.html"):
        assert name in html
    # the sidebar's categories in the report's language (Korean here; the page keeps them as JSON strings)
    ko = i18n.gettext_for("ko")
    for name in ("Beyond the lab", "Lab sheet", "Lab report"):
        assert ko(name) != name and json.dumps(ko(name))[1:-1] in html, name


def figures_linked(results) -> int:
    """How many figures results/report.md and results/beyond.md link to (`![...](figures/...)`)."""
    return sum(len(re.findall(r"!\[[^\]]*\]\(figures/", (results / name).read_text(encoding="utf-8")))
               for name in ("report.md", "beyond.md"))


def test_the_html_report_opens_on_the_lab_and_shows_the_lab_report_in_a_browser(html_report):
    """As a teacher opens it: the front page is about the lab, in the report's language (ko here), its
    link opens the lab's reports in the page, their sections and eight figures loaded, in their own font; its other
    link opens the lab's page (results/explore.html), its script running."""
    executable, sync_playwright = chromium_and_playwright("the HTML report")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(html_report.as_uri())
            front = page.locator("body")
            front.get_by_text("KV 캐시와 샘플링").first.wait_for(timeout=30_000)
            # the sidebar's category and the front page's name for it, in the report's language
            assert i18n.gettext_for("ko")("Lab report") in front.inner_text() and "보고서 열기" in front.inner_text()
            assert "System Message" not in front.inner_text()  # the front page's reStructuredText is clean
            # its Hangul drawn in the face it carries (results/front_page_font.html), not the machine's
            assert_hangul_drawn_in_the_pages_own_face(page, ".document h1")
            page.get_by_text("보고서 열기", exact=True).first.click()  # the front page's link opens the report
            shown = page.frame_locator("iframe").first
            shown.locator("h2").first.wait_for(timeout=30_000)
            headings = shown.locator("h2").all_inner_texts()
            assert {"KV 캐시", "온도", "top-p"} <= set(headings) and "비용 곡선" in headings  # both reports
            # the page carries its Hangul font: the headings are drawn in it, whatever the machine has
            family = shown.locator("h2").first.evaluate("h => getComputedStyle(h).fontFamily")
            assert family.startswith('"kvlab NanumGothic"'), family
            assert shown.locator("body").evaluate("b => document.fonts.check('16px \"kvlab NanumGothic\"', '캐시')")
            images = shown.locator("img")
            assert images.count() == figures_linked(html_report.parent) >= 8  # every figure the reports show
            loaded = images.evaluate_all("images => images.map(image => image.complete && image.naturalWidth > 0)")
            assert all(loaded), loaded
            alt_texts = " ".join(images.evaluate_all("images => images.map(image => image.alt)"))
            assert HANGUL.search(alt_texts), alt_texts  # the figures of a Korean report
            assert "measured_bytes" in shown.locator("body").inner_text()
            # the front page's other link opens the lab's page, its script running inside the report
            page.goto(html_report.as_uri())
            page.get_by_text("실험 페이지 열기", exact=True).first.click()
            explore = page.frame_locator("iframe").first
            explore.locator("body[data-ready=true]").wait_for(timeout=30_000)
            assert explore.locator("#grid-rows .cell").count() > 0
        finally:
            browser.close()


@pytest.mark.parametrize("name, selector", [("lab_tables.html", "h1"), ("lab_report.html", "h2")])
def test_the_pages_draw_their_hangul_in_the_face_they_carry(built, name, selector):
    """Issue 38: on a machine without a Korean font, a page that names only the machine's fonts shows
    boxes. Each page carries NanumGothic cut to its characters, under a family no installed font has,
    and Chromium draws its Hangul with it (a web font), whatever the machine has."""
    executable, sync_playwright = chromium_and_playwright(name)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto((built / name).as_uri())
            assert_hangul_drawn_in_the_pages_own_face(page, selector)
        finally:
            browser.close()


def embedded_result(html: str, path: str) -> tuple[str, str]:
    """The mime type and the decoded content of one result embedded in the HTML report."""
    results = json.loads(re.search(r"var results = (\{.*?\});\n", html).group(1))
    entry = results[path]
    header, payload = entry["data_uri"].split(",", 1)
    return entry["mime_type"], base64.b64decode(payload).decode("utf-8")


def test_html_report_shows_every_lab_result_in_the_page(built, html_report):
    """The sheet's six files are readable in the report: lab_tables.html, an HTML page the report
    embeds and shows, holds each file's keys with their values, in the report's language."""
    mime, page = embedded_result(html_report.read_text(encoding="utf-8"), "results/lab_tables.html")
    assert "<h1>실험지의 결과</h1>" in page and "2단계: forward에 넣은 토큰 수" in page
    assert mime == "text/html"
    count = load(built, "count.json")
    formulas = fed_formulas(count["prompt_len"], count["new_tokens"])
    for stem in ("same", "count", "time", "kvbytes", "temp", "topp"):
        data = load(built, f"{stem}.json")
        table = page.split(f'<table id="{stem}.json">')[1].split("</table>")[0]
        for key, value in data.items():
            assert f"<code>{key}</code></td><td class=\"value\">{tables.cell(value)}</td>" in table, (stem, key)
    assert f"{count['fed_without_cache']:,}" in page and f"{formulas['without_cache']:,}" in page
    assert f"{load(built, 'kvbytes.json')['measured_bytes']:,}" in page


def test_cell_formats():
    assert tables.cell(14880) == "14,880" and tables.cell(True) == "true" and tables.cell([1, 100, 2, 32]) == "[1, 100, 2, 32]"
    assert tables.cell({"distinct": 3}) == "3" and tables.cell(0.123456789) == "0.123457"
    assert tables.cell("<b>") == '"<b>"'  # escaped by the template, not here


def test_lab_tables_escape_html(tmp_path):
    """A value that looks like markup is shown as text: the template autoescapes."""
    paths = {}
    for stem, data in {"same": {"same_ids": True, "ids": [1], "prompt_len": 3, "new_tokens": 1},
                       "counts": {"prompt_len": 3, "new_tokens": 1, "fed_with_cache": 3, "fed_without_cache": 3},
                       "time": {"with_cache_s": 1.0, "without_cache_s": 2.0, "speedup": 2.0},
                       "kvbytes": {"tokens": 1, "measured_bytes": 8, "formula_bytes": 8, "k_shape": [1, 1, 1, 1]},
                       "temp": {"<script>": {"distinct": 1}}, "topp": {"0.5": 1}}.items():
        paths[stem] = tmp_path / f"{stem}.json"
        paths[stem].write_text(json.dumps(data), encoding="utf-8")
    page = tables.render_tables(ROOT / "templates" / "lab_tables.html.j2", paths, "en")
    assert "<script>" not in page and "&lt;script&gt;" in page


@pytest.mark.parametrize("command", [["--report", "results/report.html"], ["--dag"], ["--rulegraph"], ["--lint"],
                                     ["-n"], ["--summary"], ["-n", "--forceall"]])
def test_commands_that_run_no_job_need_no_cores_and_no_pytorch(built, course, command, tmp_path):
    """As a newcomer types them after a build: no --cores (the timing rules' threads used to need it).
    And with `import torch` made to fail: Snakemake's own process neither imports PyTorch nor loads a
    checkpoint (the course's files are configured; the inspection jobs read them)."""
    poisoned = tmp_path / "no_torch" / "torch"
    poisoned.mkdir(parents=True)
    (poisoned / "__init__.py").write_text("raise ImportError('a command that runs no job imported torch')\n")
    env = {**os.environ, "PYTHONPATH": str(poisoned.parent)}
    assert subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True).returncode != 0
    result = snakemake(built.parent, *command, config=extras_config(course), cores=None, check=False, env=env)
    output = result.stdout + result.stderr
    assert "number of cores" not in output and "Traceback" not in output, output[-3000:]
    assert "imported torch" not in output, output[-3000:]
    if command == ["--lint"]:
        # --lint exits 1 when it has advice; the only advice may be the one this pip-installed
        # workflow does not take (a conda environment or container per rule)
        advice = {line.strip() for line in output.splitlines() if line.startswith("    * ")}
        assert advice == {"* Specify a conda environment or container for each rule.:"}, output[-3000:]
    else:
        assert result.returncode == 0, output[-3000:]


def test_the_report_tools_come_with_the_plain_install():
    """`pip install -e .` (no extras) brings what `snakemake --report` and the Korean figures need."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower() for requirement in project["dependencies"]}
    assert {"pygments", "jinja2", "koreanize-matplotlib"} <= names, names


# --- the figures' language --------------------------------------------------------------------------

HANGUL = re.compile("[\uac00-\ud7a3]")


def test_figures_are_korean_in_a_korean_build(built):
    """report.language ko (config.yaml's): titles, axes and legends in Hangul, drawn in NanumGothic,
    and no glyph missing from the fonts in any figure's log."""
    for name in ("cost_curves", "step_times", "topp_survivors", "temperature_effect", "compare"):
        text = png_text(built / "figures" / f"{name}.png")
        assert HANGUL.search(text["Title"]) and HANGUL.search(text["Description"]), (name, text)
        log = (built / "logs" / f"figure_{name}.log").read_text(encoding="utf-8")
        assert "missing from" not in log and "findfont" not in log, log


def test_english_figures_rerun_only_the_figures_and_the_report(built, course):
    config = extras_config(course) | {"report": {"language": "en"}}
    jobs = dry_run_jobs(built.parent, config=config)
    assert jobs == {"figure_cost_curves": 1, "figure_step_times": 1, "figure_topp_survivors": 1,
                    "figure_temperature_effect": 1, "figure_compare": 1, "figure_batch": 1, "figure_kv_waste": 1,
                    "figure_kv_dtype": 1, "figure_step_anatomy": 1, "figure_serve_timeline": 1, "figure_serve_latency": 1,
                    "lab_tables": 1, "report": 1, "beyond": 1, "lab_report": 1, "explore": 1, "check": 1, "all": 1}, jobs


SAVE = drawing.save


def drawn(monkeypatch, function, data, path, language="en"):
    """The matplotlib figure `function` drew (save() closes it; what it holds stays readable)."""
    kept = []
    module = sys.modules[function.__module__]  # the figure module's own name for save
    monkeypatch.setattr(module, "save", lambda fig, path, **options: (kept.append(fig), SAVE(fig, path, **options)))
    function(data, path, language=language)
    return kept[0]


def cost_curves_label_the_cached_points(fig, rows):
    """The log axis of tokens fed has a labelled tick at or under the cached points, inside the view."""
    axis = fig.axes[0]
    low = axis.get_ylim()[0]
    labelled = [tick for tick in axis.get_yticks() if low <= tick <= min(row["fed_with_cache"] for row in rows)]
    assert labelled, (axis.get_yticks(), axis.get_ylim())


def step_times_predict_each_step_from_its_own_fed_tokens(fig, latency):
    """On the context axes, the fit's predictions are drawn at each step's context from the tokens it
    was fed (one with the cache); the fit's line is on the axes of tokens fed."""
    fit = latency["fit"]
    by_context, by_fed = fig.axes
    predictions = [line for line in by_context.get_lines() if line.get_marker() == "_"]
    assert len(predictions) == 2
    for line, mode in zip(predictions, ("without_cache", "with_cache")):
        assert list(line.get_xdata()) == list(latency[mode]["context_tokens"])
        expected = [(fit["fixed_s"] + fit["per_token_s"] * fed) * 1000 for fed in latency[mode]["fed_tokens"]]
        assert np.allclose(line.get_ydata(), expected)
    assert [line for line in by_fed.get_lines() if line.get_linestyle() == "--"]
    # the fit once in the legend (its line and its predictions as one entry), its formula said once
    assert sum("µs" in text.get_text() for text in fig.legends[0].get_texts()) == 1


def lab_values_marked(fig, rows, column, lab_column):
    """Every axes marks exactly the lab sheet's values with its dashed lines."""
    lab = sorted(row[column] for row in rows if row[lab_column])
    assert lab
    for axis in fig.axes:
        assert sorted(line.get_xdata()[0] for line in axis.get_lines() if line.get_gid() == sheet_figures.LAB_VALUE) == lab


def compare_names_the_token_ratio_for_what_it_is(fig, rows):
    described = "\n".join(drawing.drawn_text(fig)[1])
    assert "proportional" in described and "ceiling" not in described and "bound" not in described


def batch_draws_b_linearly(fig, rows):
    assert [axis.get_xscale() for axis in fig.axes] == ["linear", "linear"]
    measured = sorted({row["B"] for row in rows})
    for axis in fig.axes:  # every B measured ticked and labelled, B = 2 among them
        assert list(axis.get_xticks()) == measured
        assert [label.get_text() for label in axis.get_xticklabels()] == [str(b) for b in measured]


def kv_waste_draws_the_paper_range(fig, rows):
    """The paper's existing systems are a band from 20.4% to 38.2%, not a bar from zero."""
    (band,) = [patch for patch in fig.axes[0].patches if patch.get_gid() == beyond_figures.PAPER_RANGE]
    low, high = beyond_figures.VLLM_PAPER["existing_token_share"]
    assert band.get_y() == pytest.approx(low * 100) and band.get_height() == pytest.approx((high - low) * 100)
    assert "20.4" in "\n".join(drawing.drawn_text(fig)[1])
    ticks = [label.get_text() for label in fig.axes[0].get_xticklabels()]
    assert not {row["policy"] for row in rows} & set(ticks)  # the policies in words, not their code names


# what each figure must show (issue 30), checked on the English drawing
MENDED = {"cost_curves": cost_curves_label_the_cached_points,
          "step_times": step_times_predict_each_step_from_its_own_fed_tokens,
          "topp_survivors": lambda fig, rows: lab_values_marked(fig, rows, "p", "lab_p"),
          "temperature_effect": lambda fig, rows: lab_values_marked(fig, rows, "temperature", "lab_temperature"),
          "compare": compare_names_the_token_ratio_for_what_it_is,
          "batch": batch_draws_b_linearly,
          "kv_waste": kv_waste_draws_the_paper_range}


@pytest.mark.parametrize("language", ["en", "ko"])
def test_each_figure_in_each_language_without_missing_glyphs(built, tmp_path, monkeypatch, language):
    draw = {"cost_curves": (sheet_figures.cost_curves, pd.read_csv(built / "sweep.csv").to_dict("records")),
            "step_times": (sheet_figures.step_times, load(built, "latency.json")),
            "topp_survivors": (sheet_figures.topp_survivors, pd.read_csv(built / "topp_curve.csv").to_dict("records")),
            "temperature_effect": (sheet_figures.temperature_effect, pd.read_csv(built / "temp_curve.csv").to_dict("records")),
            "compare": (beyond_figures.compare, pd.read_csv(built / "compare.csv").to_dict("records")),
            "batch": (beyond_figures.batch, pd.read_csv(built / "batch.tsv", sep="\t").to_dict("records")),
            "kv_waste": (beyond_figures.kv_waste, pd.read_csv(built / "kv_waste.csv").to_dict("records")),
            "step_anatomy": (beyond_figures.step_anatomy, load(built, "step_anatomy.json"))}
    for name, (function, data) in draw.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a missing glyph is a warning: fail on it
            fig = drawn(monkeypatch, function, data, tmp_path / f"{name}.png", language=language)
        if language == "en" and name in MENDED:
            MENDED[name](fig, data)
        text = png_text(tmp_path / f"{name}.png")
        described = text["Description"]
        if name == "topp_survivors":  # the legend quotes the prefixes themselves, not their config keys
            rows = draw[name][1]
            assert f'"{rows[0]["flat_prefix"]}"' in described and f'"{rows[0]["sharp_prefix"]}"' in described
            assert "lab.topp" not in described
            described = described.replace(rows[0]["flat_prefix"], "").replace(rows[0]["sharp_prefix"], "")
        if language == "en":
            assert not HANGUL.search(text["Title"] + described) and text["Title"].isascii(), text
        else:
            assert HANGUL.search(text["Title"]), text
            legends = [t.get_text() for axis in fig.axes if axis.get_legend() for t in axis.get_legend().get_texts()]
            assert not [t for t in legends if re.match(r"(shared|distinct)\b", t)], legends  # the modes in Korean


# a timed figure: its result file and each row's points, where the reports' mark goes when the row's
# timing is disturbed
TIMED_FIGURES = {
    "cost_curves": (sheet_figures.cost_curves, "sweep.csv",
                    lambda row: [(row["new_tokens"], row["with_cache_s"]), (row["new_tokens"], row["without_cache_s"])]),
    "batch": (beyond_figures.batch, "batch.tsv", lambda row: [(row["B"], row["S_TG t/s"]), (row["B"], row["ms_per_step"])]),
    "compare": (beyond_figures.compare, "compare.csv", lambda row: [(row["parameters"], row["speedup"])]),
}


def disturbed_marks(fig) -> list:
    return sorted(tuple(float(v) for v in text.xy) for ax in fig.axes for text in ax.texts
                  if text.get_gid() == drawing.DISTURBED)


def legend_texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()] + \
        [t.get_text() for legend in fig.legends for t in legend.get_texts()]


@pytest.mark.parametrize("figure", sorted(TIMED_FIGURES))
def test_a_disturbed_timing_carries_the_reports_mark_where_its_figure_draws_it(built, tmp_path, monkeypatch, figure):
    """The figure draws the reports' mark beside the points of the one timing made disturbed, and says in
    its legend what the mark means; a figure of quiet timings draws neither."""
    function, source, points = TIMED_FIGURES[figure]
    rows = pd.read_csv(built / source, sep="\t" if source.endswith(".tsv") else ",").to_dict("records")
    for row in rows:
        row.update(unstable=False, contended=False)
    explained = drawing.COMMON_LABELS["disturbed"]
    fig = drawn(monkeypatch, function, rows, tmp_path / "quiet.png")
    assert disturbed_marks(fig) == [] and explained not in legend_texts(fig)
    rows[len(rows) // 2]["unstable"] = True
    fig = drawn(monkeypatch, function, rows, tmp_path / "disturbed.png")
    assert disturbed_marks(fig) == sorted((float(x), float(y)) for x, y in points(rows[len(rows) // 2]))
    assert explained in legend_texts(fig)


def test_the_marks_in_the_anatomy_and_the_step_times_follow_their_timings(built, tmp_path, monkeypatch):
    """The opened step and the context curve mark the timings flagged and no other; the per-step figure
    marks the TTFT and TPOT of the mode whose generations were disturbed."""
    data = load(built, "step_anatomy.json")
    anatomy, curve = data["anatomy"], data["curve"]
    for name in anatomy["steps"]:
        anatomy[name]["step"].update(unstable=False, contended=False)
    for kind in curve["kinds"]:
        for row in curve[kind]["steps"]:
            row.update(unstable=False, contended=False)
    anatomy["without_cache"]["step"]["unstable"] = True
    kind = curve["kinds"][-1]
    curve[kind]["steps"][0]["unstable"] = True
    fig = drawn(monkeypatch, beyond_figures.step_anatomy, data, tmp_path / "step_anatomy.png")
    assert disturbed_marks(fig) == sorted([(float(anatomy["without_cache"]["step_ms"]), 0.4),
                                           (float(curve["contexts"][0]), float(curve[kind]["step_ms"][0]))])
    latency = load(built, "latency.json")
    for label in ("with_cache", "without_cache"):
        latency[label]["generate"].update(unstable=False, contended=False)
    latency["without_cache"]["generate"]["unstable"] = True
    fig = drawn(monkeypatch, sheet_figures.step_times, latency, tmp_path / "step_times.png")
    marked = [text for text in legend_texts(fig) if text.endswith(marks.SIGN)]
    assert len(marked) == 2 and all(text.startswith("without cache") for text in marked), legend_texts(fig)
    assert drawing.COMMON_LABELS["disturbed"] in legend_texts(fig)


def test_anatomy_figure_gives_the_cached_steps_an_axis_of_their_own(built, tmp_path, monkeypatch):
    """However long the uncached step (here made ten times longer), the cached steps' axis runs to
    their own length, so that their parts stay readable."""
    data = load(built, "step_anatomy.json")
    uncached = data["anatomy"]["without_cache"]
    uncached["ms"] = {part: ms * 10 for part, ms in uncached["ms"].items()}
    uncached["step_ms"] *= 10
    uncached["step"] = {**uncached["step"], "q1_s": uncached["step"]["q1_s"] * 10, "q3_s": uncached["step"]["q3_s"] * 10}
    fig = drawn(monkeypatch, beyond_figures.step_anatomy, data, tmp_path / "step_anatomy.png")
    cached_axis, uncached_axis = fig.axes[:2]
    cached = [data["anatomy"][name] for name in ("with_cache_cat", "with_cache_static")]
    longest = max(max(sum(step["ms"].values()), step["step"]["q3_s"] * 1e3) for step in cached)
    assert [label.get_text() for label in cached_axis.get_yticklabels()] == ["with cache (torch.cat)",
                                                                            "with cache (preallocated)"]
    assert cached_axis.get_xlim()[1] == pytest.approx(1.9 * longest)
    assert uncached_axis.get_xlim()[1] > sum(uncached["ms"].values()) > cached_axis.get_xlim()[1]


def test_the_hangul_font_is_the_packaged_nanumgothic():
    """The figures' NanumGothic is the package's own file, registered with matplotlib, so a machine
    without a Korean system font draws Hangul too (with Debian's fonts-nanum installed matplotlib may
    pick that copy of the same font: either is NanumGothic)."""
    assert drawing.font_families("ko")[:1] == ["NanumGothic"]
    packaged = fonts.hangul_font_path()
    assert packaged.parent.parent.name == "koreanize_matplotlib"
    assert packaged in {Path(entry.fname) for entry in font_manager.fontManager.ttflist if entry.name == "NanumGothic"}
    found = font_manager.findfont(font_manager.FontProperties(family="NanumGothic"), fallback_to_default=False)
    assert Path(found).name == "NanumGothic.ttf"
    assert drawing.font_families("en") == ["DejaVu Sans", "NanumGothic"]  # the Korean prefixes it quotes
    with pytest.raises(ValueError, match="report.language"):
        drawing.font_families("fr")


def test_without_the_font_package_ko_says_what_to_install(monkeypatch):
    monkeypatch.setattr(fonts.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="pip install koreanize-matplotlib"):
        fonts.hangul_font_path()


def test_progress_lines_in_the_sweep_log(built):
    log = (built / "logs" / "sweep.log").read_text(encoding="utf-8")
    assert "[1/3] N=2" in log and "[3/3] N=9" in log


# --- the self-check -----------------------------------------------------------------------------


def test_check_passes_on_the_build(built):
    result = load(built, "check.json")
    assert result["ok"], check.verdict_table(result)
    assert list(result["rules"]) == ["files", "same_ids", "fed_with_cache", "fed_without_cache", "cache_faster",
                                     "kv_bytes", "temp", "topp", "report_headings", "report_speedup",
                                     "report_measured_bytes"]


def alter(folder, name, change):
    """Rewrite one JSON file of `folder` after `change(data)`."""
    data = json.loads((folder / name).read_text(encoding="utf-8"))
    change(data)
    (folder / name).write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="module")
def grader(course_build, tmp_path_factory):
    """A copy of the build (times kept: up to date), where an instructor checks students' folders; the
    build's own check files as they were before, {path: (bytes, mtime)}."""
    # at the build's depth: the workflow's templates are inputs named relative to the working folder
    workdir = shutil.copytree(course_build, tmp_path_factory.mktemp("grader"), symlinks=True, dirs_exist_ok=True)
    own = [workdir / "results" / "check.json", *(workdir / "results" / "logs").glob("check.*")]
    return workdir, {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in own}


def check_folder(grader, course, student):
    """`snakemake check` with extras.check.results_dir at `student`, in the grader's copy of the build:
    the run, the verdicts of its log (kept when it fails) and its output's path."""
    workdir, own = grader
    config = extras_config(course, check={"results_dir": str(student)})
    run = snakemake(workdir, "check", config=config, check=False)
    name = lab_config.folder_name(config)
    verdicts = json.loads((workdir / "results" / "logs" / "check" / f"{name}.json").read_text(encoding="utf-8"))
    # the build's own check is never touched: not overwritten, not deleted on a failure
    assert {path: (path.read_bytes(), path.stat().st_mtime_ns) for path in own} == own
    return run, verdicts, workdir / "results" / "check" / f"{name}.json"


@pytest.mark.parametrize("name, change, rules", [
    (None, None, None),
    ("count.json", lambda d: d.update(fed_without_cache=d["fed_without_cache"] + 1), ["fed_without_cache"]),
    ("kvbytes.json", lambda d: d.update(formula_bytes=d["formula_bytes"] + 4), ["kv_bytes"]),
    ("temp.json", None, ["files", "temp"]),  # not handed in: a verdict, not Snakemake's missing input
], ids=["untouched", "fed_tokens", "formula_bytes", "missing_file"])
def test_check_on_a_copied_folder(built, course, grader, tmp_path, name, change, rules):
    """As an instructor runs it: `snakemake check` with extras.check.results_dir pointing at a folder,
    held to the answer key (this build's results); its verdicts in results/check/NAME.json."""
    student = tmp_path / "student"
    shutil.copytree(built, student, ignore=shutil.ignore_patterns("logs", "benchmarks", "figures", "check*"))
    if name and change:
        alter(student, name, change)
    elif name:
        (student / name).unlink()
    run, verdicts, output = check_folder(grader, course, student)
    assert verdicts["results_dir"] == str(student)
    assert "held to the answer key: results/temp.json, results/topp.json, results/kvbytes.json" in run.stdout
    if rules is None:
        assert run.returncode == 0 and verdicts["ok"], run.stdout + run.stderr
        assert json.loads(output.read_text(encoding="utf-8")) == verdicts
    else:
        assert run.returncode != 0 and not output.exists()
        assert f"FAILED: {', '.join(rules)}" in run.stdout and f"check failed: {rules[0]} (" in run.stderr
        assert [r for r, v in verdicts["rules"].items() if not v["ok"]] == rules


def test_check_fails_a_folder_weighed_after_repeat_kv(built, course, grader, tmp_path):
    """The sheet's own named mistake: the cache weighed after repeat_kv (attention heads, not KV heads),
    its bytes and formula agreeing. Each file alone is consistent, so only the key (this build's
    kvbytes.json on the same checkpoint) shows it: `check` fails kv_bytes and says why."""
    student = tmp_path / "student"
    shutil.copytree(built, student, ignore=shutil.ignore_patterns("logs", "benchmarks", "figures", "check*"))
    kv, model = load(built, "kvbytes.json"), load(built / "checkpoints", "pretrain.json")["config"]
    n_rep = model["num_attention_heads"] // model["num_key_value_heads"]
    assert n_rep > 1  # the course's model: 4 attention heads, 2 KV heads
    batch, tokens, kv_heads, head_dim = kv["k_shape"]
    repeated = {**kv, "k_shape": [batch, tokens, kv_heads * n_rep, head_dim],
                "measured_bytes": kv["measured_bytes"] * n_rep, "formula_bytes": kv["formula_bytes"] * n_rep}
    (student / "kvbytes.json").write_text(json.dumps(repeated), encoding="utf-8")
    report = (student / "report.md").read_text(encoding="utf-8")
    written = f"{kv['measured_bytes']:,}"
    assert written in report
    (student / "report.md").write_text(report.replace(written, f"{repeated['measured_bytes']:,}"), encoding="utf-8")
    settings = check.Settings(tuple(SMALL_LAB["temp"]["temperatures"]), SMALL_LAB["temp"]["samples"],
                              tuple(SMALL_LAB["topp"]["ps"]))
    assert check.check_results(student, settings)["ok"]  # without the key, nothing is wrong with it
    run, verdicts, output = check_folder(grader, course, student)
    assert run.returncode != 0 and not output.exists()
    assert [r for r, v in verdicts["rules"].items() if not v["ok"]] == ["kv_bytes"]
    assert "FAILED: kv_bytes" in run.stdout and "check failed: kv_bytes (" in run.stderr
    assert f"k_shape has {kv_heads * n_rep} heads: the shape after repeat_kv" in verdicts["rules"]["kv_bytes"]["detail"]


# --- the package functions, without Snakemake --------------------------------------------------


def test_grid_lands_on_its_end():
    assert curves.grid(0.05, 1.0, 0.05)[-1] == 1.0 and len(curves.grid(0.05, 1.0, 0.05)) == 20
    assert curves.grid(0.1, 2.0, 0.1)[:3] == [0.1, 0.2, 0.3] and len(curves.grid(0.1, 2.0, 0.1)) == 20
    with pytest.raises(ValueError):
        curves.grid(1.0, 0.5, 0.1)


def test_fit_recovers_a_line():
    fed = [10, 11, 12, 13, 14]
    fit = curves.fit_step_cost(fed, [0.002 + 1e-5 * x for x in fed])
    assert fit["fixed_s"] == pytest.approx(0.002) and fit["per_token_s"] == pytest.approx(1e-5)
    assert fit["r2"] == pytest.approx(1.0)
    assert curves.predict_time([10, 1, 1], fit) == pytest.approx(3 * 0.002 + 12 * 1e-5)


def test_recording_forward_records_lengths_and_times_and_counting_forward_still_counts():
    model = random_model(0)
    prompt = torch.tensor([[1, 5, 6, 7]])
    with steps.recording_forward(model) as calls:
        model.generate(prompt, max_new_tokens=3, use_cache=True, **steps.GREEDY_NO_EOS)
    assert calls.fed_lengths == [4, 1, 1] and len(calls.seconds) == 3 and min(calls.seconds) > 0
    with steps.counting_forward(model) as lengths:
        model.generate(prompt, max_new_tokens=3, use_cache=False, **steps.GREEDY_NO_EOS)
    assert lengths == [4, 5, 6]
    assert "forward" not in vars(model)  # the wrapper is gone


def test_sampled_entropy_matches_a_direct_computation():
    model = random_model(0)
    prompt = torch.tensor([[1, 5, 6, 7]])
    entropy = curves.SampledEntropy(0.7, eos_id=None)
    with steps.recording_forward(model, observe=entropy):
        torch.manual_seed(0)
        out = model.generate(prompt, max_new_tokens=3, temperature=0.7, do_sample=True, top_k=0, top_p=1.0,
                             num_return_sequences=2, eos_token_id=None)
    with torch.inference_mode():
        logits = model(out[:, :-1]).logits[:, 3:, :] / 0.7  # the three positions that drew a token
    probs = torch.softmax(logits.float(), dim=-1)
    expected = float(-(probs * probs.log()).sum(-1).mean())
    assert entropy.tokens == 6 and entropy.mean_nats == pytest.approx(expected, rel=1e-4)


def test_capacity_arithmetic():
    config = MiniMindConfig(hidden_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4)
    per_token = {"formula": 2 * 8 * 4 * 96 * 2, "measured": 12288.0}
    rows = capacity_rows("MiniMind", config, "float16", per_token, [32768], [80])
    assert rows[0]["max_requests"] == 80 * GIB // (12288 * 32768) == 213
    assert rows[0]["vllm_line"] == vllm_line(80 * GIB // 12288, 32768, 80 * GIB / (12288 * 32768))
    assert rows[0]["vllm_line"] == ("KV cache size: 6,990,506 tokens, "
                                    "Maximum concurrency for 32,768 tokens per request: 213.33x")


def test_check_reports_missing_files_and_keys(tmp_path):
    (tmp_path / "count.json").write_text(json.dumps({"prompt_len": 5}), encoding="utf-8")
    result = check.check_results(tmp_path, check.Settings((0.3, 1.0, 1.5), 30, (0.5, 0.9, 0.99)))
    assert not result["ok"]
    assert result["rules"]["fed_with_cache"]["detail"] == "count.json has no key 'new_tokens'"
    assert result["rules"]["same_ids"]["detail"] == "same.json is missing"
    assert "FAILED: files, same_ids, fed_with_cache," in check.verdict_table(result)


def test_the_report_page_holds_its_figures_and_escapes_what_the_model_wrote(built, tmp_path):
    from kvlab.present.pages import report_page

    figure_paths = sorted((built / "figures").glob("*.png"))
    template, font = ROOT / "templates" / "lab_report.html.j2", fonts.hangul_font_path()
    page = report_page(template, [built / "report.md", built / "beyond.md"], figure_paths, font, "ko")
    assert page.count('src="data:image/png;base64,') == figures_linked(built) >= 8 and 'src="figures/' not in page
    assert '<html lang="ko">' in page and "<h2>KV 캐시</h2>" in page and "<table>" in page
    assert page.index("<h2>KV 캐시</h2>") < page.index("<h2>비용 곡선</h2>")  # the sheet's report first
    # the Hangul font travels with the page, cut to its characters (the whole face is 4.7 MB)
    font_data = page.split('src: url(data:font/ttf;base64,')[1].split(")")[0]
    assert 1_000 < len(font_data) < 1_000_000
    # a model's answer (in a code span of the report's table) is text, never markup
    markdown_file = tmp_path / "report.md"
    markdown_file.write_text("# T\n\n| a |\n|---|\n| `<script>alert(1)</script>` |\n", encoding="utf-8")
    page = report_page(template, [markdown_file], [], font, "en")
    assert "<script>" not in page and "&lt;script&gt;" in page and "<title>T</title>" in page


def test_the_ttft_difference_is_told_from_the_prefill_timed_alone(built, tmp_path):
    """Where the generations' TTFTs differ, the report reads the prefill timed alone in both modes, in
    alternation: within its spread the difference is the order's, outside it the two calls' own."""
    from kvlab.facts.results import report_inputs
    from kvlab.present.report import render_report

    paths = {name: built / path.removeprefix("results/") for name, path in report_inputs((), "beyond").items()}
    latency = json.loads(paths["latency"].read_text(encoding="utf-8"))
    assert latency["prefill_alone"]["pairs"] >= 5
    latency["ttft_agree"] = False
    for (ratio, low, high), said in (((1.0, 0.9, 1.1), "cannot tell them apart"),
                                     ((1.5, 1.4, 1.6), "do not cost the same")):
        latency["prefill_alone"]["ratio"] = {"ratio": ratio, "low": low, "high": high, "contended": False}
        changed = tmp_path / "latency.json"
        changed.write_text(json.dumps(latency), encoding="utf-8")
        text = render_report(ROOT / "templates" / "report" / "beyond.md.j2", {**paths, "latency": changed}, "en")
        assert said in text and "artefact" not in text
