"""Several models measured the same way: the lab's cost steps (tokens fed, same ids, median time,
TTFT/TPOT with the fixed-cost fit, KV bytes per token) for each model in the config's `compare`.

The lesson: the cache cuts the tokens fed by the same ratio for every model, but the time only
by as much as the work per token outweighs each step's fixed cost. A bigger model does more work
per token, so its speedup climbs toward the token ratio.

Every number comes from the lab's own functions (kvlab.lab.steps, curves, capacity): no second
implementation of counting, timing or fitting. The median times and the per-step fit come from one
set of timed runs (curves.step_latency times each whole generation as well as each step), which
halves the cost of the biggest models' job. `check_entries` validates the config's entries
without PyTorch, so the rule files can refuse a bad one before any job runs.
"""

from __future__ import annotations

import math
import re

# The lab's own pretrained model: always the first row.
LAB_NAME = "lab"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
# MiniMind's own vocabulary, for an architecture entry that names none.
DEFAULT_VOCAB_SIZE = 6400


class CompareError(ValueError):
    """A `compare` entry that cannot be measured, with one line naming the entry and the key."""


def check_entries(entries: list[dict], prompt_tokens: int, lab_prompt_len: int) -> None:
    """Raise CompareError for the first entry the config alone shows to be wrong."""
    seen = {LAB_NAME}
    for index, entry in enumerate(entries):
        where = f"config key 'compare[{index}]'"
        name = entry.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise CompareError(f"{where}.name: {name!r} must be letters, digits, '-' or '_' (it names a folder)")
        where = f"config key 'compare[{index}]' ({name})"
        if name in seen:
            reason = "is the lab's own model, always the first row" if name == LAB_NAME else "is used twice"
            raise CompareError(f"{where}.name: {name!r} {reason}")
        seen.add(name)
        has_checkpoint, has_architecture = "checkpoint" in entry, "architecture" in entry
        if has_checkpoint == has_architecture:
            raise CompareError(f"{where}: give exactly one of 'checkpoint' and 'architecture' "
                               f"(found {'both' if has_checkpoint else 'neither'})")
        if has_architecture:
            _check_architecture(entry["architecture"], f"{where}.architecture")
        elif "model_overrides" in entry and not isinstance(entry["model_overrides"], dict):
            raise CompareError(f"{where}.model_overrides: expected a mapping of MiniMind config fields")
    if prompt_tokens > lab_prompt_len:
        raise CompareError(f"config key 'extras.compare.prompt_tokens': {prompt_tokens} is longer than the lab's "
                           f"prompt ({lab_prompt_len} tokens, bos included: lab.prompt.cut_tokens + 1)")


def _check_architecture(arch: dict, where: str) -> None:
    missing = [key for key in ARCHITECTURE_KEYS if key not in arch]
    if missing:
        raise CompareError(f"{where}: missing {', '.join(missing)}")
    heads, kv_heads, hidden = arch["num_attention_heads"], arch["num_key_value_heads"], arch["hidden_size"]
    if heads % kv_heads:
        raise CompareError(f"{where}.num_key_value_heads: {kv_heads} does not divide num_attention_heads={heads}")
    head_dim = arch.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise CompareError(f"{where}.num_attention_heads: {heads} does not divide hidden_size={hidden} "
                               f"(or give head_dim)")
        head_dim = hidden // heads
    if head_dim % 2:
        raise CompareError(f"{where}.head_dim: {head_dim} must be even (rotary embeddings turn pairs of values)")


def architecture_fields(arch: dict) -> dict:
    """MiniMindConfig fields of an architecture entry, with MiniMind's vocabulary unless it names one."""
    return {"vocab_size": DEFAULT_VOCAB_SIZE, **{k: v for k, v in arch.items() if v is not None}}


def parameter_estimate(entry: dict, checkpoint_bytes: int | None) -> int:
    """Parameters of an entry before it is loaded: from the shapes of an architecture, or from a
    float16 checkpoint's size (2 bytes a parameter) when the file exists; 0 when neither is known."""
    if "architecture" in entry:
        arch = entry["architecture"]
        hidden, layers = arch["hidden_size"], arch["num_hidden_layers"]
        head_dim = arch.get("head_dim") or hidden // arch["num_attention_heads"]
        q = hidden * arch["num_attention_heads"] * head_dim
        kv = 2 * hidden * arch["num_key_value_heads"] * head_dim
        mlp = 3 * hidden * (math.ceil(hidden * math.pi / 64) * 64)  # MiniMind's intermediate_size
        return layers * (2 * q + kv + mlp) + arch.get("vocab_size", DEFAULT_VOCAB_SIZE) * hidden
    return checkpoint_bytes // 2 if checkpoint_bytes else 0


def measure_cost(model, prompt_ids: list[int], new_tokens: int, warmup: int, repeats: int, kv_tokens: int,
                 seed: int, device) -> dict:
    """cost.json for one model: steps 1-2 (same ids, fed tokens counted by wrapping `forward`), step 3's
    median times and the per-step latency with its fixed-cost fit (one set of timed runs, measured by
    kvlab.lab.curves.step_latency: `repeats` runs per mode after `warmup`, each whole generation timed
    as well as each step), and step 4's bytes per token. `prompt_ids` are already cut to P."""
    import torch

    from kvlab.engine.model import count_parameters
    from kvlab.lab import capacity, curves, steps
    from kvlab.lab.formulas import fed_formulas

    config = model.config
    same, count = steps.greedy_with_and_without_cache(model, prompt_ids, new_tokens, device)
    latency = curves.step_latency(model, prompt_ids, new_tokens, warmup, repeats, device)
    dtype = next(model.parameters()).dtype
    kv = capacity.bytes_per_token(model, dtype, kv_tokens, seed, device)
    formulas = fed_formulas(len(prompt_ids), new_tokens)
    with_s, without_s = latency["with_cache"]["generate_s"], latency["without_cache"]["generate_s"]
    return {
        "parameters": count_parameters(model),
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
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
    }


def average_step_s(row: dict, use_cache: bool) -> tuple[float, float]:
    """(fixed, per-token) seconds of an average step by a model's fit: one token fed with the cache,
    P + (N - 1) / 2 without."""
    fed = 1.0 if use_cache else row["prompt_len"] + (row["new_tokens"] - 1) / 2
    return row["fit_fixed_s"], row["fit_per_token_s"] * fed


def fixed_share(row: dict, use_cache: bool) -> float:
    """The fixed part of an average step's time, as a share of the whole."""
    fixed, per_token = average_step_s(row, use_cache)
    return fixed / (fixed + per_token) if fixed + per_token > 0 else float("nan")


def compare_rows(costs: dict[str, dict], kinds: dict[str, str]) -> list[dict]:
    """compare.csv: one row a model, in the given order, with what the figure and the report need."""
    rows = []
    for name, cost in costs.items():
        row = {"name": name, "weights": kinds[name], **cost}
        row["fixed_share_with_cache"] = fixed_share(row, use_cache=True)
        row["fixed_share_without_cache"] = fixed_share(row, use_cache=False)
        rows.append(row)
    return rows
