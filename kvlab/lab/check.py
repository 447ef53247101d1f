"""Check a results folder against the lab sheet's rules, as an instructor would grade it.

Each rule reads the files it needs and returns (ok, detail); a missing file or key
fails that rule only, with the reason in its detail. `check_results` runs them all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvlab.io import read_json
from kvlab.lab.formulas import fed_formulas
from kvlab.lab.sheet import LAB_RESULTS, REPORT_FILE, REPORT_HEADINGS
from kvlab.lab.timing import UNSTABLE_IQR_SHARE


class CheckFailed(ValueError):
    """One or more rules failed; the message names them."""


class Folder:
    """A results folder whose files are read once, on first use."""

    def __init__(self, path):
        self.path = Path(path)
        self._cache: dict[str, object] = {}

    def json(self, file_name: str):
        if file_name not in self._cache:
            self._cache[file_name] = read_json(self.path / file_name)
        return self._cache[file_name]

    def result(self, name: str):
        """The lab sheet's result file `name` (kvlab.lab.sheet.LAB_RESULTS), e.g. "counts"."""
        return self.json(LAB_RESULTS[name])

    def report(self) -> str:
        if REPORT_FILE not in self._cache:
            self._cache[REPORT_FILE] = (self.path / REPORT_FILE).read_text(encoding="utf-8")
        return self._cache[REPORT_FILE]


def _fed(folder: Folder, mode: str) -> tuple[bool, str]:
    count = folder.result("counts")
    p, n = count["prompt_len"], count["new_tokens"]
    expected = fed_formulas(p, n)[mode]
    written = "P+N-1" if mode == "with_cache" else "P*N+N(N-1)/2"
    got = count[f"fed_{mode}"]
    return got == expected, f"fed_{mode}={got}, {written}={expected} (P={p}, N={n})"


def fed_with_cache(folder):
    return _fed(folder, "with_cache")


def fed_without_cache(folder):
    return _fed(folder, "without_cache")


def same_ids(folder):
    same, count = folder.result("same"), folder.result("counts")
    lengths_agree = (same["prompt_len"] == count["prompt_len"] and same["new_tokens"] == count["new_tokens"]
                     == len(same["ids"]))
    ok = same["same_ids"] is True and lengths_agree
    return ok, (f"same_ids={json.dumps(same['same_ids'])}, {len(same['ids'])} ids, "
                f"P/N {same['prompt_len']}/{same['new_tokens']} in same.json vs "
                f"{count['prompt_len']}/{count['new_tokens']} in count.json")


def kv_bytes(folder):
    kv = folder.result("kvbytes")
    batch, tokens, kv_heads, head_dim = kv["k_shape"]
    per_layer = 2 * batch * tokens * kv_heads * head_dim  # elements of one layer's K and V
    ok = kv["measured_bytes"] == kv["formula_bytes"] and tokens == kv["tokens"] and kv["formula_bytes"] % per_layer == 0
    return ok, (f"measured_bytes={kv['measured_bytes']}, formula_bytes={kv['formula_bytes']}, "
                f"k_shape={kv['k_shape']} for tokens={kv['tokens']}")


def cache_faster(folder):
    timing = folder.result("time")
    with_s, without_s, speedup = timing["with_cache_s"], timing["without_cache_s"], timing["speedup"]
    # the speedup may be written rounded: it must agree with the two times to 1%
    consistent = with_s > 0 and math.isclose(speedup, without_s / with_s, rel_tol=0.01)
    ok = 0 < with_s < without_s and consistent
    detail = f"with_cache_s={with_s:.4f}, without_cache_s={without_s:.4f}, speedup={speedup:.3f}"
    if with_s > 0 and not consistent:
        detail += f", but without/with = {without_s / with_s:.3f}"
    return ok, detail


def report_headings(folder):
    report = folder.report()
    lines = {line.strip() for line in report.splitlines()}
    missing = [heading for heading in REPORT_HEADINGS if heading not in lines]
    return not missing, "all three present" if not missing else f"missing {', '.join(missing)}"


def _number_forms(value: float, decimals=(3, 2, 1)) -> list[str]:
    return [f"{value:.{d}f}" for d in decimals]


def report_speedup(folder):
    speedup = folder.result("time")["speedup"]
    forms = _number_forms(speedup)
    found = [form for form in forms if form in folder.report()]
    return bool(found), f"speedup {forms[1]} {'found as ' + found[0] if found else 'not found (tried ' + ', '.join(forms) + ')'}"


def report_measured_bytes(folder):
    measured = folder.result("kvbytes")["measured_bytes"]
    forms = [f"{measured:,}", str(measured)]
    found = [form for form in forms if form in folder.report()]
    return bool(found), f"measured_bytes {forms[0]} {'found' if found else 'not found'}"


def temp_keys(folder, temperatures, samples):
    temp = folder.result("temp")
    expected = [str(t) for t in temperatures]
    problems = []
    if sorted(temp) != sorted(expected):
        problems.append(f"keys {sorted(temp)} != {sorted(expected)}")
    for key, row in temp.items():
        if not (isinstance(row, dict) and set(row) == {"distinct"} and isinstance(row["distinct"], int)
                and 1 <= row["distinct"] <= samples):
            problems.append(f'"{key}" should be {{"distinct": 1..{samples}}}, got {json.dumps(row)}')
    return not problems, "; ".join(problems) or f"keys {expected}, each {{distinct}}"


def topp_keys(folder, ps):
    topp = folder.result("topp")
    expected = [str(p) for p in ps]
    problems = []
    if sorted(topp) != sorted(expected):
        problems.append(f"keys {sorted(topp)} != {sorted(expected)}")
    elif not all(isinstance(topp[k], int) and topp[k] >= 1 for k in expected):
        problems.append(f"counts must be integers >= 1, got {json.dumps(topp)}")
    elif [topp[k] for k in sorted(expected, key=float)] != sorted(topp[k] for k in expected):
        problems.append(f"survivors must not shrink as p grows, got {json.dumps(topp)}")
    return not problems, "; ".join(problems) or f"keys {expected}: {json.dumps(topp)}"


def check_results(results_dir, temperatures, samples: int, ps) -> dict:
    """Every rule's verdict for the folder: {"ok": all passed, "rules": {name: {"ok", "detail"}}}."""
    folder = Folder(results_dir)
    rules = {
        "fed_with_cache": lambda: fed_with_cache(folder),
        "fed_without_cache": lambda: fed_without_cache(folder),
        "same_ids": lambda: same_ids(folder),
        "kv_bytes": lambda: kv_bytes(folder),
        "cache_faster": lambda: cache_faster(folder),
        "report_headings": lambda: report_headings(folder),
        "report_speedup": lambda: report_speedup(folder),
        "report_measured_bytes": lambda: report_measured_bytes(folder),
        "temp_keys": lambda: temp_keys(folder, temperatures, samples),
        "topp_keys": lambda: topp_keys(folder, ps),
    }
    verdicts = {}
    for name, rule in rules.items():
        try:
            ok, detail = rule()
        except FileNotFoundError as err:
            ok, detail = False, f"file not found: {err.filename}"
        except json.JSONDecodeError as err:
            ok, detail = False, f"not valid JSON: {err}"
        except KeyError as err:
            ok, detail = False, f"missing key {err}"
        except (TypeError, ValueError, AttributeError) as err:
            ok, detail = False, f"unexpected content: {err}"
        verdicts[name] = {"ok": bool(ok), "detail": detail}
    return {"results_dir": str(results_dir), "ok": all(v["ok"] for v in verdicts.values()), "rules": verdicts,
            "warnings": timing_warnings(folder) + model_warnings(folder)}


def timing_warnings(folder: Folder) -> list[str]:
    """One line when step 3's timing is unstable (time_runs.json, when the folder has one): the
    speedup passes or fails `cache_faster` on numbers the machine could not hold steady."""
    if not (folder.path / "time_runs.json").is_file():
        return []
    summary = folder.json("time_runs.json").get("summary", {})
    unstable = [f"{mode.replace('_', ' ')} ({100 * stats['iqr_share']:.0f}%)" for mode, stats in summary.items()
                if stats.get("unstable")]
    if not unstable:
        return []
    return [f"step 3's timing is unstable: the IQR of the runs {' and '.join(unstable)} is "
            f"{100 * UNSTABLE_IQR_SHARE:.0f}% of the median or more; other work most likely shared the CPU while "
            f"timing: time again on a quiet machine"]


def model_warnings(folder: Folder) -> list[str]:
    """Warnings about the model the lab ran on (model_card.json, when the folder has one): numbers that
    pass every rule can still come from an untrained model or a tokenizer that is not the model's."""
    if not (folder.path / "model_card.json").is_file():
        return []
    return list(folder.json("model_card.json").get("warnings", []))


def verdict_table(result: dict) -> str:
    """A short fixed-width table, one line per rule, after a line per warning."""
    width = max(len(name) for name in result["rules"])
    lines = [f"check of {result['results_dir']}"]
    lines.extend(f"WARNING: {warning}" for warning in result.get("warnings", []))
    lines.append(f"{'rule':<{width}}  verdict  detail")
    for name, verdict in result["rules"].items():
        lines.append(f"{name:<{width}}  {'PASS' if verdict['ok'] else 'FAIL':<7}  {verdict['detail']}")
    failed = [name for name, verdict in result["rules"].items() if not verdict["ok"]]
    lines.append("all rules pass" if not failed else f"FAILED: {', '.join(failed)}")
    return "\n".join(lines)


def failure_message(result: dict) -> str:
    failed = {name: v["detail"] for name, v in result["rules"].items() if not v["ok"]}
    return "check failed: " + "; ".join(f"{name} ({detail})" for name, detail in failed.items())
