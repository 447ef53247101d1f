"""The lab sheet's six result files as HTML tables, one per step, for `snakemake --report`: the
report embeds the page, so the numbers are read in the browser instead of in downloaded JSON."""

from __future__ import annotations

import json
from pathlib import Path

from kvlab.io import read_json
from kvlab.facts.formulas import fed_formulas
from kvlab.present.pages import sandboxed_template
from kvlab.facts.sheet import LAB_RESULTS

# Every string the page shows, by language (config `report.language`); step titles by the name of
# their result file (kvlab.facts.sheet.LAB_RESULTS).
TEXT = {
    "en": {
        "page_title": "The lab sheet's results",
        "key": "key",
        "value": "value",
        "same": "Step 1: the same tokens with and without the cache",
        "counts": "Step 2: tokens fed to forward",
        "time": "Step 3: generation time",
        "kvbytes": "Step 4: bytes of the KV cache",
        "temp": "Step 5: distinct answers at each temperature",
        "topp": "Step 6: candidates kept by top-p",
        "formula_with": "formula, with the cache",
        "formula_without": "formula, without the cache",
        "distinct": "distinct answers",
        "kept": "candidates kept",
    },
    "ko": {
        "page_title": "실험지의 결과",
        "key": "키",
        "value": "값",
        "same": "1단계: 캐시를 켜도 꺼도 같은 토큰",
        "counts": "2단계: forward에 넣은 토큰 수",
        "time": "3단계: 생성 시간",
        "kvbytes": "4단계: KV 캐시의 바이트",
        "temp": "5단계: 온도마다 서로 다른 답의 수",
        "topp": "6단계: top-p가 남기는 후보 수",
        "formula_with": "공식, 캐시 사용",
        "formula_without": "공식, 캐시 없음",
        "distinct": "서로 다른 답",
        "kept": "남는 후보",
    },
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


def step_rows(name: str, data: dict, text: dict) -> list[dict]:
    """The rows of one step's table: every key of its file, and for step 2 the two formulas the
    counts are graded against, computed from the file's own P and N. `text`: TEXT of a language."""
    note = {"temp": text["distinct"], "topp": text["kept"]}.get(name, "")
    rows = [{"key": key, "value": cell(value), "note": note} for key, value in data.items()]
    if name == "counts":
        formulas = fed_formulas(data["prompt_len"], data["new_tokens"])
        rows.append({"key": "P+N−1", "value": cell(formulas["with_cache"]), "note": text["formula_with"]})
        rows.append({"key": "P·N+N(N−1)/2", "value": cell(formulas["without_cache"]), "note": text["formula_without"]})
    return rows


def render_tables(template_path, result_paths: dict[str, str], language: str) -> str:
    """The HTML page with one table per step, from the six files named as in LAB_RESULTS, in the
    report's `language` ("ko" or "en")."""
    text = TEXT[language]
    steps = [{"file": Path(result_paths[name]).name, "title": text[name],
              "rows": step_rows(name, read_json(result_paths[name]), text)} for name in LAB_RESULTS]
    return sandboxed_template(template_path, autoescape=True).render(steps=steps, text=text, lang=language)
