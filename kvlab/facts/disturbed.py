"""The timings the machine disturbed, gathered from the loaded results: one entry a timing, for the
reports to count and list.

Two rules of kvlab.facts.timing flag a timing. *Unstable*: its interquartile range is 10% of its
median or more. *Contended*: in a quarter of its runs or more, its timing thread was on a CPU for less
than 90% of the run's wall time; another process shared its core, every run may be slowed alike,
and a small spread does not make its numbers the machine's. One timing may be both: it is one
timing (`disturbed_timings` merges the two lists by what was timed), and a count of the disturbed
timings counts timings, never flags.

A contended timing is shown with what the rule saw: how many of its runs waited, and the median CPU
share of those runs (under the rule's 90% by definition), read from the runs' own clocks where the
result keeps them (`usage`), else from the columns a table keeps (`{mode}_contended_cpu_share`).

Free of PyTorch; reads results as kvlab.present.report's `load_results` gives them (JSON as dicts,
CSV and TSV as lists of row dicts). A result written before contention was measured has no flags
and lists nothing.
"""

from __future__ import annotations

import numpy as np

from kvlab.facts.formulas import MODES
from kvlab.facts.timing import UNSTABLE_IQR_SHARE, run_contended

LABELS = tuple(label for label, _ in MODES)
# What identifies one timing: which part of the build timed it, in which mode, of which model or run,
# at which size (N, B or context).
KEY = ("what", "mode", "name", "n")
# The parts in the order the reports list them.
PARTS = ("step3", "sweep", "latency", "compare", "batch", "anatomy", "curve", "serving", "kv_dtype")


def waited(usage: dict | None) -> dict:
    """What the contention rule saw in a timing's runs (`usage`): `runs` (how many it timed), `waited`
    (how many the rule calls contended) and `cpu_share` (the median CPU share of those, None if none)."""
    if not usage or not usage.get("wall_s"):
        return {"runs": None, "waited": None, "cpu_share": None}
    shares = [cpu / wall if wall > 0 else 1.0 for wall, cpu in zip(usage["wall_s"], usage["thread_cpu_s"])]
    contended = [share for share, wall, cpu in zip(shares, usage["wall_s"], usage["thread_cpu_s"])
                 if run_contended(wall, cpu)]
    return {"runs": len(shares), "waited": len(contended),
            "cpu_share": float(np.median(contended)) if contended else None}


def _seen(summary: dict, usage: dict | None = None) -> dict:
    """A contended summary's runs as the rule saw them: from its usage, else from its own numbers."""
    if usage:
        return waited(usage)
    runs = summary.get("n")
    share = summary.get("contended_runs")
    return {"runs": runs, "waited": round(share * runs) if isinstance(share, (int, float)) and runs else None,
            "cpu_share": summary.get("contended_cpu_share")}


def _row_seen(row: dict) -> dict:
    """A table row's (sweep.csv, compare.csv) contended mode as the rule saw it: the mode whose contended
    runs had the least CPU, from the columns spread_columns writes."""
    seen = []
    for mode in LABELS:
        share, fraction, runs = (row.get(f"{mode}_contended_cpu_share"), row.get(f"{mode}_contended_runs"),
                                 row.get(f"{mode}_n"))
        if isinstance(share, (int, float)) and share == share:
            waited_runs = round(fraction * runs) if isinstance(fraction, (int, float)) and runs else None
            seen.append({"runs": runs, "waited": waited_runs, "cpu_share": share})
    return min(seen, key=lambda item: item["cpu_share"]) if seen else {"runs": None, "waited": None, "cpu_share": None}


def unstable_timings(results: dict) -> list[dict]:
    """Every timing the rule calls unstable (IQR at least 10% of its median), as {what, mode | n | name,
    share}: step 3's modes, the sweep's N, the per-step timing's modes, the compared models, the
    batches, the opened steps, the two caches' steps at each context, the serving trace's runs by
    the quantity timed (serve_timing.csv: "serving", mode = the quantity, name = the run) and the trace
    served at each cache dtype (kv_dtype.csv: "kv_dtype", mode = the dtype)."""
    found = []
    summary = results.get("time_runs", {}).get("summary", {})
    found += [{"what": "step3", "mode": label, "share": summary[label]["iqr_share"]}
              for label in LABELS if summary.get(label, {}).get("unstable")]
    for row in results.get("sweep", []):
        if row["unstable"]:
            found.append({"what": "sweep", "n": row["new_tokens"],
                          "share": max(row["with_cache_iqr_share"], row["without_cache_iqr_share"])})
    latency = results.get("latency")
    if latency:
        found += [{"what": "latency", "mode": label, "share": latency[label]["generate"]["iqr_share"]}
                  for label in LABELS if latency[label]["generate"]["unstable"]]
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
    found += [{"what": "kv_dtype", "mode": row["kv_dtype"], "share": row["iqr_share"]}
              for row in results.get("kv_dtype", []) if row["unstable"]]
    served: dict = {}
    for row in results.get("serve_timing", []):
        for side in ("baseline", "subject"):
            share = row.get(f"{side}_iqr_share")
            if isinstance(share, (int, float)) and share >= UNSTABLE_IQR_SHARE:
                served.setdefault((row["quantity"], row[side]), {"what": "serving", "mode": row["quantity"],
                                                                 "name": row[side], "share": share})
    return found + list(served.values())


def contended_timings(results: dict) -> list[dict]:
    """Every contended timing, as {what, mode | n | name, runs, waited, cpu_share} (`waited`): step 3's
    modes ("step3"), the sweep's N ("sweep", n), the per-step timing's modes ("latency"), the compared
    models ("compare", name), the batches ("batch", mode and n = B), the opened steps ("anatomy", mode),
    the caches' steps at each context ("curve", mode = the cache's kind, n = the context) and the served
    runs of the serving trace ("serving", mode = the quantity timed, name = the run)."""
    found = []
    runs = results.get("time_runs", {})
    summary = runs.get("summary", {})
    found += [{"what": "step3", "mode": label, **_seen(summary[label], runs.get("usage", {}).get(label))}
              for label in LABELS if summary.get(label, {}).get("contended")]
    by_n = results.get("sweep_runs", {}).get("by_new_tokens", {})
    for row in results.get("sweep", []):
        if row.get("contended") is True:
            detail = by_n.get(str(row["new_tokens"]))
            if detail:
                seen = [_seen(detail["summary"][label], detail["usage"][label]) for label in LABELS
                        if detail["summary"][label].get("contended")]
                seen = min(seen, key=lambda item: item["cpu_share"] if item["cpu_share"] is not None else 1.0)
            else:
                seen = _row_seen(row)
            found.append({"what": "sweep", "n": row["new_tokens"], **seen})
    latency = results.get("latency")
    if latency:
        found += [{"what": "latency", "mode": label, **_seen(latency[label]["generate"], latency[label].get("usage"))}
                  for label in LABELS if latency[label]["generate"].get("contended")]
    for row in results.get("compare", []):
        if row.get("contended") is True:
            found.append({"what": "compare", "name": row["name"], **_row_seen(row)})
    batch_runs = results.get("batch_runs", {}).get("by_mode_and_size", {})
    for row in results.get("batch", []):
        if row.get("contended") is True:
            detail = batch_runs.get(f"{row['mode']} {row['B']}")
            seen = _seen(detail["decode"], detail.get("usage")) if detail else \
                {"runs": row.get("runs"), "waited": None, "cpu_share": None}
            found.append({"what": "batch", "mode": row["mode"], "n": row["B"], **seen})
    if "step_anatomy" in results:
        anatomy, curve = results["step_anatomy"]["anatomy"], results["step_anatomy"]["curve"]
        found += [{"what": "anatomy", "mode": name, **_seen(anatomy[name]["step"], anatomy[name].get("step_usage"))}
                  for name in anatomy["steps"] if anatomy[name]["step"].get("contended")]
        for kind in curve["kinds"]:
            usage = curve[kind].get("usage") or []
            for index, (context, row) in enumerate(zip(curve["contexts"], curve[kind]["steps"])):
                if row.get("contended"):
                    found.append({"what": "curve", "mode": kind, "n": context,
                                  **_seen(row, usage[index] if index < len(usage) else None)})
    served = {}
    for row in results.get("serve_timing", []):
        for side in ("baseline", "subject"):
            if row.get(f"{side}_contended") is True and (row["quantity"], row[side]) not in served:
                served[row["quantity"], row[side]] = {"what": "serving", "mode": row["quantity"], "name": row[side],
                                                      "runs": row.get(f"{side}_n"), "waited": None,
                                                      "cpu_share": None}
    return found + list(served.values())


def disturbed_timings(results: dict) -> list[dict]:
    """Every timing either rule flags, once, in the order the build made them: {what, mode, name, n,
    unstable, share (the IQR's share of the median, when unstable), contended, runs, waited, cpu_share
    (when contended)}. Its length is the number of timings the machine disturbed."""
    merged: dict = {}
    for item in unstable_timings(results):
        key = tuple(item.get(part) for part in KEY)
        merged[key] = {**dict(zip(KEY, key)), "unstable": True, "share": item["share"], "contended": False,
                       "runs": None, "waited": None, "cpu_share": None}
    for item in contended_timings(results):
        key = tuple(item.get(part) for part in KEY)
        entry = merged.setdefault(key, {**dict(zip(KEY, key)), "unstable": False, "share": None})
        entry.update(contended=True, runs=item["runs"], waited=item["waited"], cpu_share=item["cpu_share"])
    # in the reports' order: by part, each mode (or model) where it first came, sizes rising
    groups: dict = {}
    for key in merged:
        groups.setdefault(key[:3], len(groups))
    return sorted(merged.values(), key=lambda item: (
        PARTS.index(item["what"]), groups[(item["what"], item["mode"], item["name"])],
        item["n"] if isinstance(item["n"], (int, float)) else 0))
