"""The sections of results/beyond.md: what lies beyond the lab sheet, each short, each a function of the
loaded result files alone, giving nothing when its result was not built. The wide tables stay in
the result files and lab_tables.html; each section here shows at most six columns, its figure, and
the sentences its verdicts (kvlab.present.verdicts) choose, every timed comparison on the clock it
is judged on (kvlab.present.clocks: the CPU clock's when a side was contended).
"""

from __future__ import annotations

import math

import numpy as np

from kvlab.facts import timing
from kvlab.facts.formulas import BATCH_MODES, MODES, VLLM_PAPER, fits_budgets
from kvlab.present import clocks
from kvlab.present.verdicts import (against, comparison, direction, gap_cause, growth, on_clock, one_clock, steps,
                                    trend, value_against)


def model_section(results: dict) -> dict:
    """The models: each checkpoint's layout and where its fields came from; the prompt's perplexity."""
    return {"card": model_card_context(results["model_card"])}


def model_card_context(card: dict) -> dict:
    """model_card.json with each model's fields grouped by where they came from; models alike in every
    field and its source are given once, with all their names."""
    models = []
    for name, entry in card["models"].items():
        by_source: dict[str, list[str]] = {}
        for field, source in entry["sources"].items():
            by_source.setdefault(source, []).append(f"{field} {entry['config'][field]}")
        model = {"names": [name], "layout": entry["layout"], "parameters": entry["parameters"],
                 "config": entry["config"], "by_source": by_source, "head_count": entry.get("head_count")}
        # models of one layout whose every field came from the same place are one line: `pretrain`, `sft`
        same = next((other for other in models if {k: v for k, v in other.items() if k != "names"}
                     == {k: v for k, v in model.items() if k != "names"}), None)
        if same is None:
            models.append(model)
        else:
            same["names"].append(name)
    return {"models": models, "warnings": card["warnings"], "perplexity": card["prompt_perplexity"],
            "tokenizer_vocab_size": card["tokenizer_vocab_size"]}


def formulas_match(row: dict) -> bool:
    """Whether a row's fed tokens (sweep.csv, compare.csv) equal both formulas."""
    return (row["fed_with_cache"] == row["formula_with_cache"]
            and row["fed_without_cache"] == row["formula_without_cache"])


def sweep_section(results: dict) -> dict:
    """Steps 1-3 for several N: the counts against the formulas, and at the longest N the time gain
    against the token gain."""
    if "sweep" not in results:
        return {}
    pairs = [clocks.sweep_speedup(row, results.get("sweep_runs")) for row in results["sweep"]]
    # every N on one clock: the CPU clock's when any N's runs waited for the CPU
    judged = one_clock([pair["wall"] for pair in pairs], [pair["cpu"] for pair in pairs])
    rows = [{**row, "formulas_match": formulas_match(row), "shown": shown}
            for row, shown in zip(results["sweep"], judged["values"])]
    last = rows[-1]
    return {"sweep": {"rows": rows, "last": last, "all_match": all(row["formulas_match"] for row in rows),
                      "all_same": all(row["same_ids"] for row in rows), "clock": judged["clock"],
                      "time_vs_tokens": against(judged["intervals"][-1], last["token_ratio"]),
                      **budget_said(results.get("sweep_runs"))}}


def latency_section(results: dict) -> dict:
    """Step 3's generation timed a step at a time: TTFT, TPOT, and what a fixed cost per step plus a
    cost per token fed predicts, against what was measured, on one clock (`latency_on_clock`), and
    where a prediction that misses goes wrong (`gap_cause`)."""
    if "latency" not in results:
        return {}
    latency = results["latency"]
    judged = on_clock(*clocks.latency_speedup(latency).values())
    fit, predicted, outside = latency_on_clock(latency, judged["clock"])
    interval = (judged["low"], judged["high"])
    cached, alone = latency["with_cache"], latency.get("prefill_alone", {}).get("ratio")
    decode = cached["step_s"][1:]
    quarter = max(len(decode) // 4, 1)
    cached_growth = growth(decode[:quarter], decode[-quarter:]) if len(decode) >= 2 else "flat"
    speedup = predicted["without_cache"] / predicted["with_cache"]
    prediction = value_against(speedup, interval)
    return {"latency": {
        **{label: {key: latency[label][key] for key in ("ttft_s", "ttft", "tpot_s", "sum_steps_s", "generate_s",
                                                       "generate")}
           for label in ("with_cache", "without_cache")},
        "fit": fit, "clock": judged["clock"],
        "predicted": {**predicted, "speedup": speedup},
        # the speedup of these same instrumented generations, the one the fit predicts, on the judged clock
        "measured": judged,
        "new_tokens": latency["new_tokens"], **budget_said(latency),
        "probe_only": [label for label, whole in latency.get("warmups", {}).items() if whole == 0],
        "prompt_len": latency["prompt_len"],
        "ttft_agree": latency["ttft_agree"],
        # the prefill alone, both modes in alternation: does the work differ, or only the order?
        "prefill_alone": alone and {**alone, "verdict": against((alone["low"], alone["high"]), 1.0)},
        # a fit that explains little, or a negative fixed cost, says the clock was noisy
        "fit_unreliable": fit["r2"] < 0.8 or fit["fixed_s"] <= 0,
        # the prediction against the measured interval: "above", "below" or "within" it
        "prediction": prediction,
        # each generation's time outside its forward calls, and why a prediction that misses does
        "outside": outside, "cached_growth": cached_growth,
        "gap": gap_cause(predicted, outside, interval, cached_growth) if prediction != "within" else None,
    }}


def latency_on_clock(latency: dict, clock: str) -> tuple[dict, dict, dict]:
    """The per-step fit on `clock`, with each mode's time by it and each generation's time outside its
    forward calls: latency.json's own (wall clock), or made again on the CPU clock, each run's step
    times times its run's CPU share (kvlab.facts.timing.cpu_seconds)."""
    labels = [label for label, _ in MODES]
    if clock == "wall":
        fit = latency["fit"]
        predicted = {label: latency["predicted"][f"{label}_s"] for label in labels}
        return fit, predicted, {label: latency[label]["generate_s"] - latency[label]["sum_steps_s"] for label in labels}
    step_s, generate_s = {}, {}
    for label in labels:
        mode = latency[label]
        step_s[label] = [float(np.median(timing.cpu_seconds(mode["usage"], samples)))
                         for samples in mode["step_samples_s"]]
        generate_s[label] = timing.cpu_summary(mode["usage"])["median_s"]
    fit = {**timing.fit_step_cost([fed for label in labels for fed in latency[label]["fed_tokens"]],
                                  [seconds for label in labels for seconds in step_s[label]]),
           "on": latency["fit"].get("on")}
    predicted = {label: timing.predict_time(latency[label]["fed_tokens"], fit) for label in labels}
    return fit, predicted, {label: generate_s[label] - sum(step_s[label]) for label in labels}


def capacity_section(results: dict) -> dict:
    return {"capacity": capacity_table(results["kv_capacity"])} if "kv_capacity" in results else {}


def topp_curve_section(results: dict) -> dict:
    """Top-p survivors for every p after both prefixes, and which keeps more."""
    if "topp_curve" not in results:
        return {}
    rows = results["topp_curve"]
    # the lab sheet's own p values, and the end of the curve
    marks = [row for row in rows if row["lab_p"] or row is rows[-1]]
    last = rows[-1]
    return {"topp_curve": {"rows": rows, "first": rows[0], "last": last, "marks": marks,
                           "comparison": comparison((row["flat"], row["sharp"]) for row in rows),
                           "ties": sum(row["flat"] == row["sharp"] for row in rows)}}


def temp_curve_section(results: dict) -> dict:
    """Distinct answers and entropy for a grid of temperatures, and how each moves."""
    if "temp_curve" not in results:
        return {}
    rows = results["temp_curve"]
    return {"temp_curve": {"rows": rows, "first": rows[0], "last": rows[-1],
                           "max_distinct": max(rows, key=lambda row: row["distinct"]),
                           "distinct": direction(row["distinct"] for row in rows),
                           "entropy": direction(row["mean_entropy_nats"] for row in rows),
                           **budget_said(results.get("temp_curve_answers"))}}


def compare_section(results: dict) -> dict:
    return {"compare": compare_context(results["compare"])} if "compare" in results else {}


def batch_section(results: dict) -> dict:
    if "batch" not in results:
        return {}
    return {"batch": {**batch_context(results["batch"], results.get("batch_runs")),
                      **budget_said(results.get("batch_runs"))}}


def budget_said(runs: dict | None) -> dict:
    """What a measurement's time budget left out (kvlab.facts.budget), from its runs' file."""
    budget = (runs or {}).get("budget", {})
    return {"cut": budget.get("cut", []), "budget_s": budget.get("budget_s")}


def kv_waste_section(results: dict) -> dict:
    if "kv_waste" not in results:
        return {}
    return {"kv_waste": kv_waste_context(results["kv_waste"], results["kv_waste_requests"])}


def anatomy_section(results: dict) -> dict:
    if "step_anatomy" not in results:
        return {}
    return {"anatomy": {**anatomy_context(results["step_anatomy"], results.get("latency")),
                        **budget_said(results["step_anatomy"]["anatomy"])}}


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
    cat_over_static = on_clock(*clocks.curve_ratio(curve, "cat", "static").values())
    pair = clocks.curve_ratio(curve, "static", "compiled") if compiled else None
    static_over_compiled = on_clock(*pair.values()) if pair else None
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
        # cat / static at the longest context, on the CPU clock when either step's runs waited for it
        "cat_over_static": cat_over_static,
        # "above" 1 when MiniMind's cache is slower, "below" when faster, "within" can't tell
        "static_vs_cat": cat_over_static["verdict"],
        "static_over_compiled": static_over_compiled,
        "compiled": compiled,
        "compiled_same_token": all(compiled["same_next_token"]) if compiled else None,
        "compiled_max_difference": max(compiled["max_logit_difference"]) if compiled else None,
        # compiled at the shortest context, even its third quartile under the eager step's fixed cost:
        # compiling cut the fixed cost itself, not only the arithmetic
        "compiled_under_fixed": bool(compiled and compiled["q3_ms"][0] < anatomy["with_cache_static"]["ms"]["fixed"]),
        "compiled_vs_static": static_over_compiled["verdict"] if static_over_compiled else None,
    }


def compare_context(rows: list[dict]) -> dict:
    """compare.csv by model size, with the speedup as a share of the token ratio, and how the speedup
    and the fixed share of an average no-cache step move from one size to the next, told step by step
    where the spreads of neighbouring sizes do not meet; the speedups on one clock (the CPU clock's
    when any model's runs were contended), each row's as `shown`."""
    rows = sorted(rows, key=lambda row: row["parameters"])
    pairs = [clocks.compare_speedup(row) for row in rows]
    # every model on one clock: the CPU clock's when any model's runs waited for the CPU
    judged = one_clock([pair["wall"] for pair in pairs], [pair["cpu"] for pair in pairs])
    rows = [{**row, "shown": shown, "of_ratio": shown["ratio"] / row["token_ratio"], "formulas_match": formulas_match(row),
             "bytes_match": row["kv_bytes_per_token_formula"] == row["kv_bytes_per_token_measured"]}
            for row, shown in zip(rows, judged["values"])]
    speedups = judged["intervals"]
    shares = [(row["fixed_share_without_cache_low"], row["fixed_share_without_cache_high"]) for row in rows]
    return {
        "rows": rows, "smallest": rows[0], "largest": rows[-1], "clock": judged["clock"],
        "speedup_steps": [{"from": a["name"], "to": b["name"], "verdict": verdict}
                          for a, b, verdict in zip(rows, rows[1:], steps(speedups))],
        "speedup_trend": trend(speedups), "fixed_share_trend": trend(shares),
        "all_same": all(row["same_ids"] for row in rows),
        "all_match": all(row["formulas_match"] and row["bytes_match"] for row in rows),
        "random": [row["name"] for row in rows if row["weights"] != "checkpoint"],
        "cut": [{"name": row["name"], "runs": row["runs_cut"], "budget_s": row.get("budget_s")}  # cut by its budget
                for row in rows if isinstance(row.get("runs_cut"), str) and row["runs_cut"]],
    }


def batch_context(rows: list[dict], batch_runs: dict | None = None) -> dict:
    """batch.tsv by mode, with what the prose may say: whether the largest B makes tokens faster than
    the smallest (its gain's interval above 1), up to which B the throughput grows clearly (each B's
    interval above the one before), and how a decode step's time grew before and after that B. A
    mode's throughputs are judged on one clock: the CPU clock's (tokens per second of the decode's CPU
    time, from batch_runs.json's runs) when any of its batches waited for the CPU; each row's judged
    throughput is its `shown`."""
    modes = {}
    for mode in BATCH_MODES:
        mode_rows = [row for row in rows if row["mode"] == mode]
        if not mode_rows:
            continue
        pairs = [clocks.batch_throughput(row, batch_runs) for row in mode_rows]
        judged = one_clock([pair["wall"] for pair in pairs], [pair["cpu"] for pair in pairs])
        mode_rows = [{**row, "shown": shown} for row, shown in zip(mode_rows, judged["values"])]
        intervals = judged["intervals"]
        first, last = mode_rows[0], mode_rows[-1]
        grows_to = first
        for index in range(1, len(mode_rows)):
            if intervals[index][0] <= intervals[index - 1][1]:
                break
            grows_to = mode_rows[index]
        gain_pair = clocks.batch_gain(pairs[0], pairs[-1], first, last, batch_runs)
        # the largest B over the smallest, on the mode's clock
        gain = on_clock({**gain_pair["wall"], "contended": judged["clock"] == "cpu"}, gain_pair["cpu"])
        modes[mode] = {
            "rows": mode_rows, "first": first, "last": last, "grows_to": grows_to, "clock": judged["clock"],
            # the throughput from each B to the next: "rises", "falls" or "unclear" (intervals meet)
            "steps": steps(intervals),
            "gain": gain["verdict"], "gain_ratio": gain["ratio"],
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
        "rows": rows, "modes": modes, "clock": "cpu" if any(m["clock"] == "cpu" for m in modes.values()) else "wall",
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
        "paper": VLLM_PAPER, **budget_said(detail),
    }


def capacity_table(rows: list[dict]) -> dict:
    """kv_capacity.csv at its first budget, one line per (model, dtype) with the requests that fit at
    each context (the other budgets stay in the file), and whether every measured byte count equals
    the formula."""
    budgets = list(dict.fromkeys(row["budget_gib"] for row in rows))
    contexts = list(dict.fromkeys(row["context_tokens"] for row in rows))
    lines: dict = {}
    for row in rows:
        if row["budget_gib"] != budgets[0]:
            continue
        line = lines.setdefault((row["model"], row["dtype"]), {
            "model": row["model"], "dtype": row["dtype"], "bytes_per_token": row["bytes_per_token_measured"],
            "fits": {}})
        line["fits"][row["context_tokens"]] = row["max_requests"]
    return {"budget": budgets[0], "budgets": budgets, "contexts": contexts,
            "lines": [{**line, "fits": [line["fits"].get(context) for context in contexts]} for line in lines.values()],
            "all_match": all(row["bytes_per_token_formula"] == row["bytes_per_token_measured"] for row in rows)}


def serving_trace_section(results: dict) -> dict:
    """Continuous batching against static and against one request at a time on one trace (serve_counts,
    serve_timing, serve_trace, serve_rates): exact counts first (steps, slot utilisation, preemptions,
    prefix hits, memory shared by n > 1 samples, the mismatches against `generate` alone), then the
    timed ratios, each judged by its interval against 1 (throughput on the CPU clock where a side waited
    for the CPU), and the latency against the request rate."""
    if "serve_counts" not in results:
        return {}
    runs = {row["run"]: row for row in results["serve_counts"]}
    static, continuous = runs["static"], runs["continuous"]
    tight = next(row for row in results["serve_counts"] if row["num_blocks"] < continuous["num_blocks"])
    prefix_on = next(row for row in results["serve_counts"] if row["trace"] == "prefix" and row["prefix_caching"])
    prefix_off = next(row for row in results["serve_counts"] if row["trace"] == "prefix" and not row["prefix_caching"])
    parallel = next(row for row in results["serve_counts"] if row["trace"] == "parallel")
    timing = {(row["comparison"], row["quantity"]): row for row in results.get("serve_timing", [])}

    def ratio(comparison: str, quantity: str) -> dict:
        row = timing[(comparison, quantity)]
        return {"ratio": row["ratio"], "low": row["ratio_low"], "high": row["ratio_high"],
                "verdict": against((row["ratio_low"], row["ratio_high"]), 1.0), "unstable": row["unstable"],
                "contended": bool(row.get("contended", False)), "quantity": quantity, "sides": [row["baseline"], row["subject"]]}

    def clocked(comparison: str) -> dict:
        """Throughput on the wall clock, or on the CPU clock where a side waited for the CPU."""
        return on_clock(ratio(comparison, "throughput"), ratio(comparison, "throughput_cpu"))

    versus = "continuous vs static"
    detail = results.get("serve_trace", {})
    rates = results.get("serve_rates", [])
    by_policy = {policy: [row for row in rates if row["policy"] == policy] for policy in ("continuous", "static")}
    return {"serving_trace": {
        "static": static, "continuous": continuous, "tight": tight, "prefix_on": prefix_on,
        "prefix_off": prefix_off, "parallel": parallel,
        "mismatches": sum(row["greedy_mismatches"] + row["seeded_mismatches"] for row in results["serve_counts"]),
        "checked": sum(row["checked_requests"] for row in results["serve_counts"]),
        "alone_mismatches": sum(detail.get("one_at_a_time", {}).get(key, 0)
                                for key in ("greedy_mismatches", "seeded_mismatches")),
        # exact counts, the same on every machine: fewer steps, fuller slots
        "steps": comparison([(static["forward_steps"], continuous["forward_steps"])]),
        "step_ratio": static["forward_steps"] / continuous["forward_steps"],
        "utilisation": comparison([(continuous["slot_utilisation"], static["slot_utilisation"])]),
        "prefix_peak": comparison([(prefix_off["peak_blocks"], prefix_on["peak_blocks"])]),
        "throughput": clocked(versus), "over_alone": clocked("continuous vs one at a time"),
        "ways": detail.get("way_counts", {}), "alone_checked": detail.get("one_at_a_time", {}),
        "compile_s": detail.get("compile_s", {}), "ttft": ratio(versus, "ttft_p50"),
        "tpot": ratio(versus, "tpot_p50"), "latency": ratio(versus, "latency_p90"),
        "prefix_ttft": ratio("prefix cache on vs off", "ttft_p50"),
        "scheduler_share": timing[(versus, "scheduler_share")]["subject_median"],
        "parallel_saving": value_against(parallel["memory_saved_share"], VLLM_PAPER["parallel_sampling_saving"]),
        "paper": VLLM_PAPER,
        "rates": [{"fraction": c["fraction"], "continuous": c["normalized_latency_steps"],
                   "static": s["normalized_latency_steps"]} for c, s in zip(by_policy["continuous"], by_policy["static"])],
        "rate_direction": direction(row["normalized_latency_steps"] for row in by_policy["continuous"]),
        "static_saturation": rates[0]["saturation_fraction_static"] if rates else None,
        "compiled": compiled_steps(results.get("compiled_steps", {})),
        **budget_said(detail),
    }}


def compiled_steps(kept: dict) -> dict | None:
    """The serving steps compile_steps made ready (compiled_steps.json): for the single-request path and
    the engine, the seconds and whether it was loaded (an earlier build compiled it) or compiled here;
    None where a step ran eager (nothing compiled, nothing kept)."""
    steps = kept.get("steps", {})
    if not all(steps.get(name, {}).get("files") for name in ("one_at_a_time", "engine")):
        return None
    return {name: {"seconds": steps[name]["seconds"], "loaded": steps[name]["loaded"]}
            for name in ("one_at_a_time", "engine")}


SECTIONS = (model_section, sweep_section, latency_section, anatomy_section, capacity_section, topp_curve_section,
            temp_curve_section, compare_section, batch_section, kv_waste_section, serving_trace_section,
            fidelity_section)
