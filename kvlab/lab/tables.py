"""The lab sheet's six result files as HTML tables, one per step, for `snakemake --report`: the
report embeds the page, so the numbers are read in the browser instead of in downloaded JSON."""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.io import read_json
from kvlab.lab.formulas import fed_formulas
from kvlab.lab.report import sandboxed_template
from kvlab.lab.sheet import LAB_RESULTS

# Each step's table title, by the name of its result file (kvlab.lab.sheet.LAB_RESULTS).
TITLES = {
    "same": "Step 1: the same tokens with and without the cache",
    "counts": "Step 2: tokens fed to forward",
    "time": "Step 3: generation time",
    "kvbytes": "Step 4: bytes of the KV cache",
    "temp": "Step 5: distinct answers at each temperature",
    "topp": "Step 6: candidates kept by top-p",
}


def cell(value) -> str:
    """A JSON value as the text of one table cell: integers with thousands separators, the rest
    as JSON (so true/false and lists read as in the file)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict) and set(value) == {"distinct"}:
        return cell(value["distinct"])
    return json.dumps(value, ensure_ascii=False)


def step_rows(name: str, data: dict) -> list[dict]:
    """The rows of one step's table: every key of its file, and for step 2 the two formulas the
    counts are graded against, computed from the file's own P and N."""
    rows = [{"key": key, "value": cell(value), "note": ""} for key, value in data.items()]
    if name == "counts":
        formulas = fed_formulas(data["prompt_len"], data["new_tokens"])
        rows.append({"key": "P+N−1", "value": cell(formulas["with_cache"]), "note": "formula, with the cache"})
        rows.append({"key": "P·N+N(N−1)/2", "value": cell(formulas["without_cache"]),
                     "note": "formula, without the cache"})
    if name == "temp":
        for row in rows:
            row["note"] = "distinct answers"
    if name == "topp":
        for row in rows:
            row["note"] = "candidates kept"
    return rows


def render_tables(template_path, result_paths: dict[str, str]) -> str:
    """The HTML page with one table per step, from the six files named as in LAB_RESULTS."""
    steps = []
    for name in LAB_RESULTS:
        path = result_paths[name]
        steps.append({"file": Path(path).name, "title": TITLES[name], "rows": step_rows(name, read_json(path))})
    return sandboxed_template(template_path, autoescape=True).render(steps=steps)
