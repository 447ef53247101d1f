"""Step 7: the lab's two reports, rendered from the result files by sandboxed Jinja templates.

`results/report.md` is the sheet's report: where the numbers come from (models, code, machine), the
timings to read with care, the sheet's three sections (`## KV 캐시`, `## 온도`, `## top-p`) with the
speedup and the bytes, and one short section on serving. `results/beyond.md` holds what lies beyond
the sheet (kvlab.present.beyond). `check` and grading read the first.

Every number is read from a result file or derived here from those numbers; the templates hold
prose only, one file a section, in English with its Korean in the catalog (kvlab.present.i18n). A
section is a function of the loaded result files alone: it never reads another section's output or
changes a row it was given. Every comparison the prose states is a verdict of
kvlab.present.verdicts computed here; the template picks the sentence that belongs to it.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from kvlab.facts.formulas import fed_formulas
from kvlab.facts.disturbed import contended_timings
from kvlab.facts.timing import CONTENDED_CPU_SHARE, UNSTABLE_IQR_SHARE
from kvlab.io import read_csv_rows, read_json
from kvlab.present import beyond
from kvlab.present.pages import sandboxed_template
from kvlab.present.verdicts import against, agreement, comparison, direction, steps

SHEET_TEMPLATE = "report.md.j2"
BEYOND_TEMPLATE = "beyond.md.j2"
# The two rules a timing is read with care by (kvlab.facts.timing), which the reports state.
RULES = {"unstable_rule": UNSTABLE_IQR_SHARE, "contended_rule": CONTENDED_CPU_SHARE}


# --- where the numbers come from, and which timings to read with care -----------------------------


def provenance(results: dict, given: dict[str, bool]) -> dict:
    """Which models (the embedded default's stand-ins, or the user's files: `given` says which config
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
    }


def unstable_timings(results: dict) -> list[dict]:
    """Every timing the rule calls unstable (IQR at least 10% of its median), as {what, share}: step 3's
    modes, the sweep's N, the per-step timing's modes, the compared models, the batches, the opened
    steps and the two caches' steps at each context."""
    summary = results["time_runs"]["summary"]
    found = [{"what": "step3", "mode": label, "share": summary[label]["iqr_share"]}
             for label in ("with_cache", "without_cache") if summary[label]["unstable"]]
    for row in results.get("sweep", []):
        if row["unstable"]:
            found.append({"what": "sweep", "n": row["new_tokens"],
                          "share": max(row["with_cache_iqr_share"], row["without_cache_iqr_share"])})
    latency = results.get("latency")
    if latency:
        found += [{"what": "latency", "mode": label, "share": latency[label]["generate"]["iqr_share"]}
                  for label in ("with_cache", "without_cache") if latency[label]["generate"]["unstable"]]
    for row in results.get("compare", []):
        if row["unstable"]:
            found.append({"what": "compare", "name": row["name"],
                          "share": max(row["with_cache_iqr_share"], row["without_cache_iqr_share"])})
    for row in results.get("batch", []):
        if row["unstable"]:
            found.append({"what": "batch", "mode": row["mode"], "n": row["B"], "share": row["iqr_share"]})
    if "step_anatomy" in results:
        anatomy, curve = results["step_anatomy"]["anatomy"], results["step_anatomy"]["curve"]
        found += [{"what": "anatomy", "mode": name, "share": anatomy[name]["step"]["iqr_share"]}
                  for name in anatomy["steps"] if anatomy[name]["step"]["unstable"]]
        found += [{"what": "curve", "mode": kind, "n": context, "share": row["iqr_share"]}
                  for kind in curve["kinds"]
                  for context, row in zip(curve["contexts"], curve[kind]["steps"])
                  if row["unstable"]]
    return found


def grouped(timings: list[dict], value: str = "share") -> list[dict]:
    """Timings to read with care, one entry per part and mode (or model), in order: {what, mode, name,
    points: [{n, value}]}, so a list of batch sizes reads "B = 1 (13%), 4 (12%)" and not once per B.
    `value`: the item's key shown beside each point (the IQR's share, or the CPU's share)."""
    groups: dict = {}
    for item in timings:
        key = (item["what"], item.get("mode"), item.get("name"))
        group = groups.setdefault(key, {"what": item["what"], "mode": item.get("mode"), "name": item.get("name"),
                                        "points": []})
        group["points"].append({"n": item.get("n"), "value": item.get(value)})
    return list(groups.values())


def same_generation(results: dict) -> dict:
    """The lab's timed generation (step 3's P and N) as other parts timed it too: the sweep's row at the
    same N and the per-step timing's own generations, side by side, and whether they agree."""
    step3 = results["time_runs"]["speedup"]
    timings = [{"what": "step3", "ratio": step3["ratio"], "low": step3["low"], "high": step3["high"]}]
    count = results["counts"]
    for row in results.get("sweep", []):
        if row["new_tokens"] == count["new_tokens"] and row["prompt_len"] == count["prompt_len"]:
            timings.append({"what": "sweep", "ratio": row["speedup"], "low": row["speedup_low"],
                            "high": row["speedup_high"]})
    latency = results.get("latency")
    if latency and latency["new_tokens"] == count["new_tokens"]:
        timings.append({"what": "latency", **latency["measured"]})
    verdict = agreement((timing["low"], timing["high"]) for timing in timings)
    return {"timings": timings, "agreement": verdict["verdict"], "several": len(timings) > 1,
            "apart": [(timings[i]["what"], timings[j]["what"]) for i, j in verdict["apart"]]}


# --- the sheet's sections -----------------------------------------------------------------------------


def kv_section(results: dict) -> dict:
    """## KV 캐시: steps 1-4. Whether the cache was faster, by less than its token ratio, and why; the
    cache's bytes against the formula, and what they would be after repeat_kv."""
    count, runs, kv = results["counts"], results["time_runs"], results["kvbytes"]
    formulas = fed_formulas(count["prompt_len"], count["new_tokens"])
    token_ratio = count["fed_without_cache"] / count["fed_with_cache"]
    speedup = runs["speedup"]
    interval = (speedup["low"], speedup["high"])
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
        # the speedup's interval above 1 ("above": the cache was faster), below, or holding 1
        "cache_time": against(interval, 1.0),
        # the time gain against the token gain: below it is the fixed cost per step at work
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
    }}


def serving_section(results: dict) -> dict:
    """The last section: the cache's bytes per token → the requests that fit a budget → the throughput
    measured with many requests at once, and where memory, not compute, would be the limit (MiniMind's
    published size in float16 at a long context)."""
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
    budget_bytes = budget * 1024**3
    return {"serving": {
        "bytes_per_token": lab[0]["bytes_per_token_measured"], "dtype": lab_dtype, "budget_gib": budget,
        "lab": lab,  # requests that fit the budget at each context
        "batch": {"B": last["B"], "before_B": before["B"], "throughput": last["S_TG t/s"],
                  "low": last["S_TG_low"], "high": last["S_TG_high"], "cache_bytes": last["kv_bytes_measured"],
                  "budget_share": last["kv_bytes_measured"] / budget_bytes,
                  # the throughput at the largest B against the B before it: "rises", "falls" or "unclear"
                  "last_step": steps([(before["S_TG_low"], before["S_TG_high"]), (last["S_TG_low"], last["S_TG_high"])])[0],
                  "gain": last["S_TG t/s"] / before["S_TG t/s"]},
        "big": {"model": big["model"], "dtype": big["dtype"], "bytes_per_token": big["bytes_per_token_measured"],
                "context": big["context_tokens"], "request_bytes": big["bytes_per_request"],
                "fits": big["max_requests"], "layers": big["layers"], "kv_heads": big["kv_heads"],
                "head_dim": big["head_dim"]},
        # memory sets the limit where no more such requests fit the budget than the batch measured here
        "memory_bound": big["max_requests"] <= last["B"],
    }}


SHEET_SECTIONS = (kv_section, temperature_section, topp_section, serving_section)


# --- the two reports ------------------------------------------------------------------------------------


def sheet_context(results: dict, given: dict[str, bool]) -> dict:
    """Everything `report.md` reads: the provenance, the timings to read with care, every section's."""
    context = {"provenance": provenance(results, given), "unstable": grouped(unstable_timings(results)),
               "contended": grouped(contended_timings(results), "cpu_share"), **RULES}
    for section in SHEET_SECTIONS:
        context.update(section(results))
    return context


def beyond_context(results: dict, figures: dict[str, str]) -> dict:
    """Everything `beyond.md` reads: the timings to read with care, the one generation timed several
    ways, and the sections beyond the sheet whose results were given (each with its figure)."""
    context = {"unstable": grouped(unstable_timings(results)),
               "contended": grouped(contended_timings(results), "cpu_share"), **RULES,
               "same_generation": same_generation(results), "figures": figures,
               "token_ratio": results["counts"]["fed_without_cache"] / results["counts"]["fed_with_cache"]}
    for section in beyond.SECTIONS:
        context.update(section(results))
    return context


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


def render_report(template_path, result_paths: dict[str, str], language: str, given: dict[str, bool] | None = None
                  ) -> str:
    """Load the result files ({input name: path}) and render the report whose entry template is
    `template_path` (templates/report/report.md.j2 or templates/report/beyond.md.j2) in a sandbox."""
    results, figures = load_results(result_paths)
    template_path = Path(template_path)
    if template_path.name == BEYOND_TEMPLATE:
        context = beyond_context(results, figures)
    else:
        context = sheet_context(results, given or {})
    return sandboxed_template(template_path, language=language).render(lang=language, **context)
