"""Grade a results folder against the lab sheet's rules, as an instructor would.

RULES holds one rule per thing the sheet grades, in the sheet's order. A rule reads the files it
needs through `Folder` and returns (ok, detail); a file it cannot use fails that rule only, with the
reason in its detail. `check_results` runs them all. The `check` rule (this build's own folder,
held to no key; or one student's, against the answer key) and the `grade` rules (a class of
students' folders, against the answer key: kvlab.grade.classroom) all call it, so each rule of the
sheet is written once.

A folder may be a student's, so it is untrusted: it is read through kvlab.grade.folder (the security
boundary), and a file a rule cannot use fails that rule only. The numbers the report states as
measured are found by kvlab.grade.report_numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvlab.facts.formulas import fed_formulas
from kvlab.facts.sheet import HANDED_IN, KV_HEADING, REPORT_FILE, REPORT_HEADINGS
from kvlab.facts.timing import CONTENDED_CPU_SHARE, UNSTABLE_IQR_SHARE
from kvlab.grade.folder import DEFAULT_MAX_BYTES, KINDS, Folder, Unusable, field, shown
from kvlab.grade.report_numbers import (MIN_SIGNIFICANT, byte_forms, bytes_match, kv_section, rounds_to,
                                        shown_forms, speedup_forms, stated_as_measured)
from kvlab.present.i18n import N_


@dataclass(frozen=True)
class Settings:
    """What the rules are held to: the lab's temperatures, samples and top-p values; an answer key
    (the workflow's own temp, topp and kvbytes results on the same checkpoints) or None, which
    checks each file's shape and its own consistency only; how far a distinct-answer count may
    be from the key's; the size cap of a file."""

    temperatures: tuple
    samples: int
    ps: tuple
    key: dict | None = None
    temp_tolerance: int = 0
    max_bytes: int = DEFAULT_MAX_BYTES



# --- the rules, in the sheet's order ------------------------------------------------------------


def files(folder, settings):
    """Every file the sheet names is there, in the folder, under the cap, and readable: the JSON
    files hold a JSON object, the report is UTF-8 text."""
    problems = []
    for file_name in HANDED_IN:
        try:
            folder.report() if file_name == REPORT_FILE else folder.json(file_name)
        except Unusable as err:
            problems.append(str(err))
    return not problems, "; ".join(problems) or f"all {len(HANDED_IN)} files present and readable"


def same_ids(folder, settings):
    same, ids = field(folder, "same", "same_ids", "bool"), field(folder, "same", "ids", "ints")
    p, n = field(folder, "same", "prompt_len", "int"), field(folder, "same", "new_tokens", "int")
    count_p, count_n = field(folder, "counts", "prompt_len", "int"), field(folder, "counts", "new_tokens", "int")
    ok = same is True and p == count_p and n == count_n == len(ids)
    return ok, (f"same_ids={json.dumps(same)}, {len(ids)} ids, P/N {p}/{n} in same.json vs "
                f"{count_p}/{count_n} in count.json")


def _fed(folder: Folder, mode: str) -> tuple[bool, str]:
    p, n = field(folder, "counts", "prompt_len", "int"), field(folder, "counts", "new_tokens", "int")
    if p < 1 or n < 1:
        return False, f"prompt_len={p} and new_tokens={n} should both be at least 1"
    expected = fed_formulas(p, n)[mode]
    written = "P+N-1" if mode == "with_cache" else "P*N+N(N-1)/2"
    got = field(folder, "counts", f"fed_{mode}", "int")
    return got == expected, f"fed_{mode}={got}, {written}={expected} (P={p}, N={n})"


def fed_with_cache(folder, settings):
    return _fed(folder, "with_cache")


def fed_without_cache(folder, settings):
    return _fed(folder, "without_cache")


def cache_faster(folder, settings):
    with_s, without_s = field(folder, "time", "with_cache_s", "number"), field(folder, "time", "without_cache_s", "number")
    speedup = field(folder, "time", "speedup", "number")
    # the speedup may be written rounded: it must agree with the two times to 1%
    consistent = with_s > 0 and math.isclose(speedup, without_s / with_s, rel_tol=0.01)
    ok = 0 < with_s < without_s and consistent
    detail = f"with_cache_s={with_s:.4f}, without_cache_s={without_s:.4f}, speedup={speedup:.3f}"
    if with_s > 0 and not consistent:
        detail += f", but without/with = {without_s / with_s:.3f}"
    if not 0 < with_s < without_s:
        detail += ": the cache side is not faster"
    return ok, detail


def kv_bytes(folder, settings):
    """measured_bytes equals the formula with the cache's own shape, (batch, tokens, KV heads,
    head_dim): the shape before repeat_kv. Against a key, the shape and bytes are the key's."""
    measured, formula = field(folder, "kvbytes", "measured_bytes", "int"), field(folder, "kvbytes", "formula_bytes", "int")
    shape, tokens = field(folder, "kvbytes", "k_shape", "ints"), field(folder, "kvbytes", "tokens", "int")
    detail = f"measured_bytes={measured}, formula_bytes={formula}, k_shape={shape} for tokens={tokens}"
    if len(shape) != 4:
        return False, detail + ": k_shape should be (batch, tokens, KV heads, head_dim)"
    key = (settings.key or {}).get("kvbytes")
    if key is None:
        batch, length, kv_heads, head_dim = shape
        per_layer = 2 * batch * length * kv_heads * head_dim  # elements of one layer's K and V
        ok = measured == formula and length == tokens and per_layer > 0 and formula % per_layer == 0
        return ok, detail
    ok = (measured == formula == key["measured_bytes"] and shape == key["k_shape"] and tokens == key["tokens"])
    if ok:
        return True, detail
    heads, key_heads = shape[2], key["k_shape"][2]
    if heads > key_heads and heads % key_heads == 0:
        why = (f"k_shape has {heads} heads: the shape after repeat_kv; the cache holds {key_heads} KV heads, "
               f"{key['measured_bytes']:,} bytes for {key['tokens']} tokens")
    else:
        why = f"expected k_shape={key['k_shape']} and {key['measured_bytes']:,} bytes for tokens={key['tokens']}"
    return False, f"{detail}; {why}"


def temp(folder, settings):
    """temp.json has one {"distinct": n} per temperature, 1 <= n <= samples; against a key, each n
    within temp_tolerance of the key's."""
    data = folder.result("temp")
    expected = [str(t) for t in settings.temperatures]
    if sorted(data) != sorted(expected):
        return False, f"keys {sorted(data)}, expected {sorted(expected)}"
    problems = []
    for key in expected:
        row = data[key]
        if not (isinstance(row, dict) and set(row) == {"distinct"} and KINDS["int"][1](row["distinct"])
                and 1 <= row["distinct"] <= settings.samples):
            problems.append(f'"{key}" should be {{"distinct": 1..{settings.samples}}}, got {shown(row)}')
    if problems:
        return False, "; ".join(problems)
    counts = {key: data[key]["distinct"] for key in expected}
    answer = (settings.key or {}).get("temp")
    if answer is None:
        return True, f"keys {expected}, distinct {counts}"
    off = [f'"{key}": {counts[key]}, key {answer[key]["distinct"]}' for key in expected
           if abs(counts[key] - answer[key]["distinct"]) > settings.temp_tolerance]
    within = f"within {settings.temp_tolerance} of the key" if settings.temp_tolerance else "equal to the key"
    if off:
        return False, f"distinct answers should be {within}: " + "; ".join(off)
    key_counts = {key: answer[key]["distinct"] for key in expected}
    return True, f"distinct {counts}, {within} {key_counts}"


def topp(folder, settings):
    """topp.json has one integer count per p, not shrinking as p grows; against a key, exactly the key's."""
    data = folder.result("topp")
    expected = [str(p) for p in settings.ps]
    if sorted(data) != sorted(expected):
        return False, f"keys {sorted(data)}, expected {sorted(expected)}"
    if not all(KINDS["int"][1](data[k]) and data[k] >= 1 for k in expected):
        return False, f"counts must be integers >= 1, got {shown(data)}"
    ordered = [data[k] for k in sorted(expected, key=float)]
    if ordered != sorted(ordered):
        return False, f"survivors must not shrink as p grows, got {shown(data)}"
    answer = (settings.key or {}).get("topp")
    if answer is None:
        return True, f"keys {expected}: {shown(data)}"
    wrong = [f'"{k}": {data[k]}, key {answer[k]}' for k in expected if data[k] != answer[k]]
    if wrong:
        return False, "survivors differ from the key: " + "; ".join(wrong)
    return True, f"{shown(data)}, equal to the key"


def report_headings(folder, settings):
    lines = {line.strip() for line in folder.report().splitlines()}
    missing = [heading for heading in REPORT_HEADINGS if heading not in lines]
    return not missing, "all three present" if not missing else f"missing {', '.join(missing)}"


def _written_in_kv_section(folder, label: str, source: str, as_what: str, forms_of, matches):
    """Whether the report's KV section writes `label` (from `source`) as `as_what`, stated as measured:
    among the forms `forms_of` finds in its clauses that state a measurement (`stated_as_measured`),
    each ending in the text as written, one that `matches`."""
    section = kv_section(folder.report())
    if section is None:
        return False, f"no {KV_HEADING} section to find {label} in"
    forms = forms_of(stated_as_measured(section))
    found = [form[-1] for form in forms if matches(form)]
    if found:
        return True, f"{label} found in {KV_HEADING} as {found[0]}"
    return False, (f"{label} ({source}) not found in {KV_HEADING} as {as_what}, stated as measured; "
                   f"what it states as measured {as_what}: {shown_forms(forms)}")


def report_speedup(folder, settings):
    speedup = field(folder, "time", "speedup", "number")
    return _written_in_kv_section(folder, f"speedup {speedup:.3f}", "time.json", "a speedup", speedup_forms,
                                  lambda form: rounds_to(form[0], speedup, MIN_SIGNIFICANT["speedup"]))


def report_measured_bytes(folder, settings):
    measured = field(folder, "kvbytes", "measured_bytes", "int")
    return _written_in_kv_section(folder, f"measured_bytes {measured:,}", "kvbytes.json", "bytes", byte_forms,
                                  lambda form: bytes_match(form[0], form[1], measured))


# name -> (rule, what it grades, in a line). The lines are in English, as Gradescope's results.json
# names its tests; the class page shows them in the report's language (kvlab.present.i18n's catalog).
RULES = {
    "files": (files, N_("the sheet's seven files are there and readable")),
    "same_ids": (same_ids, N_("step 1: greedy tokens are the same with and without the cache")),
    "fed_with_cache": (fed_with_cache, N_("step 2: tokens fed with the cache = P + N - 1")),
    "fed_without_cache": (fed_without_cache, N_("step 2: tokens fed without the cache = P·N + N(N-1)/2")),
    "cache_faster": (cache_faster, N_("step 3: the cache side is faster, speedup = without / with")),
    "kv_bytes": (kv_bytes, N_("step 4: measured bytes = the formula, with the shape before repeat_kv")),
    "temp": (temp, N_("step 5: distinct answers per temperature")),
    "topp": (topp, N_("step 6: candidates top-p keeps")),
    "report_headings": (report_headings, N_("step 7: the report's three sections")),
    "report_speedup": (report_speedup, N_("step 7: the speedup, written as one, in the KV cache section")),
    "report_measured_bytes": (report_measured_bytes,
                              N_("step 7: measured_bytes, written as bytes, in the KV cache section")),
}


def run_rule(name: str, folder: Folder, settings: Settings) -> dict:
    """{"ok", "detail"} of rule `name` on `folder`."""
    rule = RULES[name][0]
    try:
        ok, detail = rule(folder, settings)
    except Unusable as err:
        ok, detail = False, str(err)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        ok, detail = False, f"unexpected content: {type(err).__name__}: {err}"
    return {"ok": bool(ok), "detail": detail}


def check_results(results_dir, settings: Settings) -> dict:
    """Every rule's verdict for the folder: {"ok": all passed, "rules": {name: {"ok", "detail"}}}."""
    folder = Folder(results_dir, settings.max_bytes)
    verdicts = {name: run_rule(name, folder, settings) for name in RULES}
    return {"results_dir": str(results_dir), "ok": all(v["ok"] for v in verdicts.values()), "rules": verdicts,
            "warnings": timing_warnings(folder) + model_warnings(folder)}


def _optional(folder: Folder, file_name: str) -> dict:
    """A file the sheet does not ask for, {} when it is missing or unusable."""
    try:
        return folder.json(file_name)
    except Unusable:
        return {}


def timing_warnings(folder: Folder) -> list[str]:
    """One line when step 3's timing is unstable, one when it is contended (time_runs.json, when the
    folder has one): the speedup passes or fails `cache_faster` on numbers the machine could not hold
    steady, or on runs it took from (slowed alike, so their spread can be small)."""
    summary = _optional(folder, "time_runs.json").get("summary", {})
    if not isinstance(summary, dict):
        return []
    modes = {mode: stats for mode, stats in summary.items() if isinstance(stats, dict)}
    number = KINDS["number"][1]
    unstable = [f"{mode.replace('_', ' ')} ({100 * stats['iqr_share']:.0f}%)" for mode, stats in modes.items()
                if stats.get("unstable") and number(stats.get("iqr_share"))]
    contended = [f"{mode.replace('_', ' ')} (a median {100 * stats['cpu_share']:.0f}% of the wall time on a CPU; "
                 f"{100 * stats['contended_runs']:.0f}% of the runs under {100 * CONTENDED_CPU_SHARE:.0f}%)"
                 for mode, stats in modes.items() if stats.get("contended") is True
                 and number(stats.get("cpu_share")) and number(stats.get("contended_runs"))]
    warnings = []
    if unstable:
        warnings.append(f"step 3's timing is unstable: the IQR of the runs {' and '.join(unstable)} is "
                        f"{100 * UNSTABLE_IQR_SHARE:.0f}% of the median or more; other work most likely shared the "
                        f"CPU while timing: time again on a quiet machine")
    if contended:
        warnings.append(f"step 3's timing is contended: the process waited for its CPU in the runs "
                        f"{' and '.join(contended)}; another process shared its core, and the speedup is not this "
                        f"machine's: time again on a quiet machine")
    return warnings


def model_warnings(folder: Folder) -> list[str]:
    """Warnings about the model the lab ran on (model_card.json, when the folder has one): numbers that
    pass every rule can still come from an untrained model or a tokenizer that is not the model's."""
    warnings = _optional(folder, "model_card.json").get("warnings", [])
    return [str(w) for w in warnings] if isinstance(warnings, list) else []


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


def failed_check(path) -> str | None:
    """The line a run ends on when the check written to `path` (results/check.json, or another folder's
    results/check/NAME.json) failed: `failure_message`; None when it passed, or is not there (not run,
    or unreadable: the job that writes it says why)."""
    try:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("ok") is not False or not isinstance(result.get("rules"), dict):
        return None
    return failure_message(result)
