"""Several models measured the same way (the config's `compare`), without PyTorch: their
architectures and parameters, and the table of their costs (kvlab.measure.cost measures each one;
kvlab.config checks the entries before any job runs).

The lesson: the cache cuts the tokens fed by the same ratio for every model, but the time only
by as much as the work per token outweighs each step's fixed cost. A bigger model does more work
per token, so its speedup climbs toward the token ratio.
"""

from __future__ import annotations

import numpy as np

from kvlab.engine.config import MiniMindConfig

# The lab's own pretrained model: always the first row.
LAB_NAME = "lab"


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
               **{key: value for key, value in cost.items() if key not in ("generate_samples_s", "generate_usage", "fit_runs")}}
        row["fixed_share_with_cache"] = fixed_share(row, use_cache=True)
        row["fixed_share_without_cache"] = fixed_share(row, use_cache=False)
        shares = [fixed_share(row, False, fit) for fit in cost.get("fit_runs", [])] or [row["fixed_share_without_cache"]]
        low, high = np.percentile(shares, [25, 75])
        row["fixed_share_without_cache_low"], row["fixed_share_without_cache_high"] = float(low), float(high)
        rows.append(row)
    return rows

