"""Step 7: results/report.md, rendered from the result files by a sandboxed Jinja template.

Every number in the report is read from a result file or derived here from those numbers; the template
holds prose only. The report is made of sections, each a function of the loaded result files alone
(its own inputs, never another section's output, never changing a row it was given); a section
beyond the sheet gives nothing when its result is not among the inputs. Every comparison the prose
states is a verdict of kvlab.present.verdicts, computed here: the template picks its sentence by it.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

from kvlab.facts.formulas import BATCH_MODES, VLLM_PAPER, fed_formulas, fits_budgets
from kvlab.facts.timing import UNSTABLE_IQR_SHARE, overlap
from kvlab.io import read_csv_rows, read_json
from kvlab.present.pages import sandboxed_template
from kvlab.present.verdicts import against, comparison, direction, interval_direction


def build_context(results: dict, language: str) -> dict:
    """Numbers for the template, from the loaded result files (keyed by their input names): every
    section's, with their verdicts together under `trend`."""
    context = {"lang": language, "unstable": unstable_timings(results), "unstable_rule": UNSTABLE_IQR_SHARE,
               "same_generation": same_generation(results)}
    trend = {}
    for section in SECTIONS:
        part = section(results)
        trend.update(part.get("trend", {}))
        context.update({key: value for key, value in part.items() if key != "trend"})
    return {**context, "trend": trend}


# --- the lab sheet's sections ---------------------------------------------------------------------


def model_section(results: dict) -> dict:
    """The prompt and the models: what each checkpoint is and where its fields came from."""
    return {"prompt": results["prompt"], "card": model_card_context(results["model_card"])}


def model_card_context(card: dict) -> dict:
    """model_card.json with each model's fields grouped by where they came from."""
    models = []
    for name, entry in card["models"].items():
        by_source: dict[str, list[str]] = {}
        for field, source in entry["sources"].items():
            by_source.setdefault(source, []).append(f"{field} {entry['config'][field]}")
        models.append({"name": name, "layout": entry["layout"], "parameters": entry["parameters"],
                       "config": entry["config"], "by_source": by_source, "head_count": entry.get("head_count")})
    return {"models": models, "warnings": card["warnings"], "perplexity": card["prompt_perplexity"],
            "tokenizer_vocab_size": card["tokenizer_vocab_size"]}


def kv_section(results: dict) -> dict:
    """## KV 캐시: steps 1-4, and whether the cache was faster and by less than its token ratio."""
    count, runs = results["counts"], results["time_runs"]
    token_ratio = count["fed_without_cache"] / count["fed_with_cache"]
    interval = (runs["speedup"]["low"], runs["speedup"]["high"])
    kv = results["kvbytes"]
    return {
        "same": results["same"], "count": count, "formulas": fed_formulas(count["prompt_len"], count["new_tokens"]),
        "token_ratio": token_ratio, "time": results["time"], "time_runs": runs,
        "step3": {"speedup": runs["speedup"], **runs["summary"]},
        "kv": kv, "kv_match": kv["measured_bytes"] == kv["formula_bytes"],
        "trend": {
            # the cache's effect on time at all: its speedup's interval above 1 ("above": faster), below
            # 1 ("below": slower), or around it ("within": this machine cannot tell)
            "cache_time": against(interval, 1.0),
            # is the time gain below the token gain (the fixed cost per step at work)?
            "time_vs_tokens": against(interval, token_ratio),
        },
    }


def temperature_section(results: dict, answers_shown: int = 3) -> dict:
    """## 온도: step 5's distinct answers, the most common of each, and how they move with the temperature."""
    rows = []
    for key, row in results["temp"].items():
        answers = results["temp_answers"]["answers"][key]
        common = Counter(answers).most_common(answers_shown)
        rows.append({"temperature": key, "distinct": row["distinct"], "samples": len(answers),
                     "examples": [{"text": text, "times": times} for text, times in common]})
    lowest = min(rows, key=lambda row: float(row["temperature"]))
    by_temperature = sorted(rows, key=lambda row: float(row["temperature"]))
    return {
        "temperature_rows": rows, "question": results["temp_answers"]["question"],
        "chat_template": results["temp_answers"]["chat_template"],
        "trend": {
            "temperature": direction(row["distinct"] for row in by_temperature),
            # at the lowest temperature, do (nearly) all answers agree? at most a fifth distinct
            "lowest_agree": lowest["distinct"] <= max(1, lowest["samples"] // 5),
            "lowest": lowest,
        },
    }


def topp_section(results: dict) -> dict:
    """## top-p: step 6's survivors after the flat and the sharp prefix, and which keeps more."""
    sharp = results["topp_sharp"]
    rows = [{"p": p, "flat": n, "sharp": sharp["survivors"].get(p)} for p, n in results["topp"].items()]
    return {
        "topp_rows": rows, "flat_prefix": sharp["flat_prefix"], "sharp_prefix": sharp["prefix"],
        # which prefix leaves more top-p candidates, at every p of the lab, and at how many p they tie
        "trend": {"topp": comparison((row["flat"], row["sharp"]) for row in rows),
                  "topp_ties": sum(row["flat"] == row["sharp"] for row in rows)},
    }


# --- beyond the sheet: each section only where its result was given ---------------------------------


def formulas_match(row: dict) -> bool:
    """Whether a row's fed tokens (sweep.csv, compare.csv) equal both formulas."""
    return (row["fed_with_cache"] == row["formula_with_cache"]
            and row["fed_without_cache"] == row["formula_without_cache"])


def sweep_section(results: dict) -> dict:
    if "sweep" not in results:
        return {}
    rows = [{**row, "formulas_match": formulas_match(row)} for row in results["sweep"]]
    last = rows[-1]
    return {"sweep": {"rows": rows, "all_match": all(row["formulas_match"] for row in rows),
                      "all_same": all(row["same_ids"] for row in rows)},
            "trend": {"sweep_time_vs_tokens": against((last["speedup_low"], last["speedup_high"]),
                                                      last["token_ratio"])}}


def latency_section(results: dict) -> dict:
    if "latency" not in results:
        return {}
    latency = results["latency"]
    return {"latency": {
        **{label: {key: latency[label][key] for key in ("ttft_s", "ttft", "tpot_s", "sum_steps_s", "generate_s",
                                                       "generate")}
           for label in ("with_cache", "without_cache")},
        "fit": latency["fit"],
        "predicted": latency["predicted"],
        # the speedup of these same instrumented generations, the one the fit predicts
        "measured": latency["measured"],
        "new_tokens": latency["new_tokens"],
        "prompt_len": latency["prompt_len"],
        "ttft_agree": latency["ttft_agree"],
        # a fit that explains little, or a negative fixed cost, says the clock was noisy
        "fit_unreliable": latency["fit"]["r2"] < 0.8 or latency["fit"]["fixed_s"] <= 0,
        "prediction": against((latency["measured"]["low"], latency["measured"]["high"]),
                              latency["predicted"]["speedup"]),
    }}


def capacity_section(results: dict) -> dict:
    return {"capacity": capacity_table(results["kv_capacity"])} if "kv_capacity" in results else {}


def topp_curve_section(results: dict) -> dict:
    if "topp_curve" not in results:
        return {}
    rows = results["topp_curve"]
    # the lab sheet's own p values, and the end of the curve
    marks = [row for row in rows if row["lab_p"] or row is rows[-1]]
    last = rows[-1]
    # at p = 1 the rule may still cut the tail (the rounded cumulative sum passing 1): how much
    cut = {"flat": last["vocab_size"] - last["flat"], "sharp": last["vocab_size"] - last["sharp"]}
    return {"topp_curve": {"rows": rows, "first": rows[0], "last": last, "marks": marks, "cut": cut,
                           "cut_share": {key: n / last["vocab_size"] for key, n in cut.items()}},
            "trend": {"curve_topp": comparison((row["flat"], row["sharp"]) for row in rows),
                      "curve_topp_ties": sum(row["flat"] == row["sharp"] for row in rows)}}


def temp_curve_section(results: dict) -> dict:
    if "temp_curve" not in results:
        return {}
    rows = results["temp_curve"]
    return {"temp_curve": {"rows": rows, "first": rows[0], "last": rows[-1],
                           "max_distinct": max(rows, key=lambda row: row["distinct"])},
            "trend": {"curve_distinct": direction(row["distinct"] for row in rows),
                      "curve_entropy": direction(row["mean_entropy_nats"] for row in rows)}}


def compare_section(results: dict) -> dict:
    return {"compare": compare_context(results["compare"])} if "compare" in results else {}


def batch_section(results: dict) -> dict:
    return {"batch": batch_context(results["batch"])} if "batch" in results else {}


def kv_waste_section(results: dict) -> dict:
    if "kv_waste" not in results:
        return {}
    return {"kv_waste": kv_waste_context(results["kv_waste"], results["kv_waste_requests"])}


def anatomy_section(results: dict) -> dict:
    if "step_anatomy" not in results:
        return {}
    return {"anatomy": anatomy_context(results["step_anatomy"], results.get("latency"))}


def fidelity_section(results: dict) -> dict:
    if "fidelity" not in results:
        return {}
    fidelity = results["fidelity"]
    return {"fidelity": {"identical": fidelity["identical"], "checks": fidelity["checks"],
                         "differing": len(fidelity["differences"]), "path": fidelity["minimind"]["path"],
                         "layout": fidelity["minimind"]["layout"],
                         "first": fidelity["differences"][0] if fidelity["differences"] else None}}


# Of a cached step's time, the fixed share above which the report calls it most of the step, and
# below which a small part.
MOST, SMALL = 0.5, 0.25


def anatomy_context(data: dict, latency: dict | None) -> dict:
    """step_anatomy.json for the prose: the three steps' parts (shares in %, the order of the largest
    computations, the fixed cost per operator call), whether the sheet's "fixed cost per step
    (Python and kernel calls)" is most, a large part or a small part of a cached step (judged only
    when the cached step's parts add up), the per-step fit's fixed cost beside it (when the latency
    split ran), and where the preallocated (and compiled) steps lie against the others."""
    anatomy, curve = data["anatomy"], data["curve"]
    names = anatomy["steps"]
    steps = {}
    for name in names:
        step = anatomy[name]
        computed = {part: step["shares"][part] for part in anatomy["compute_parts"]}
        steps[name] = {**step, "percent": {part: 100 * share for part, share in step["shares"].items()},
                       "off_percent": 100 * step["sum_of_parts_off"],
                       "largest": sorted(computed, key=computed.get, reverse=True)[:3],
                       "us_per_call": 1e3 * step["ms"]["fixed"] / step["operator_calls"] if step["operator_calls"] else 0.0}
    cached = anatomy["with_cache_cat"]
    fixed = cached["shares"]["fixed"]
    compiled = curve.get("compiled")
    return {
        **steps,
        "steps": names,
        "context_tokens": anatomy["context_tokens"],
        "shrunk_sizes": anatomy["shrunk_sizes"],
        "pairs": anatomy["profiled_pairs"],
        # a verdict on the sheet's explanation only from parts that add up to the step
        "verdict": ("unclear" if not cached["adds_up"]
                    else "most" if fixed >= MOST else "small" if fixed < SMALL else "large"),
        "all_add_up": all(steps[name]["adds_up"] for name in steps),
        "not_adding_up": [name for name in names if not steps[name]["adds_up"]],
        "other_operators": [name for name in names if not steps[name]["same_operators"]],
        "fit_fixed_ms": latency["fit"]["fixed_s"] * 1e3 if latency else None,
        "curve": curve,
        "longest": curve["contexts"][-1],
        # cat / static: "above" 1 when MiniMind's cache is slower, "below" when faster, "within" can't tell
        "static_vs_cat": against((curve["cat_over_static"]["low"], curve["cat_over_static"]["high"]), 1.0),
        "compiled": compiled,
        "compiled_same_token": all(compiled["same_next_token"]) if compiled else None,
        "compiled_max_difference": max(compiled["max_logit_difference"]) if compiled else None,
        # compiled at the shortest context, even its third quartile under the eager step's fixed cost:
        # compiling cut the fixed cost itself, not only the arithmetic
        "compiled_under_fixed": bool(compiled and compiled["q3_ms"][0] < anatomy["with_cache_static"]["ms"]["fixed"]),
        "compiled_vs_static": (against((curve["static_over_compiled"]["low"], curve["static_over_compiled"]["high"]), 1.0)
                               if compiled else None),
    }


def compare_context(rows: list[dict]) -> dict:
    """compare.csv with, per row, the speedup as a share of the token ratio; and the trends over model
    size that the prose may state, each only where the spreads of neighbouring sizes do not overlap
    (the fixed share of an average no-cache step is a column of the table, with its spread)."""
    rows = [{**row, "of_ratio": row["speedup"] / row["token_ratio"], "formulas_match": formulas_match(row),
             "bytes_match": row["kv_bytes_per_token_formula"] == row["kv_bytes_per_token_measured"]} for row in rows]
    by_size = sorted(rows, key=lambda row: row["parameters"])
    return {
        "rows": rows,
        "smallest": by_size[0],
        "largest": by_size[-1],
        "speedup_trend": interval_direction((row["speedup_low"], row["speedup_high"]) for row in by_size),
        "fixed_share_trend": interval_direction(
            (row["fixed_share_without_cache_low"], row["fixed_share_without_cache_high"]) for row in by_size),
        "all_same": all(row["same_ids"] for row in rows),
        "all_match": all(row["formulas_match"] and row["bytes_match"] for row in rows),
        "random": [row["name"] for row in rows if row["weights"] != "checkpoint"],
        "ratios": sorted({round(row["token_ratio"], 1) for row in rows}),
    }


def batch_context(rows: list[dict]) -> dict:
    """batch.tsv by mode, with what the prose may say: whether the largest B makes tokens faster than
    the smallest (its gain's interval above 1), up to which B the throughput grows clearly (each B's
    interval above the one before), and how a decode step's time grew before and after that B."""
    modes = {}
    for mode in BATCH_MODES:
        mode_rows = [row for row in rows if row["mode"] == mode]
        if not mode_rows:
            continue
        first, last = mode_rows[0], mode_rows[-1]
        grows_to = first
        for before, after in zip(mode_rows, mode_rows[1:]):
            if after["S_TG_low"] <= before["S_TG_high"]:
                break
            grows_to = after
        modes[mode] = {
            "rows": mode_rows, "first": first, "last": last, "grows_to": grows_to,
            "gain": against((last["S_TG_gain_low"], last["S_TG_gain_high"]), 1.0),
            "still_growing": grows_to is last,
            # a decode step's time against the rows it serves, up to grows_to and after it
            "step_before": grows_to["ms_per_step"] / first["ms_per_step"], "rows_before": grows_to["B"] / first["B"],
            "step_after": last["ms_per_step"] / grows_to["ms_per_step"], "rows_after": last["B"] / grows_to["B"],
            "pad_share": last["pad"] / (last["B"] * last["PP"]),
        }
    for mode in modes.values():
        # the per-row work sets the step's time once the step grows at least half as fast as the rows
        mode["row_bound"] = not mode["still_growing"] and mode["step_after"] >= 1 + (mode["rows_after"] - 1) / 2
    return {
        "rows": rows, "modes": modes,
        "all_same": all(row["same_as_single"] for row in rows),
        "differing": [f"{row['mode']} B = {row['B']}" for row in rows if not row["same_as_single"]],
        "bytes_match": all(row["kv_bytes_measured"] == row["kv_bytes_formula"] for row in rows),
    }


def kv_waste_context(rows: list[dict], detail: dict) -> dict:
    """kv_waste.csv by policy, the requests it was measured on, each policy's requests per budget, and
    the vLLM paper's shares (theirs). Every request's split must add up to what it reserves."""
    requests = detail["requests"]
    budgets = fits_budgets(rows[0])
    rows = [{**row, "fits": [row[column] for column in budgets.values()]} for row in rows]
    by_policy = {row["policy"]: row for row in rows}
    adds_up = all(
        math.isclose(split["reserved"], split["token"] + split["reservation"] + split["internal_fragmentation"],
                     rel_tol=1e-9)
        for request in requests for split in request["slots"].values())
    prompts = [request["prompt_len"] for request in requests]
    answers = [request["answer_len"] for request in requests]
    finals = sorted(request["final_len"] for request in requests)
    return {
        "rows": rows, "by_policy": by_policy, "budgets": list(budgets), "adds_up": adds_up,
        "requests": len(requests), "prompt_range": (min(prompts), max(prompts)),
        "answer_range": (min(answers), max(answers)), "median_final": finals[len(finals) // 2],
        "at_eos": sum(request["eos"] for request in requests),
        "bytes_per_token": detail["bytes_per_token"], "max_length": detail["max_length"],
        "block_tokens": detail["block_tokens"], "answer_cap": detail["answer_cap"],
        "fits_gain": by_policy["blocks"]["fits"][0] / by_policy["max_length"]["fits"][0],
        "paper": VLLM_PAPER,
    }


def capacity_table(rows: list[dict]) -> dict:
    """kv_capacity.csv as one line per (model, dtype) and one column per (budget, context).
    A cell reads "requests (concurrency x)"."""
    columns = list(dict.fromkeys((row["budget_gib"], row["context_tokens"]) for row in rows))
    lines: dict = {}
    for row in rows:
        line = lines.setdefault((row["model"], row["dtype"]), {
            "model": row["model"], "dtype": row["dtype"], "layers": row["layers"], "kv_heads": row["kv_heads"],
            "head_dim": row["head_dim"], "formula": row["bytes_per_token_formula"],
            "measured": row["bytes_per_token_measured"], "by_column": {}})
        line["by_column"][(row["budget_gib"], row["context_tokens"])] = (
            f"{row['max_requests']:,} ({row['max_concurrency']:,.2f}x)")
    for line in lines.values():
        line["match"] = line["formula"] == line["measured"]
        measured = line["measured"]
        line["measured_text"] = f"{measured:,.0f}" if measured == int(measured) else f"{measured:,.2f}"
        by_column = line.pop("by_column")
        line["cells"] = [by_column[column] for column in columns]
    # vLLM's wording for one (model, dtype): the last listed, by default the configured one in float16
    last = rows[-1]
    examples = [row for row in rows if (row["model"], row["dtype"]) == (last["model"], last["dtype"])]
    return {"columns": [{"budget_gib": b, "context_tokens": c} for b, c in columns], "lines": list(lines.values()),
            "all_match": all(line["match"] for line in lines.values()), "examples": examples,
            "example_name": f"{last['model']}, {last['dtype']}"}


SECTIONS = (model_section, kv_section, temperature_section, topp_section, sweep_section, latency_section,
            capacity_section, topp_curve_section, compare_section, temp_curve_section, batch_section,
            kv_waste_section, anatomy_section, fidelity_section)


# --- across sections: the timings to read with care, and one generation timed three ways ---------


def unstable_timings(results: dict) -> list[dict]:
    """Every timing the rule calls unstable (IQR at least 10% of its median), as {what, share}: step 3's
    modes, the sweep's N, the per-step timing's modes, the compared models, the batches, the opened
    steps and the two caches' last steps."""
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
        found += [{"what": "anatomy", "mode": f"{kind} @ {context}", "share": row["iqr_share"]}
                  for kind in curve["kinds"]
                  for context, row in zip(curve["contexts"], curve[kind]["steps"])
                  if row["unstable"]]
    return found


def same_generation(results: dict) -> dict:
    """The lab's timed generation (step 3's P and N) as other parts timed it too: the sweep's row at the
    same N and the per-step timing's own generations; whether their speedups' intervals all meet."""
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
    intervals = [(timing["low"], timing["high"]) for timing in timings]
    agree = all(overlap(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1:])
    return {"timings": timings, "agree": agree, "several": len(timings) > 1}


# --- rendering ------------------------------------------------------------------------------------


def load_results(paths: dict[str, str]) -> tuple[dict, dict]:
    """The report's inputs by name: (JSON files as dicts and CSV tables as lists of row dicts,
    figures (PNG) as links relative to the report, which sits in the same folder as figures/)."""
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


def render_report(template_path, result_paths: dict[str, str], language: str) -> str:
    """Load the result files ({input name: path}) and render the template in a sandbox."""
    results, figures = load_results(result_paths)
    return sandboxed_template(template_path).render(**build_context(results, language), **figures)
