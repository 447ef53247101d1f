"""Several models measured the same way (the config's `compare`), without PyTorch: their
architectures and parameters, and the table of their costs (kvlab.measure.cost measures each one;
kvlab.config checks the entries before any job runs).

The lesson: the cache cuts the tokens fed by the same ratio for every model, but the time only
by as much as the work per token outweighs each step's fixed cost. A bigger model does more work
per token, so its speedup climbs toward the token ratio.
"""

from __future__ import annotations

import math

import numpy as np

from kvlab.engine.config import MiniMindConfig
from kvlab.facts import timing

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


def share_with_spread(shares) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of the shares the per-run fits give: the value a table
    shows and the interval beside it, which holds it."""
    median, low, high = np.percentile(shares, [50, 25, 75])
    return float(median), float(low), float(high)


def cpu_speedup(cost: dict) -> dict:
    """The model's speedup on the timing thread's CPU clock (kvlab.facts.timing), from its generations'
    clocks: {speedup_cpu, speedup_cpu_low, speedup_cpu_high}, NaN where they were not kept."""
    usage = cost.get("generate_usage") or {}
    slow, fast = (timing.cpu_summary(usage.get(mode)) for mode in ("without_cache", "with_cache"))
    if not slow or not fast or fast["q1_s"] <= 0:
        return {"speedup_cpu": math.nan, "speedup_cpu_low": math.nan, "speedup_cpu_high": math.nan}
    cpu = timing.ratio_interval(slow, fast)
    return {"speedup_cpu": cpu["ratio"], "speedup_cpu_low": cpu["low"], "speedup_cpu_high": cpu["high"]}


def compare_rows(costs: dict[str, dict], kinds: dict[str, str]) -> list[dict]:
    """compare.csv: one row a model, in the given order, with what the figure and the report need:
    its cost.json but the samples (its budget as `budget_s` and the runs it cut, `runs_cut`); its speedup on the CPU clock too (`cpu_speedup`); and the fixed
    share of an average step, with the cached step's by the model's fit, and the uncached step's as
    the median of the shares its per-run fits give, between their quartiles (the share's spread).
    A model measured before the per-run fits were kept has its fit's share, its interval that one
    value."""
    rows = []
    for name, cost in costs.items():
        row = {"name": name, "weights": kinds[name],
               **{key: value for key, value in cost.items()
                  if key not in ("generate_samples_s", "generate_usage", "fit_runs", "budget")}}
        # what its time budget left out (kvlab.facts.budget), as two columns
        budget = cost.get("budget", {})
        row["budget_s"] = budget.get("budget_s")
        row["runs_cut"] = "; ".join(cut["rung"] for cut in budget.get("cut", []))
        row.update(cpu_speedup(cost))
        row["fixed_share_with_cache"] = fixed_share(row, use_cache=True)
        shares = [fixed_share(row, False, fit) for fit in cost.get("fit_runs", [])] or [fixed_share(row, use_cache=False)]
        (row["fixed_share_without_cache"], row["fixed_share_without_cache_low"],
         row["fixed_share_without_cache_high"]) = share_with_spread(shares)
        rows.append(row)
    return rows

