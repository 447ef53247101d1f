"""Step 7: the lab's two reports, rendered from the result files by sandboxed Jinja templates.

`results/report.md` is the sheet's report, from the sheet's files alone: which build made it (commit,
date, machine, torch), where the numbers come from (models, code), whether the machine disturbed step
3's timing, and the sheet's three sections (`## KV 캐시`, `## 온도`, `## top-p`) with the speedup and
the bytes. `results/beyond.md` holds what lies beyond the sheet (kvlab.present.beyond), content first,
the lesson's chain into serving (`chain_section`) among it. `check` and grading read the first.

Every number is read from a result file or derived here from those numbers; the templates hold
prose only, one file a section, in English with its Korean in the catalog (kvlab.present.i18n). A
section is a function of the loaded result files alone: it never reads another section's output or
changes a row it was given. Every comparison the prose states is a verdict of
kvlab.present.verdicts computed here, on the clock it is judged on (kvlab.present.clocks: the CPU
clock's when a side was contended); the template picks the sentence that belongs to it. A paragraph
is written a sentence a line and given as one line (`one_line_paragraphs`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kvlab.facts.formulas import fed_formulas
from kvlab.facts.disturbed import disturbed_timings
from kvlab.present.marks import SIGN, render_twice
from kvlab.facts.timing import CONTENDED_CPU_SHARE, CONTENDED_RUNS_SHARE, UNSTABLE_IQR_SHARE
from kvlab.io import read_csv_rows, read_json
from kvlab.present import beyond, clocks, exported, precision
from kvlab.present.pages import sandboxed_template
from kvlab.present.verdicts import (CLOSE_COUNTS, against, agreement, close_counts, comparison, direction, on_clock,
                                    one_clock, steps)

BEYOND_TEMPLATE = "beyond.md.j2"
# The two rules a timing is read with care by (kvlab.facts.timing), which the reports state.
RULES = {"unstable_rule": UNSTABLE_IQR_SHARE, "contended_rule": CONTENDED_CPU_SHARE,
         "contended_runs_rule": CONTENDED_RUNS_SHARE}
# What the reports say of the build when it was not recorded (a report rendered outside the workflow).
UNRECORDED = {"commit": None, "changed": False, "date": None, "torch": None}


# --- where the numbers come from, and which timings to read with care -----------------------------


def provenance(results: dict, given: dict[str, bool], build: dict | None = None) -> dict:
    """Which build (`build`: the commit of the workflow's checkout, None outside one, whether its files
    were changed, the date the report was made, torch's version: kvlab.workflow.build_provenance),
    which models (the embedded default's stand-ins, or the user's files: `given` says which config
    keys named a file), which code (kvlab's engine, held against MiniMind's own where minimind_src is
    set), which machine and threads (as step 3 recorded them)."""
    models = results["model_card"]["models"]
    runs = results["time_runs"]
    fidelity = results.get("fidelity")
    return {
        "yours": [key for key in ("pretrain", "sft", "tokenizer", "val_data") if given.get(key)],
        "models": [{"name": name, "checkpoint": entry["checkpoint"], "layout": entry["layout"],
                    "parameters": entry["parameters"]} for name, entry in models.items()],
        "fidelity": None if fidelity is None else {
            "identical": fidelity["identical"], "checks": fidelity["checks"],
            "differing": len(fidelity["differences"]), "path": fidelity["minimind"]["path"]},
        "machine": {"processor": runs["processor"], "device": runs["device"], "threads": runs["torch_threads"]},
        "perplexity": results["model_card"]["prompt_perplexity"],
        "build": {**UNRECORDED, **(build or {})},
    }


def grouped(timings: list[dict]) -> list[dict]:
    """Disturbed timings (kvlab.facts.disturbed), one entry per part and mode (or model), in order: {what,
    mode, name, points: the timings themselves (n, unstable, share, contended, waited, runs,
    cpu_share)}, so a list of batch sizes reads "B = 1 (…), 4 (…)" and not once per B."""
    groups: dict = {}
    for item in timings:
        key = (item["what"], item.get("mode"), item.get("name"))
        group = groups.setdefault(key, {"what": item["what"], "mode": item.get("mode"), "name": item.get("name"),
                                        "points": []})
        group["points"].append(item)
    for group in groups.values():  # the sizes in order, whichever rule listed them first
        if all(isinstance(point.get("n"), (int, float)) for point in group["points"]):
            group["points"].sort(key=lambda point: point["n"])
    return list(groups.values())


def disturbed(results: dict) -> dict:
    """The timings the machine disturbed among `results` (kvlab.facts.disturbed: each once, however many
    rules flag it): how many, how many of each kind, grouped for the list, and step 3's apart (the
    sheet's report, which reads no timing beyond the sheet, names step 3's)."""
    timings = disturbed_timings(results)
    return {"count": len(timings), "unstable": sum(item["unstable"] for item in timings),
            "contended": sum(item["contended"] for item in timings), "groups": grouped(timings),
            "sheet": [item for item in timings if item["what"] == "step3"]}


def same_generation(results: dict) -> dict:
    """The lab's timed generation (step 3's P and N) as other parts timed it too: the sweep's row at the
    same N and the per-step timing's own generations, side by side on one clock (the CPU clock's when
    any of them was contended, `one_clock`), and whether they agree. Step 3's is the sheet's (time.json);
    the others measured the same work differently: another job's runs, and a clock read at every step."""
    count = results["counts"]
    timings = [("step3", clocks.step3_speedup(results["time_runs"]))]
    for row in results.get("sweep", []):
        if row["new_tokens"] == count["new_tokens"] and row["prompt_len"] == count["prompt_len"]:
            timings.append(("sweep", clocks.sweep_speedup(row, results.get("sweep_runs"))))
    latency = results.get("latency")
    if latency and latency["new_tokens"] == count["new_tokens"]:
        timings.append(("latency", clocks.latency_speedup(latency)))
    judged = one_clock([pair["wall"] for _, pair in timings], [pair["cpu"] for _, pair in timings])
    # `n`: the size that names the timing among its part's (the sweep's N), for its mark
    items = [{"what": what, "n": count["new_tokens"] if what == "sweep" else None,
              **{key: value[key] for key in ("ratio", "low", "high")}}
             for (what, _), value in zip(timings, judged["values"])]
    verdict = agreement(judged["intervals"])
    return {"timings": items, "clock": judged["clock"], "agreement": verdict["verdict"], "several": len(items) > 1,
            "apart": [(items[i]["what"], items[j]["what"]) for i, j in verdict["apart"]]}


# --- the sheet's sections -----------------------------------------------------------------------------


def kv_section(results: dict) -> dict:
    """## KV 캐시: steps 1-4. Whether the cache was faster, by less than its token ratio, and why; the
    cache's bytes against the formula, and what they would be after repeat_kv."""
    count, runs, kv = results["counts"], results["time_runs"], results["kvbytes"]
    formulas = fed_formulas(count["prompt_len"], count["new_tokens"])
    token_ratio = count["fed_without_cache"] / count["fed_with_cache"]
    speedup = runs["speedup"]
    # judged on the CPU clock when the machine took from the runs (time.json keeps the wall clock's)
    pair = clocks.step3_speedup(runs)
    judged = on_clock(pair["wall"], pair["cpu"])
    interval = (judged["low"], judged["high"])
    summary = runs["summary"]
    config = results["model_card"]["models"]["pretrain"]["config"]
    shape = kv["k_shape"]
    return {"kv": {
        "prompt_len": count["prompt_len"], "new_tokens": count["new_tokens"], "same_ids": results["same"]["same_ids"],
        "fed": {"with_cache": count["fed_with_cache"], "without_cache": count["fed_without_cache"]},
        "formulas": formulas,
        "fed_match": (count["fed_with_cache"], count["fed_without_cache"]) == (formulas["with_cache"],
                                                                              formulas["without_cache"]),
        "token_ratio": token_ratio, "time": summary, "runs": runs, "speedup": speedup,
        # the clock the speedup is judged on ("wall", or "cpu" when contended) and its value there
        "clock": judged["clock"], "judged": judged,
        # the judged speedup's interval above 1 ("above": the cache was faster), below, or holding 1
        "cache_time": judged["verdict"],
        # the work's gain against the token gain: below it is the fixed cost per step at work
        "time_vs_tokens": against(interval, token_ratio),
        "unstable": any(summary[mode]["unstable"] for mode in summary),
        # the process waited for its CPU: the speedup is this run's, not the machine's
        "contended": bool(speedup.get("contended")),
        "tokens": kv["tokens"], "measured_bytes": kv["measured_bytes"], "formula_bytes": kv["formula_bytes"],
        "bytes_match": kv["measured_bytes"] == kv["formula_bytes"], "k_shape": shape,
        "kv_heads": shape[2], "heads": config["num_attention_heads"],
        # what the cache would weigh if MiniMind kept K and V after repeat_kv
        "after_repeat_kv": kv["formula_bytes"] * config["num_attention_heads"] // shape[2],
    }}


def temperature_section(results: dict) -> dict:
    """## 온도: step 5's distinct answers, the most common answer of each, and how they move."""
    rows = []
    for key, row in results["temp"].items():
        answers = results["temp_answers"]["answers"][key]
        text, times = Counter(answers).most_common(1)[0]
        rows.append({"temperature": key, "distinct": row["distinct"], "samples": len(answers),
                     "top": text.replace("\n", " ").replace("|", "\\|"), "times": times})
    rows.sort(key=lambda row: float(row["temperature"]))
    lowest = rows[0]
    return {"temperature": {
        "rows": rows, "question": results["temp_answers"]["question"],
        "chat_template": results["temp_answers"]["chat_template"],
        "direction": direction(row["distinct"] for row in rows),
        # at the lowest temperature, do (nearly) all answers agree? at most a fifth distinct
        "lowest_agree": lowest["distinct"] <= max(1, lowest["samples"] // 5), "lowest": lowest,
    }}


def topp_section(results: dict) -> dict:
    """## top-p: step 6's survivors after the flat and the sharp prefix, and which keeps more."""
    sharp = results["topp_sharp"]
    rows = [{"p": p, "flat": n, "sharp": sharp["survivors"].get(p)} for p, n in results["topp"].items()]
    return {"topp": {
        "rows": rows, "flat_prefix": sharp["flat_prefix"], "sharp_prefix": sharp["prefix"],
        "comparison": comparison((row["flat"], row["sharp"]) for row in rows),
        "ties": sum(row["flat"] == row["sharp"] for row in rows),
        # counts this close at every p say no distribution is flatter (kvlab.present.verdicts.CLOSE_COUNTS)
        "close": close_counts((row["flat"], row["sharp"]) for row in rows), "close_share": CLOSE_COUNTS,
    }}


def chain_section(results: dict) -> dict:
    """The lesson's chain into serving, on the lab's model and this build's files: the cache's bytes per
    token (measured) -> the requests that fit a memory budget at each context (kv_capacity) -> the
    throughput measured with that many requests' worth of rows at once, as far as `batch` went, with
    the share of the budget its cache took. At MiniMind's own size only the arithmetic (bytes per
    token and requests that fit, weighed on a seeded cache of that architecture): no throughput was
    measured there, and the section says so rather than tell which limit comes first."""
    if "kv_capacity" not in results or "batch" not in results:
        return {}
    capacity = results["kv_capacity"]
    lab_name, lab_dtype = capacity[0]["model"], capacity[0]["dtype"]
    budget = capacity[0]["budget_gib"]
    lab = [row for row in capacity if (row["model"], row["dtype"], row["budget_gib"]) == (lab_name, lab_dtype, budget)]
    big_rows = [row for row in capacity if row["model"] != lab_name and row["dtype"] == "float16"
                and row["budget_gib"] == budget] or [row for row in capacity if row["budget_gib"] == budget]
    big = max(big_rows, key=lambda row: (row["context_tokens"], row["bytes_per_token_measured"]))
    distinct = [row for row in results["batch"] if row["mode"] == "distinct"] or results["batch"]
    last, before = distinct[-1], distinct[-2] if len(distinct) > 1 else distinct[-1]
    # the last step of the throughput, on the CPU clock when either batch waited for the CPU
    pairs = [clocks.batch_throughput(row, results.get("batch_runs")) for row in (before, last)]
    judged = one_clock([pair["wall"] for pair in pairs], [pair["cpu"] for pair in pairs])
    shown_before, shown_last = judged["values"]
    return {"chain": {
        "bytes_per_token": lab[0]["bytes_per_token_measured"], "dtype": lab_dtype, "budget_gib": budget,
        "lab": lab,  # requests that fit the budget at each context
        "batch": {"B": last["B"], "before_B": before["B"], "throughput": shown_last["value"],
                  "low": shown_last["low"], "high": shown_last["high"], "cache_bytes": last["kv_bytes_measured"],
                  "budget_share": last["kv_bytes_measured"] / (budget * 1024**3),
                  # the throughput at the largest B against the B before it: "rises", "falls" or "unclear",
                  # on the clock `clock` ("cpu": per second of the timing thread's CPU time)
                  "last_step": steps(judged["intervals"])[0], "clock": judged["clock"],
                  "gain": shown_last["value"] / shown_before["value"]},
        "big": {"model": big["model"], "dtype": big["dtype"], "bytes_per_token": big["bytes_per_token_measured"],
                "context": big["context_tokens"], "request_bytes": big["bytes_per_request"],
                "fits": big["max_requests"], "layers": big["layers"], "kv_heads": big["kv_heads"],
                "head_dim": big["head_dim"]},
    }}


SHEET_SECTIONS = (kv_section, temperature_section, topp_section)


# --- the two reports ------------------------------------------------------------------------------------


def sheet_context(results: dict, given: dict[str, bool], build: dict | None = None) -> dict:
    """Everything `report.md` reads: the provenance and every section's (the disturbed timings' marks are
    handed out as it renders, kvlab.present.marks)."""
    context = {"provenance": provenance(results, given, build), **RULES}
    for section in SHEET_SECTIONS:
        context.update(section(results))
    return context


def beyond_context(results: dict, figures: dict[str, str], build: dict | None = None) -> dict:
    """Everything `beyond.md` reads: the provenance, the one generation timed several ways, and the
    sections beyond the sheet whose results were given (each with its figure); the disturbed timings'
    marks are handed out as it renders (kvlab.present.marks)."""
    runs = results["time_runs"]
    context = {"build": {**UNRECORDED, **(build or {})},
               "machine": {"processor": runs["processor"], "device": runs["device"], "threads": runs["torch_threads"]},
               **RULES,
               "same_generation": same_generation(results), "figures": figures,
               "token_ratio": results["counts"]["fed_without_cache"] / results["counts"]["fed_with_cache"]}
    for section in (*beyond.SECTIONS, chain_section, precision.kv_dtype_section, exported.export_section):
        context.update(section(results))
    return context


# What starts a Markdown block of its own (a heading, a table row, a list item, a quote, an image, an indented
# line): such a line never joins the one before it, nor another line it.
_BLOCK_START = ("#", "|", "- ", "* ", "> ", ">", "![", " ", "\t")


def one_line_paragraphs(text: str) -> str:
    """The templates write a paragraph a sentence a line (each sentence a verdict's choice); the report
    gives each paragraph one line, its sentences joined by a space, as Markdown renders it anyway: a
    reader's editor shows it as one paragraph, and its length in lines is its length in paragraphs. A
    heading holds its section's first block close (no blank line after it, as Markdown renders it
    anyway), and no two blank lines follow each other."""
    lines: list[str] = []
    for line in text.split("\n"):
        previous = lines[-1] if lines else ""
        if not line and (previous.startswith("#") or (lines and not previous)):
            continue
        if line and previous and not line.startswith(_BLOCK_START) and not previous.startswith(_BLOCK_START) \
                and not previous.endswith("  "):
            lines[-1] = f"{previous} {line}"
        else:
            lines.append(line)
    return "\n".join(lines)


def load_results(paths: dict[str, str]) -> tuple[dict, dict]:
    """The reports' inputs by name: (JSON files as dicts and CSV tables as lists of row dicts, typed
    once as they are read; figures (PNG) as links relative to the report, which sits in the same folder
    as figures/)."""
    results: dict = {}
    figures: dict = {}
    for name, path in paths.items():
        path = Path(path)
        if path.suffix == ".json":
            results[name] = read_json(path)
        elif path.suffix in (".csv", ".tsv"):
            results[name] = read_csv_rows(path)
        elif path.suffix == ".png":
            figures[name] = f"{path.parent.name}/{path.name}"
        else:
            raise ValueError(f"{path}: the report reads .json, .csv, .tsv and .png files only")
    return results, figures


def render_report(template_path, result_paths: dict[str, str], language: str, given: dict[str, bool] | None = None,
                  build: dict | None = None) -> str:
    """Load the result files ({input name: path}) and render the report whose entry template is
    `template_path` (templates/report/report.md.j2 or templates/report/beyond.md.j2) in a sandbox.
    `build`: which commit made it, when, with which torch (kvlab.workflow.build_provenance); a report
    rendered without it says they were not recorded."""
    results, figures = load_results(result_paths)
    template_path = Path(template_path)
    if template_path.name == BEYOND_TEMPLATE:
        context = beyond_context(results, figures, build)
    else:
        context = sheet_context(results, given or {}, build)
    template = sandboxed_template(template_path, language=language)
    text = render_twice(lambda marks: template.render(lang=language, mark=marks, marks=marks, sign=SIGN, **context),
                        disturbed_timings(results))
    return one_line_paragraphs(text)
