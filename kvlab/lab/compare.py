"""Several models measured the same way (the config's `compare`), without PyTorch: the entries
checked before any job runs, and the table of their costs (kvlab.lab.cost measures each one).

The lesson: the cache cuts the tokens fed by the same ratio for every model, but the time only
by as much as the work per token outweighs each step's fixed cost. A bigger model does more work
per token, so its speedup climbs toward the token ratio.
"""

from __future__ import annotations

import re

import numpy as np

from kvlab.engine.config import MiniMindConfig

# The lab's own pretrained model: always the first row.
LAB_NAME = "lab"
# Names the lab's own checkpoints go by (results/checkpoints/NAME.json): no entry may take them.
RESERVED_NAMES = (LAB_NAME, "pretrain", "sft")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
ARCHITECTURE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")


class CompareError(ValueError):
    """A `compare` entry that cannot be measured, with one line naming the entry and the key."""


def check_entries(entries: list[dict], prompt_tokens: int, lab_prompt_len: int) -> None:
    """Raise CompareError for the first entry the config alone shows to be wrong."""
    seen = set(RESERVED_NAMES)
    for index, entry in enumerate(entries):
        where = f"config key 'compare[{index}]'"
        name = entry.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise CompareError(f"{where}.name: {name!r} must be letters, digits, '-' or '_' (it names a folder)")
        where = f"config key 'compare[{index}]' ({name})"
        if name in seen:
            reasons = {LAB_NAME: "is the lab's own model, always the first row",
                       "pretrain": "names the lab's pretrained checkpoint", "sft": "names the lab's SFT checkpoint"}
            raise CompareError(f"{where}.name: {name!r} {reasons.get(name, 'is used twice')}")
        seen.add(name)
        has_checkpoint, has_architecture = "checkpoint" in entry, "architecture" in entry
        if has_checkpoint == has_architecture:
            raise CompareError(f"{where}: give exactly one of 'checkpoint' and 'architecture' "
                               f"(found {'both' if has_checkpoint else 'neither'})")
        if has_architecture:
            check_architecture(entry["architecture"], f"{where}.architecture")
        elif "model_overrides" in entry and not isinstance(entry["model_overrides"], dict):
            raise CompareError(f"{where}.model_overrides: expected a mapping of MiniMind config fields")
    if prompt_tokens > lab_prompt_len:
        raise CompareError(f"config key 'extras.compare.prompt_tokens': {prompt_tokens} is longer than the lab's "
                           f"prompt ({lab_prompt_len} tokens, bos included: lab.prompt.cut_tokens + 1)")


def check_architecture(arch: dict, where: str) -> None:
    """Raise CompareError, naming the key under `where`, for an architecture MiniMind cannot build."""
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


def architecture_config(arch: dict, **fields) -> MiniMindConfig:
    """The MiniMind config of an architecture entry (the schema's `architecture`; a `name` is not a
    field), MiniMind's defaults for what it leaves out, and `fields` on top."""
    given = {key: value for key, value in arch.items() if key != "name" and value is not None}
    return MiniMindConfig(**{**given, **fields})


def parameter_estimate(entry: dict, checkpoint_bytes: int | None) -> int:
    """Parameters of a `compare` entry before it is loaded: its architecture's count, or from a
    float16 checkpoint's size (2 bytes a parameter) when the file exists; 0 when neither is known."""
    if "architecture" in entry:
        return architecture_config(entry["architecture"]).parameter_count()
    return checkpoint_bytes // 2 if checkpoint_bytes else 0


def average_step_s(row: dict, use_cache: bool, fit: dict | None = None) -> tuple[float, float]:
    """(fixed, per-token) seconds of an average step by a model's fit (the row's, or `fit`, one of its
    per-run fits): one token fed with the cache, P + (N - 1) / 2 without."""
    fixed, per_token = (row["fit_fixed_s"], row["fit_per_token_s"]) if fit is None else \
        (fit["fixed_s"], fit["per_token_s"])
    fed = 1.0 if use_cache else row["prompt_len"] + (row["new_tokens"] - 1) / 2
    return fixed, per_token * fed


def fixed_share(row: dict, use_cache: bool, fit: dict | None = None) -> float:
    """The fixed part of an average step's time, as a share of the whole."""
    fixed, per_token = average_step_s(row, use_cache, fit)
    return fixed / (fixed + per_token) if fixed + per_token > 0 else float("nan")


def compare_rows(costs: dict[str, dict], kinds: dict[str, str]) -> list[dict]:
    """compare.csv: one row a model, in the given order, with what the figure and the report need:
    its cost.json but the samples, and the fixed share of an average step by its fit, with the
    quartiles of the shares its per-run fits give (the share's spread) for a step without the cache."""
    rows = []
    for name, cost in costs.items():
        row = {"name": name, "weights": kinds[name],
               **{key: value for key, value in cost.items() if key not in ("generate_samples_s", "fit_runs")}}
        row["fixed_share_with_cache"] = fixed_share(row, use_cache=True)
        row["fixed_share_without_cache"] = fixed_share(row, use_cache=False)
        shares = [fixed_share(row, False, fit) for fit in cost.get("fit_runs", [])] or [row["fixed_share_without_cache"]]
        low, high = np.percentile(shares, [25, 75])
        row["fixed_share_without_cache_low"], row["fixed_share_without_cache_high"] = float(low), float(high)
        rows.append(row)
    return rows

