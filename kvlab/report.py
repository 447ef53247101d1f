"""Step 7: results/report.md, rendered from the result files by a sandboxed Jinja template.

Every number in the report is read from a result file or derived here from
those numbers; the template holds prose only.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from kvlab.io import read_json


def fed_formulas(prompt_len: int, new_tokens: int) -> dict:
    """Tokens fed to forward for N new tokens after a P-token prompt: P+N-1 with the cache
    (prefill, then one a step), P*N + N(N-1)/2 without (everything so far, every step)."""
    p, n = prompt_len, new_tokens
    return {"with_cache": p + n - 1, "without_cache": p * n + n * (n - 1) // 2}


def build_context(results: dict[str, dict], language: str, answers_shown: int = 3) -> dict:
    """Numbers for the template, from the loaded result files (keyed by file stem)."""
    count, timing = results["count"], results["time"]
    formulas = fed_formulas(count["prompt_len"], count["new_tokens"])
    temperature_rows = []
    for key, row in results["temp"].items():
        answers = results["temp_answers"]["answers"][key]
        common = Counter(answers).most_common(answers_shown)
        temperature_rows.append({"temperature": key, "distinct": row["distinct"], "samples": len(answers),
                                 "examples": [{"text": text, "times": times} for text, times in common]})
    topp_rows = [{"p": p, "flat": n, "sharp": results["topp_sharp"]["survivors"].get(p)} for p, n in results["topp"].items()]
    return {
        "lang": language,
        "same": results["same"],
        "count": count,
        "formulas": formulas,
        "token_ratio": count["fed_without_cache"] / count["fed_with_cache"],
        "time": timing,
        "time_runs": results["time_runs"],
        "kv": results["kvbytes"],
        "kv_match": results["kvbytes"]["measured_bytes"] == results["kvbytes"]["formula_bytes"],
        "temperature_rows": temperature_rows,
        "question": results["temp_answers"]["question"],
        "chat_template": results["temp_answers"]["chat_template"],
        "topp_rows": topp_rows,
        "flat_prefix": results["topp_sharp"]["flat_prefix"],
        "sharp_prefix": results["topp_sharp"]["prefix"],
        "prompt": results["prompt"],
    }


def render_report(template_path, result_paths: dict[str, str], language: str) -> str:
    """Load the result files and render the template in a sandbox (a template is untrusted input)."""
    results = {name: read_json(path) for name, path in result_paths.items()}
    template_path = Path(template_path)
    env = SandboxedEnvironment(loader=FileSystemLoader(template_path.parent), undefined=StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["thousands"] = lambda n: f"{n:,}"
    return env.get_template(template_path.name).render(**build_context(results, language))
