"""The cache in fewer bits, for beyond.md (results/kv_dtype.csv, kvlab.measure.kv_dtype): each dtype's
bytes and requests that fit against where its greedy tokens first change, and the serving trace at
each from one memory budget. Every comparison a sentence makes is chosen here from the numbers: the
requests that fit as a ratio of float32's, the tokens same or not, the throughput against float32's by
their intervals (kvlab.present.verdicts.order).

Free of PyTorch.
"""

from __future__ import annotations

import math

from kvlab.present.verdicts import order


def new_token_counts(row: dict) -> list[int]:
    """The N whose tokens were held against float32's (the columns same_{N})."""
    return sorted(int(key.split("_")[1]) for key in row if key.startswith("same_"))


def first_diff(row: dict, n: int) -> int | None:
    value = row.get(f"first_diff_{n}")
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else int(value)


def kv_dtype_section(results: dict) -> dict:
    rows = results.get("kv_dtype")
    if not rows:
        return {}
    base = next(row for row in rows if row["kv_dtype"] == "float32")
    ns = new_token_counts(base)
    longest = ns[-1]

    def throughput(row: dict) -> dict:
        return {"value": row["tokens_per_s"], "low": row["tokens_per_s_low"], "high": row["tokens_per_s_high"]}

    entries = []
    for row in rows:
        speed = throughput(row)
        entries.append({
            **{key: row[key] for key in ("kv_dtype", "bytes_per_token", "fits_lab", "fits_minimind", "max_kl",
                                         "peak_running", "steps", "preemptions", "pool_blocks")},
            "fits_gain": row["fits_lab"] / base["fits_lab"],
            "same": {n: bool(row[f"same_{n}"]) for n in ns},
            "first_diff": first_diff(row, longest),
            "throughput": speed,
            "against_float32": order((speed["low"], speed["high"]), (base["tokens_per_s_low"], base["tokens_per_s_high"])),
        })
    smallest = min(entries, key=lambda entry: entry["bytes_per_token"])
    changed = [entry for entry in entries if entry["first_diff"] is not None]
    return {"kv_dtype": {
        "rows": entries, "base": entries[rows.index(base)], "smallest": smallest, "ns": ns, "longest": longest,
        "changed": changed, "earliest": min(changed, key=lambda entry: entry["first_diff"]) if changed else None,
        "bytes_match": all(row["bytes_measured"] == row["bytes_formula"] for row in rows),
        "tokens": base["tokens"], "budget_gib": base["budget_gib"], "lab_context": base["lab_context"],
        "minimind": base["minimind"], "minimind_context": base["minimind_context"],
        "pool_kib": base["pool_bytes"] / 1024, "mismatches": sum(row["mismatches"] for row in rows),
        "checked": sum(row["checked"] for row in rows),
    }}
