"""Every timed comparison the reports make, on both clocks, from the result files' own runs: the wall
clock (what a person waited) and the timing thread's CPU clock (what the work cost, kvlab.facts.timing:
each run's thread CPU seconds, kept in the results' `usage`). kvlab.present.verdicts picks the clock a
comparison is judged on: the CPU clock's whenever either side was contended.

Each function returns {"wall": {ratio | value, low, high, contended}, "cpu": the same or None}; None
where a result was written before its runs' clocks were kept, and the wall clock then decides.
"""

from __future__ import annotations

from kvlab.facts import timing


def step3_speedup(time_runs: dict) -> dict:
    """Step 3's speedup (without the cache over with it), time_runs.json."""
    summary, usage = time_runs["summary"], time_runs.get("usage", {})
    pair = timing.clocked_ratio(summary["without_cache"], summary["with_cache"], usage.get("without_cache"),
                                usage.get("with_cache"))
    return {"wall": {**pair["wall"], **{key: time_runs["speedup"][key] for key in ("ratio", "low", "high")}},
            "cpu": pair["cpu"]}


def sweep_speedup(row: dict, sweep_runs: dict | None) -> dict:
    """The sweep's speedup at one N: sweep.csv's row, and its runs in sweep_runs.json."""
    wall = {"ratio": row["speedup"], "low": row["speedup_low"], "high": row["speedup_high"],
            "contended": bool(row.get("contended"))}
    detail = (sweep_runs or {}).get("by_new_tokens", {}).get(str(row["new_tokens"]))
    if not detail or "usage" not in detail:
        return {"wall": wall, "cpu": None}
    pair = timing.clocked_ratio(detail["summary"]["without_cache"], detail["summary"]["with_cache"],
                                detail["usage"]["without_cache"], detail["usage"]["with_cache"])
    return {"wall": wall, "cpu": pair["cpu"]}


def latency_speedup(latency: dict) -> dict:
    """The per-step timing's own generations, without the cache over with it (latency.json)."""
    pair = timing.clocked_ratio(latency["without_cache"]["generate"], latency["with_cache"]["generate"],
                                latency["without_cache"].get("usage"), latency["with_cache"].get("usage"))
    return {"wall": {**pair["wall"], **{key: latency["measured"][key] for key in ("ratio", "low", "high")}},
            "cpu": pair["cpu"]}


def compare_speedup(row: dict) -> dict:
    """A compared model's speedup: compare.csv's row, its CPU clock's columns (kvlab.facts.compare)."""
    wall = {"ratio": row["speedup"], "low": row["speedup_low"], "high": row["speedup_high"],
            "contended": bool(row.get("contended"))}
    cpu = None
    if isinstance(row.get("speedup_cpu"), (int, float)) and row["speedup_cpu"] == row["speedup_cpu"]:
        cpu = {"ratio": row["speedup_cpu"], "low": row["speedup_cpu_low"], "high": row["speedup_cpu_high"],
               "contended": wall["contended"]}
    return {"wall": wall, "cpu": cpu}


def curve_ratio(curve: dict, first: str, second: str) -> dict | None:
    """`first` / `second` (cache kinds of step_anatomy.json's curve: cat, static, compiled) at the longest
    context, each step's runs read from the curve's usage."""
    key = f"{first}_over_{second}"
    if key not in curve:
        return None
    usage = [curve[kind].get("usage") or [] for kind in (first, second)]
    last = len(curve["contexts"]) - 1
    slow_usage, fast_usage = (runs[last] if len(runs) > last else None for runs in usage)
    pair = timing.clocked_ratio(curve[first]["steps"][-1], curve[second]["steps"][-1], slow_usage, fast_usage)
    return {"wall": {**pair["wall"], **{k: curve[key][k] for k in ("ratio", "low", "high")},
                     "contended": bool(curve[key].get("contended"))}, "cpu": pair["cpu"]}


def batch_throughput(row: dict, batch_runs: dict | None) -> dict:
    """A batch's decode throughput (S_TG, tokens a second over all rows: batch.tsv's row) on both
    clocks: on the CPU clock, the tokens over the decode's CPU seconds, each run's decode time times
    its run's CPU share (kvlab.facts.timing.cpu_seconds)."""
    wall = {"value": row["S_TG t/s"], "low": row["S_TG_low"], "high": row["S_TG_high"],
            "contended": bool(row.get("contended"))}
    detail = (batch_runs or {}).get("by_mode_and_size", {}).get(f"{row['mode']} {row['B']}")
    cpu = None
    if detail:
        decode = timing.cpu_summary(detail.get("usage"), detail["decode_s"])
        if decode and decode["q1_s"] > 0:
            tokens = row["B"] * row["TG"]
            cpu = {"value": tokens / decode["median_s"], "low": tokens / decode["q3_s"],
                   "high": tokens / decode["q1_s"], "per_token": timing.summary(
                       [seconds / tokens for seconds in timing.cpu_seconds(detail["usage"], detail["decode_s"])])}
    return {"wall": wall, "cpu": cpu}


def batch_gain(first: dict, last: dict, first_row: dict, last_row: dict, batch_runs: dict | None) -> dict:
    """The largest batch's throughput over the smallest's (S_TG gain, batch.tsv's columns) on both clocks."""
    wall = {"ratio": last_row["S_TG_gain"], "low": last_row["S_TG_gain_low"], "high": last_row["S_TG_gain_high"],
            "contended": bool(first_row.get("contended") or last_row.get("contended"))}
    cpu = None
    if first["cpu"] and last["cpu"]:
        cpu = {**timing.ratio_interval(first["cpu"]["per_token"], last["cpu"]["per_token"]),
               "contended": wall["contended"]}
    return {"wall": wall, "cpu": cpu}
