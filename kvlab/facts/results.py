"""Every file the workflow writes for a reader, declared once: its name, path, caption and place in
`snakemake --report`. The rules (their outputs, `rule all`, the figure rules), `scripts/figure.py`,
the report's inputs and the tests read these; nothing else spells a result's path.

One name a result, from rule to file to caption: the result `latency` is written by rule `latency` to
`results/latency.json`, captioned by `report/latency.rst`, and read by the report as `latency`. A
figure is named by its file: `step_times` is drawn by rule `figure_step_times`, by the function
`step_times` of its drawing module, to `results/figures/step_times.png`, captioned by
`report/figures/step_times.rst`, from the result its `data` names. Four names depart from their
files or rules, each for a reason outside the workflow: step 2's `counts` (the sheet names the file
count.json, and Snakemake reserves `count`), the class page's `class_page` (results/class/class.html),
`folder_check`, written by rule `check` when it checks another folder than this build's
(results/check/{folder}.json, the folder's name filled in by kvlab.config.check_output), so that a
student's folder never overwrites the build's own results/check.json, and `serve_bench`
(results/serving/bench.csv: the issue that asked for it named the file, in a folder of serving results).

A result `by_all=False` is built only when asked for by name (`snakemake --cores 2 serve_bench`, or its
figure's path): neither `rule all` nor the report reads it, so its cost is not the cold build's.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kvlab.facts.sheet import LAB_RESULTS, REPORT_FILE

# `snakemake --report`'s categories.
LAB_SHEET = "Lab sheet"
LAB_REPORT = "Lab report"
BEYOND = "Beyond the lab"
CLASS = "Class"
CLASS_FOLDER = "results/class"
SERVING_FOLDER = "results/serving"
# Each of the build's models exported (rules/export.smk, kvlab.export): a transformers folder and a GGUF file,
# each with its record, and the two checks side by side; and how to run each export in its tool (the records,
# the lab's page and docs/export.md say the same).
EXPORTED = ("pretrain", "sft")
EXPORT_HF = "results/export/{model}/hf"
EXPORT_GGUF = "results/export/{model}/{model}.gguf"
EXPORT_CHECKS = "results/export/{model}/checks.json"
EXPORT_RUN = {
    "hf": "python -c \"import transformers as t; p = t.pipeline('text-generation', '{out}'); "
          "print(p('민수는', max_new_tokens=32, do_sample=False)[0]['generated_text'])\"",
    "gguf": "python -c \"from llama_cpp import Llama; "
            "print(Llama('{out}', verbose=False)('민수는', max_tokens=32, temperature=0)['choices'][0]['text'])\"",
}


@dataclass(frozen=True)
class Result:
    """A file the workflow writes. `category` None: a detail the report reads, not shown by itself.
    `timed`: it holds wall-clock times (or what follows from them), so two builds differ there."""

    name: str
    path: str
    category: str | None = None
    subcategory: str | None = None
    timed: bool = False
    by_all: bool = True  # built by `rule all` (and read by the report), or only when asked for

    @property
    def caption(self) -> str:
        """Its caption for `snakemake --report`, relative to the workflow's folder."""
        return f"report/{self.name}.rst"


# Where the lab's figures are drawn: the sheet's, beyond it, serving (the class's are drawn by kvlab.grade.class_page).
SHEET_FIGURES = "kvlab.present.sheet_figures"
BEYOND_FIGURES = "kvlab.present.beyond_figures"
SERVING_FIGURES = "kvlab.present.serving_figures"


@dataclass(frozen=True)
class Figure:
    """A figure drawn from the result `data` by the function `name` of module `drawn_by`."""

    name: str
    data: str
    drawn_by: str
    folder: str = "results/figures"

    @property
    def rule(self) -> str:
        return f"figure_{self.name}"

    @property
    def path(self) -> str:
        return f"{self.folder}/{self.name}.png"

    @property
    def caption(self) -> str:
        return f"report/figures/{self.name}.rst"

    @property
    def category(self) -> str:
        return RESULTS[self.data].category

    @property
    def subcategory(self) -> str | None:
        return RESULTS[self.data].subcategory

    @property
    def by_all(self) -> bool:
        return RESULTS[self.data].by_all


def _results(*results: Result) -> dict[str, Result]:
    return {result.name: result for result in results}


RESULTS = _results(
    # the lab sheet's steps 1-6, and their numbers as tables for the HTML report
    *(Result(name, f"results/{file}", LAB_SHEET, timed=name == "time") for name, file in LAB_RESULTS.items()),
    Result("lab_tables", "results/lab_tables.html", LAB_SHEET, timed=True),
    # step 7, the report beyond the sheet, and both as one page with their figures
    Result("report", f"results/{REPORT_FILE}", LAB_REPORT, timed=True),
    Result("beyond", "results/beyond.md", LAB_REPORT, timed=True),
    Result("lab_report", "results/lab_report.html", LAB_REPORT, timed=True),
    # the lab as a page a student plays with, from the results and what only it reads (explore_steps)
    Result("explore", "results/explore.html", LAB_REPORT, timed=True),
    # the Hangul font of `snakemake --report`'s front page (report/workflow.rst includes it), written beside it
    Result("front_page_font", "results/front_page_font.html"),
    # what the steps write beside the sheet's files
    Result("prompt", "results/prompt.json"),
    Result("model_card", "results/model_card.json"),
    Result("time_runs", "results/time_runs.json", timed=True),
    Result("temp_answers", "results/temp_answers.json"),
    Result("topp_sharp", "results/topp_sharp.json"),
    Result("steps_opened", "results/steps_opened.json"),
    Result("explore_steps", "results/explore_steps.json"),
    Result("check", "results/check.json", timed=True),
    Result("folder_check", "results/check/{folder}.json", timed=True),
    # beyond the sheet, each a section of the HTML report
    Result("sweep", "results/sweep.csv", BEYOND, "Cost curves", timed=True),
    Result("sweep_runs", "results/sweep_runs.json", timed=True),
    Result("latency", "results/latency.json", BEYOND, "Latency split", timed=True),
    Result("step_anatomy", "results/step_anatomy.json", BEYOND, "Step anatomy", timed=True),
    Result("kv_capacity", "results/kv_capacity.csv", BEYOND, "KV capacity"),
    Result("topp_curve", "results/topp_curve.csv", BEYOND, "Top-p curve"),
    Result("temp_curve", "results/temp_curve.csv", BEYOND, "Temperature curve"),
    Result("temp_curve_answers", "results/temp_curve_answers.json"),
    Result("compare", "results/compare.csv", BEYOND, "Model comparison", timed=True),
    Result("batch", "results/batch.tsv", BEYOND, "Batching", timed=True),
    Result("batch_runs", "results/batch_runs.json", timed=True),
    Result("kv_waste", "results/kv_waste.csv", BEYOND, "KV reservation"),
    Result("kv_waste_requests", "results/kv_waste_requests.json"),
    # the cache in fewer bits (rules/serving.smk: kv_dtype)
    Result("kv_dtype", "results/kv_dtype.csv", BEYOND, "KV cache dtype", timed=True),
    # the compiled steps the serving jobs load: the seconds compiling them took, once a build
    Result("compiled_steps", f"{SERVING_FOLDER}/compiled_steps.json", timed=True),
    # continuous batching against static on one trace (rules/serving.smk: serve_trace, serve_rates)
    Result("serve_counts", f"{SERVING_FOLDER}/serve_counts.csv", BEYOND, "Continuous batching"),
    Result("serve_memory", f"{SERVING_FOLDER}/serve_memory.csv", BEYOND, "Continuous batching"),
    Result("serve_timing", f"{SERVING_FOLDER}/serve_timing.csv", BEYOND, "Continuous batching", timed=True),
    Result("serve_trace", f"{SERVING_FOLDER}/serve_trace.json", BEYOND, "Continuous batching", timed=True),
    Result("serve_events", f"{SERVING_FOLDER}/serve_events.jsonl", timed=True),
    Result("serve_rates", f"{SERVING_FOLDER}/serve_rates.csv", BEYOND, "Continuous batching", timed=True),
    Result("serve_rates_runs", f"{SERVING_FOLDER}/serve_rates_runs.json", timed=True),
    # decoding path against path, the compiled step included (compiling takes tens of seconds: only when asked for)
    Result("decode_bench", "results/decode_bench.csv", BEYOND, "Fast decoding", timed=True, by_all=False),
    Result("decode_bench_runs", "results/decode_bench.json", timed=True, by_all=False),
    # `kvlab serve` measured over HTTP at rising request rates (a few minutes: only when asked for)
    Result("serve_bench", "results/serving/bench.csv", BEYOND, "Serving over HTTP", timed=True, by_all=False),
    Result("serve_bench_runs", "results/serving/bench_runs.json", timed=True, by_all=False),
    # only with the config's minimind_src
    Result("fidelity", "results/fidelity.json", BEYOND, "Fidelity to MiniMind"),
    # only with extras.export.in_build (else `snakemake --cores 1 export` writes them, and no report reads them)
    *(Result(f"export_{model}", EXPORT_CHECKS.format(model=model)) for model in EXPORTED),
    # grading a class (`snakemake grade`)
    Result("grades", f"{CLASS_FOLDER}/grades.csv", CLASS),
    Result("tests", f"{CLASS_FOLDER}/tests.csv", CLASS),
    Result("class_page", f"{CLASS_FOLDER}/class.html", CLASS),
)

FIGURES = {
    figure.name: figure
    for figure in (
        Figure("cost_curves", "sweep", SHEET_FIGURES),
        Figure("step_times", "latency", SHEET_FIGURES),
        Figure("topp_survivors", "topp_curve", SHEET_FIGURES),
        Figure("temperature_effect", "temp_curve", SHEET_FIGURES),
        Figure("compare", "compare", BEYOND_FIGURES),
        Figure("batch", "batch", BEYOND_FIGURES),
        Figure("kv_waste", "kv_waste", BEYOND_FIGURES),
        Figure("kv_dtype", "kv_dtype", BEYOND_FIGURES),
        Figure("step_anatomy", "step_anatomy", BEYOND_FIGURES),
        Figure("decode_bench", "decode_bench", BEYOND_FIGURES),
        Figure("serve_timeline", "serve_trace", SERVING_FIGURES),
        Figure("serve_latency", "serve_rates", SERVING_FIGURES),
        Figure("serve_bench", "serve_bench", SERVING_FIGURES),
        Figure("class_scores", "grades", "kvlab.grade.class_page", folder=CLASS_FOLDER),
        Figure("class_tests", "tests", "kvlab.grade.class_page", folder=CLASS_FOLDER),
    )
}

# The results the reports' templates read, by name: the lab's and everything beyond it (fidelity's only
# where it ran), never the pages made from the reports or the class's, nor what only the lab's page reads,
# nor a log of events (JSON Lines: the reports read tables and JSON documents).
REPORT_READS = tuple(name for name, result in RESULTS.items()
                     if result.category in (LAB_SHEET, BEYOND, None) and result.by_all
                     and name not in ("lab_tables", "check", "folder_check", "explore_steps", "steps_opened",
                                     "front_page_font")
                     and not result.path.endswith(".jsonl"))
# The sheet's report reads the sheet's files and what its steps write beside them, nothing beyond the
# sheet: `snakemake results/report.md` runs the prompt, the six steps and their checkpoints' jobs only
# (fidelity's verdict where minimind_src asks for it).
SHEET_READS = (*LAB_RESULTS, "prompt", "model_card", "time_runs", "temp_answers", "topp_sharp", "fidelity")
# What the lab's page (results/explore.html, kvlab.present.explore) is drawn from, by name: the generation
# opened step by step, and the results whose numbers it shows.
EXPLORE_READS = ("explore_steps", "counts", "kvbytes", "temp", "temp_answers", "topp", "topp_sharp", "topp_curve",
                 "kv_capacity", "batch", "latency")
# The page's template, and the script and style it holds inline.
EXPLORE_TEMPLATE = "templates/explore.html.j2"
# The reports' templates: one folder, an entry template per report, one file a section.
REPORT_TEMPLATES = "templates/report"
# Built and read only where the config asks: fidelity with minimind_src, the exports with extras.export.in_build.
OPTIONAL = ("fidelity", *(f"export_{model}" for model in EXPORTED))


def lab_figures() -> list[Figure]:
    """The figures of the lab's build (not the class's, nor those only built when asked for)."""
    return [figure for figure in FIGURES.values() if figure.category != CLASS and figure.by_all]


def built_by_all(optional: Collection[str] = ()) -> list[str]:
    """What `rule all` builds: every result a reader sees but the class's (`grade` builds those), those
    of OPTIONAL this build does not ask for (`optional`: the names it does), and those only built when
    asked for; and the lab's figures."""
    shown = [result.path for name, result in RESULTS.items()
             if result.category in (LAB_SHEET, LAB_REPORT, BEYOND) and (name in optional or name not in OPTIONAL)
             and result.by_all]
    return shown + [figure.path for figure in lab_figures()]


def report_inputs(optional: Collection[str] = (), report: str = "beyond") -> dict[str, str]:
    """A report's inputs, by the name its templates read each by (of OPTIONAL, those `optional` names).
    The sheet's report ("report") reads
    the sheet's results, what its steps write beside them and fidelity's verdict (SHEET_READS); the
    report beyond it ("beyond") reads every result and each of the lab's figures (by its rule's name)."""
    names = SHEET_READS if report == "report" else REPORT_READS
    inputs = {name: RESULTS[name].path for name in names if name in optional or name not in OPTIONAL}
    if report == "report":
        return inputs
    return {**inputs, **{figure.rule: figure.path for figure in lab_figures()}}
