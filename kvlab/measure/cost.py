"""One model's cost, measured the lab's way, for the comparison of models (kvlab.facts.compare):
tokens fed, same ids, median times, TTFT/TPOT with the fixed-cost fit, KV bytes per token.

Every number comes from the lab's own functions (kvlab.measure.steps, curves, capacity): no second
implementation of counting, timing or fitting. The median times and the per-step fit come from one
set of timed runs (curves.step_latency times each whole generation as well as each step), which
halves the cost of the biggest models' job.
"""

from __future__ import annotations

from kvlab.engine.device import dtype_name
from kvlab.engine.model import count_parameters
from kvlab.measure import capacity, curves, steps
from kvlab.facts import timing
from kvlab.facts.budget import Budget
from kvlab.facts.formulas import MODES, fed_formulas


def measure_cost(model, prompt_ids: list[int], new_tokens: int, warmup: int, repeats: int, max_seconds: float,
                 kv_tokens: int, seed: int, device, budget: Budget | None = None) -> dict:
    """cost.json for one model: steps 1-2 (same ids, fed tokens counted by wrapping `forward`), step 3's
    median times with the speedup's interval and the per-step latency with its fixed-cost fit (one set
    of timed runs, measured by kvlab.measure.curves.step_latency: `repeats` runs per mode and more while
    unstable, after `warmup` untimed ones, the counting generation the first; each whole generation
    timed as well as each step; the fit made on each pair of runs too, for its spread), and step 4's
    bytes per token. `prompt_ids` are already cut to P. Within `budget` the timed generations are
    planned as step_latency plans them (a probe of each mode's first steps first)."""
    config = model.config
    same, count = steps.greedy_with_and_without_cache(model, prompt_ids, new_tokens, device)
    # the counting generations above are the first warm-up of each mode (as the sweep's are)
    latency = curves.step_latency(model, prompt_ids, new_tokens, max(warmup - 1, 0), repeats, max_seconds, device,
                                  budget)
    dtype = dtype_name(next(model.parameters()).dtype)
    kv = capacity.bytes_per_token(model, dtype, kv_tokens, seed, device)
    formulas = fed_formulas(len(prompt_ids), new_tokens)
    with_s, without_s = latency["with_cache"]["generate_s"], latency["without_cache"]["generate_s"]
    summaries = {label: latency[label]["generate"] for label, _ in MODES}
    return {
        "parameters": count_parameters(model),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "dtype": dtype,
        "device": latency["device"],
        "processor": latency["processor"],
        "torch_threads": latency["torch_threads"],
        "prompt_len": len(prompt_ids),
        "new_tokens": new_tokens,
        "fed_with_cache": count["fed_with_cache"],
        "fed_without_cache": count["fed_without_cache"],
        "formula_with_cache": formulas["with_cache"],
        "formula_without_cache": formulas["without_cache"],
        "same_ids": same["same_ids"],
        "with_cache_s": with_s,
        "without_cache_s": without_s,
        "speedup": without_s / with_s,
        "token_ratio": count["fed_without_cache"] / count["fed_with_cache"],
        "warmup": warmup,
        "repeats": repeats,
        **timing.spread_columns(summaries, latency["measured"]),
        "ttft_with_cache_s": latency["with_cache"]["ttft_s"],
        "tpot_with_cache_s": latency["with_cache"]["tpot_s"],
        "ttft_without_cache_s": latency["without_cache"]["ttft_s"],
        "tpot_without_cache_s": latency["without_cache"]["tpot_s"],
        "fit_fixed_s": latency["fit"]["fixed_s"],
        "fit_per_token_s": latency["fit"]["per_token_s"],
        "fit_r2": latency["fit"]["r2"],
        "predicted_speedup": latency["predicted"]["speedup"],
        "kv_bytes_per_token_formula": kv["formula"],
        "kv_bytes_per_token_measured": kv["measured"],
        # every sample: the whole generations, their clocks and the per-pair fits (not columns of compare.csv)
        "generate_samples_s": {label: latency[label]["generate_samples_s"] for label in summaries},
        "generate_usage": {label: latency[label]["usage"] for label in summaries},
        "fit_runs": latency["fit_runs"],
        "budget": latency["budget"],
    }
