"""A build's results as a neighbour on the timed core would have left them: some runs took `factor` times
their wall time while their timing thread's CPU time stayed what the work cost (it waited, it did not
work more). What a run's clocks say is all this changes; every number read from them (medians,
intervals, flags, speedups, throughputs, the per-step fit) is computed again by the project's own
functions, so the doctored files are what such a build writes.

Slowed: step 3's cached runs, the sweep's cached runs at every N, the per-step timing's cached
generations, the smallest batch of each mode, the lab model's cached runs in compare, the torch.cat
cache's step at the longest context. On the CPU clock nothing changed: a report that judges contended
comparisons on it says what the quiet build's says.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from kvlab.facts import timing
from kvlab.facts.compare import compare_rows
from kvlab.io import read_csv_rows, write_csv_atomic


def _slow_usage(usage: dict, factor: float) -> dict:
    return {**usage, "wall_s": [wall * factor for wall in usage["wall_s"]]}


def _load(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _dump(path: Path, data) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _slow_pair(runs: dict, factor: float, mode: str = "with_cache") -> None:
    """One timed pair (time_runs.json, or one N of sweep_runs.json): `mode`'s runs slowed."""
    runs["runs_s"][mode] = [seconds * factor for seconds in runs["runs_s"][mode]]
    runs["usage"][mode] = _slow_usage(runs["usage"][mode], factor)
    runs["summary"][mode] = timing.summary(runs["runs_s"][mode], runs["usage"][mode])
    runs["speedup"] = timing.ratio_interval(runs["summary"]["without_cache"], runs["summary"]["with_cache"])


def slowed(results: Path, out: Path, factor: float = 2.5) -> Path:
    """A copy of `results` in `out`, its chosen runs slowed `factor` times on the wall clock only."""
    shutil.copytree(results, out, dirs_exist_ok=True)
    # step 3
    runs = _load(out / "time_runs.json")
    _slow_pair(runs, factor)
    _dump(out / "time_runs.json", runs)
    _dump(out / "time.json", {"with_cache_s": runs["summary"]["with_cache"]["median_s"],
                              "without_cache_s": runs["summary"]["without_cache"]["median_s"],
                              "speedup": runs["speedup"]["ratio"]})
    # the sweep
    sweep_runs = _load(out / "sweep_runs.json")
    rows = read_csv_rows(out / "sweep.csv")
    for row in rows:
        detail = sweep_runs["by_new_tokens"][str(row["new_tokens"])]
        _slow_pair(detail, factor)
        row.update({"with_cache_s": detail["summary"]["with_cache"]["median_s"], "speedup": detail["speedup"]["ratio"],
                    **timing.spread_columns(detail["summary"], detail["speedup"])})
    _dump(out / "sweep_runs.json", sweep_runs)
    write_csv_atomic(out / "sweep.csv", rows)
    # the per-step timing's cached generations (their steps, each run's)
    latency = _load(out / "latency.json")
    cached = latency["with_cache"]
    cached["generate_samples_s"] = [seconds * factor for seconds in cached["generate_samples_s"]]
    cached["usage"] = _slow_usage(cached["usage"], factor)
    cached["step_samples_s"] = [[seconds * factor for seconds in step] for step in cached["step_samples_s"]]
    cached["step_s"] = [float(np.median(step)) for step in cached["step_samples_s"]]
    cached["ttft_s"], cached["sum_steps_s"] = cached["step_s"][0], sum(cached["step_s"])
    cached["tpot_s"] = float(np.median(cached["step_s"][1:])) if len(cached["step_s"]) > 1 else None
    cached["generate"] = timing.summary(cached["generate_samples_s"], cached["usage"])
    cached["generate_s"] = cached["generate"]["median_s"]
    cached["ttft"] = timing.summary(cached["step_samples_s"][0], cached["usage"])
    labels = ("with_cache", "without_cache")
    fit = timing.fit_step_cost([fed for label in labels for fed in latency[label]["fed_tokens"]],
                               [seconds for label in labels for seconds in latency[label]["step_s"]])
    latency["fit"] = {**fit, "on": latency["fit"].get("on")}
    predicted = {label: timing.predict_time(latency[label]["fed_tokens"], fit) for label in labels}
    latency["predicted"] = {"with_cache_s": predicted["with_cache"], "without_cache_s": predicted["without_cache"],
                            "speedup": predicted["without_cache"] / predicted["with_cache"]}
    latency["measured"] = timing.ratio_interval(latency["without_cache"]["generate"], cached["generate"])
    _dump(out / "latency.json", latency)
    # the smallest batch of each mode
    batch_runs = _load(out / "batch_runs.json")
    rows = read_csv_rows(out / "batch.tsv")
    first = {}
    for row in rows:
        detail = batch_runs["by_mode_and_size"][f"{row['mode']} {row['B']}"]
        if row["mode"] not in first:
            for key in ("prefill_s", "decode_s"):
                detail[key] = [seconds * factor for seconds in detail[key]]
            detail["usage"] = _slow_usage(detail["usage"], factor)
            detail["prefill"] = timing.summary(detail["prefill_s"], detail["usage"])
            detail["decode"] = timing.summary(detail["decode_s"], detail["usage"])
            tokens = row["B"] * row["TG"]
            detail["per_token"] = timing.summary([seconds / tokens for seconds in detail["decode_s"]], detail["usage"])
            decode = detail["decode"]
            row.update({"T_TG s": decode["median_s"], "S_TG t/s": tokens / decode["median_s"],
                        "S_TG_low": tokens / decode["q3_s"], "S_TG_high": tokens / decode["q1_s"],
                        "ms_per_step": decode["median_s"] / row["TG"] * 1e3, "cpu_share": decode["cpu_share"],
                        "contended": decode["contended"]})
            first[row["mode"]] = detail["per_token"]
        gain = timing.ratio_interval(first[row["mode"]], detail["per_token"])
        row.update({"S_TG_gain": gain["ratio"], "S_TG_gain_low": gain["low"], "S_TG_gain_high": gain["high"]})
    _dump(out / "batch_runs.json", batch_runs)
    write_csv_atomic(out / "batch.tsv", rows)
    # the lab model's cached runs in compare (compare.csv made again from the models' cost.json)
    costs = {}
    for row in read_csv_rows(out / "compare.csv"):
        cost = _load(out / "compare" / row["name"] / "cost.json")
        if row["name"] == "lab":
            samples = {label: list(cost["generate_samples_s"][label]) for label in labels}
            samples["with_cache"] = [seconds * factor for seconds in samples["with_cache"]]
            cost["generate_samples_s"] = samples
            cost["generate_usage"]["with_cache"] = _slow_usage(cost["generate_usage"]["with_cache"], factor)
            summaries = {label: timing.summary(samples[label], cost["generate_usage"][label]) for label in labels}
            speedup = timing.ratio_interval(summaries["without_cache"], summaries["with_cache"])
            cost.update({"with_cache_s": summaries["with_cache"]["median_s"], "speedup": speedup["ratio"],
                         **timing.spread_columns(summaries, speedup)})
            _dump(out / "compare" / row["name"] / "cost.json", cost)
        costs[row["name"]] = (cost, row["weights"])
    write_csv_atomic(out / "compare.csv", compare_rows({name: cost for name, (cost, _) in costs.items()},
                                                        {name: kind for name, (_, kind) in costs.items()}))
    # the torch.cat cache's step at the longest context
    anatomy = _load(out / "step_anatomy.json")
    curve = anatomy["curve"]
    step, usage = curve["cat"]["steps"][-1], _slow_usage(curve["cat"]["usage"][-1], factor)
    slow = {**step, **{key: step[key] * factor for key in ("median_s", "q1_s", "q3_s", "iqr_s", "mean_s", "std_s")},
            **timing.contention(usage)}
    curve["cat"]["steps"][-1], curve["cat"]["usage"][-1] = slow, usage
    curve["cat_over_static"] = timing.ratio_interval(slow, curve["static"]["steps"][-1])
    _dump(out / "step_anatomy.json", anatomy)
    return out
