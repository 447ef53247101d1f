"""The timings the machine took from, gathered from the loaded results for the report to list first.

A timing is *contended* by kvlab.facts.timing's rule (its timing thread on a CPU for less than 90%
of the wall time in a quarter of its runs or more): another process shared its core, every run may
be slowed alike, and a small spread does not make its numbers the machine's. `contended_timings`
lists them the way kvlab.present.report's `unstable_timings` lists the unstable ones;
`contended_speedups` the ratios read from them, which the report must not give as the machine's.
Free of PyTorch; reads results as kvlab.present.report's `load_results` gives them (JSON as dicts,
CSV and TSV as lists of row dicts). A result written before contention was measured has no flags
and lists nothing.
"""

from __future__ import annotations

from kvlab.facts.formulas import MODES

LABELS = tuple(label for label, _ in MODES)


def _seen(summary: dict) -> dict:
    """What a contended summary says about its runs: the median CPU share, the share of contended
    runs, involuntary switches per second, the highest load average."""
    return {key: summary.get(key) for key in ("cpu_share", "contended_runs", "switches_per_s", "load_1m")}


def _row_share(row: dict) -> float | None:
    """The lower of a table row's modes' median CPU shares (sweep.csv, compare.csv)."""
    shares = [row.get(f"{mode}_cpu_share") for mode in LABELS]
    shares = [share for share in shares if isinstance(share, (int, float)) and share == share]
    return min(shares) if shares else None


def contended_timings(results: dict) -> list[dict]:
    """Every contended timing, as {what, mode | n | name, cpu_share, ...} (the shape of the report's
    `unstable_timings`, `cpu_share` where that has `share`): step 3's modes ("step3", with
    contended_runs, switches_per_s and load_1m too), the sweep's N ("sweep", n), the per-step
    timing's modes ("latency"), the compared models ("compare", name), the batches ("batch", mode and
    n = B), the opened steps ("anatomy", mode) and the caches' steps at each context ("curve", mode = the
    cache's kind, n = the context)."""
    found = []
    summary = results.get("time_runs", {}).get("summary", {})
    found += [{"what": "step3", "mode": label, **_seen(summary[label])}
              for label in LABELS if summary.get(label, {}).get("contended")]
    for row in results.get("sweep", []):
        if row.get("contended") is True:
            found.append({"what": "sweep", "n": row["new_tokens"], "cpu_share": _row_share(row)})
    latency = results.get("latency")
    if latency:
        found += [{"what": "latency", "mode": label, **_seen(latency[label]["generate"])}
                  for label in LABELS if latency[label]["generate"].get("contended")]
    for row in results.get("compare", []):
        if row.get("contended") is True:
            found.append({"what": "compare", "name": row["name"], "cpu_share": _row_share(row)})
    for row in results.get("batch", []):
        if row.get("contended") is True:
            found.append({"what": "batch", "mode": row["mode"], "n": row["B"], "cpu_share": row.get("cpu_share")})
    if "step_anatomy" in results:
        anatomy, curve = results["step_anatomy"]["anatomy"], results["step_anatomy"]["curve"]
        found += [{"what": "anatomy", "mode": name, **_seen(anatomy[name]["step"])}
                  for name in anatomy["steps"] if anatomy[name]["step"].get("contended")]
        found += [{"what": "curve", "mode": kind, "n": context, **_seen(row)}
                  for kind in curve["kinds"]
                  for context, row in zip(curve["contexts"], curve[kind]["steps"])
                  if row.get("contended")]
    return found


def contended_speedups(results: dict) -> list[dict]:
    """Every ratio read from a contended timing, as {what, n | name, ratio, low, high}: step 3's
    speedup ("step3"), the sweep's at each N, the per-step timing's measured one ("latency"), each
    compared model's, the caches' cat / static ("anatomy"). The report gives them as what this run
    measured, not as the machine's."""
    found = []
    step3 = results.get("time_runs", {}).get("speedup", {})
    if step3.get("contended"):
        found.append({"what": "step3", **_ratio(step3)})
    for row in results.get("sweep", []):
        if row.get("contended") is True:
            found.append({"what": "sweep", "n": row["new_tokens"], "ratio": row["speedup"],
                          "low": row["speedup_low"], "high": row["speedup_high"]})
    latency = results.get("latency")
    if latency and latency.get("measured", {}).get("contended"):
        found.append({"what": "latency", **_ratio(latency["measured"])})
    for row in results.get("compare", []):
        if row.get("contended") is True:
            found.append({"what": "compare", "name": row["name"], "ratio": row["speedup"],
                          "low": row["speedup_low"], "high": row["speedup_high"]})
    curve = results.get("step_anatomy", {}).get("curve", {})
    for key in ("cat_over_static", "static_over_compiled"):
        if curve.get(key, {}).get("contended"):
            found.append({"what": "anatomy", "name": key, **_ratio(curve[key])})
    return found


def _ratio(interval: dict) -> dict:
    return {key: interval[key] for key in ("ratio", "low", "high")}
