"""The lab sheet's six result files as HTML tables, one per step, for `snakemake --report`: the
report embeds the page, so the numbers are read in the browser instead of in downloaded JSON."""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.io import read_json
from kvlab.facts.formulas import fed_formulas
from markupsafe import Markup

from kvlab.present.fonts import font_family, with_font
from kvlab.present.i18n import N_, gettext_for
from kvlab.present.pages import sandboxed_template
from kvlab.facts.sheet import LAB_RESULTS

# Every label the page shows, in English (its Korean in the catalog: kvlab.present.i18n); step titles by
# the name of their result file (kvlab.facts.sheet.LAB_RESULTS).
LABELS = {
    "page_title": N_("The lab sheet's results"),
    "key": N_("key"),
    "value": N_("value"),
    "same": N_("Step 1: the same tokens with and without the cache"),
    "counts": N_("Step 2: tokens fed to forward"),
    "time": N_("Step 3: generation time"),
    "kvbytes": N_("Step 4: bytes of the KV cache"),
    "temp": N_("Step 5: distinct answers at each temperature"),
    "topp": N_("Step 6: candidates kept by top-p"),
    "formula_with": N_("formula, with the cache"),
    "formula_without": N_("formula, without the cache"),
    "distinct": N_("distinct answers"),
    "kept": N_("candidates kept"),
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


def step_rows(name: str, data: dict, text) -> list[dict]:
    """The rows of one step's table: every key of its file, and for step 2 the two formulas the
    counts are graded against, computed from the file's own P and N. `text(key)`: a label, translated."""
    note = {"temp": text("distinct"), "topp": text("kept")}.get(name, "")
    rows = [{"key": key, "value": cell(value), "note": note} for key, value in data.items()]
    if name == "counts":
        formulas = fed_formulas(data["prompt_len"], data["new_tokens"])
        rows.append({"key": "P+N−1", "value": cell(formulas["with_cache"]), "note": text("formula_with")})
        rows.append({"key": "P·N+N(N−1)/2", "value": cell(formulas["without_cache"]), "note": text("formula_without")})
    return rows


def render_tables(template_path, result_paths: dict[str, str], language: str) -> str:
    """The HTML page with one table per step, from the six files named as in LAB_RESULTS, in the
    report's `language` ("ko" or "en"), carrying its Hangul font (kvlab.present.fonts)."""
    translate = gettext_for(language)

    def text(key: str) -> str:
        return translate(LABELS[key])

    steps = [{"file": Path(result_paths[name]).name, "title": text(name),
              "rows": step_rows(name, read_json(result_paths[name]), text)} for name in LAB_RESULTS]
    labels = {key: text(key) for key in ("page_title", "key", "value")}
    template = sandboxed_template(template_path, autoescape=True, language=language)
    # the Hangul font, cut to the page's own characters
    return with_font(lambda font_face: template.render(steps=steps, text=labels, lang=language,
                                                       font_face=Markup(font_face), font_family=Markup(font_family())))
