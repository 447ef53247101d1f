"""Grade a results folder against the lab sheet's rules, as an instructor would.

RULES holds one rule per thing the sheet grades, in the sheet's order. A rule reads the files it
needs through `Folder` and returns (ok, detail); a file it cannot use fails that rule only, with the
reason in its detail. `check_results` runs them all. The `check` rule (this build's own folder,
held to no key; or one student's, against the answer key) and the `grade` rules (a class of
students' folders, against the answer key: kvlab.grade.classroom) all call it, so each rule of the
sheet is written once.

A folder may be a student's, so it is untrusted: files are read, never executed; only the sheet's
file names are opened; a link leading out of the folder, a file over the size cap, a report that is
not UTF-8, malformed JSON and a value of the wrong type each cost the rules that need that file.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from kvlab.facts.formulas import fed_formulas
from kvlab.facts.sheet import HANDED_IN, KV_HEADING, LAB_RESULTS, REPORT_FILE, REPORT_HEADINGS
from kvlab.facts.timing import CONTENDED_CPU_SHARE, UNSTABLE_IQR_SHARE
from kvlab.present.i18n import N_

# A file larger than this is not read (extras.check and grade.max_file_bytes set it).
DEFAULT_MAX_BYTES = 1 << 20


class CheckFailed(ValueError):
    """One or more rules failed; the message names them."""


class Unusable(ValueError):
    """A file a rule needs cannot be used: the message names the file and why."""


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


class Folder:
    """A results folder whose files are read once, on first use, and only as data."""

    def __init__(self, path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._cache: dict[str, object] = {}

    def _read(self, file_name: str) -> bytes:
        path = self.path / file_name
        try:
            info = path.lstat()
        except FileNotFoundError:
            raise Unusable(f"{file_name} is missing") from None
        if stat.S_ISLNK(info.st_mode):
            target = path.resolve()
            if not target.is_relative_to(self.path.resolve()):
                raise Unusable(f"{file_name} is a link to {os.readlink(path)}, outside the folder: not read")
            path = target
        if not path.is_file():
            raise Unusable(f"{file_name} is not a regular file")
        size = path.stat().st_size
        if size > self.max_bytes:
            raise Unusable(f"{file_name} is {size:,} bytes, over the {self.max_bytes:,}-byte cap: not read")
        with open(path, "rb") as handle:
            data = handle.read(self.max_bytes + 1)
        if len(data) > self.max_bytes:  # it grew since
            raise Unusable(f"{file_name} is over the {self.max_bytes:,}-byte cap: not read")
        return data

    def text(self, file_name: str) -> str:
        data = self._read(file_name)
        try:
            return data.decode("utf-8-sig")  # a byte-order mark (Windows editors) is allowed
        except UnicodeDecodeError as err:
            raise Unusable(f"{file_name} is not UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}): "
                           f"save it as UTF-8") from None

    def json(self, file_name: str) -> dict:
        if file_name not in self._cache:
            self._cache[file_name] = self._parse(file_name)
        value = self._cache[file_name]
        if isinstance(value, Unusable):
            raise value
        return value

    def _parse(self, file_name: str):
        try:
            value = json.loads(self.text(file_name), parse_constant=_no_constant)
        except Unusable as err:
            return err
        except json.JSONDecodeError as err:
            return Unusable(f"{file_name} is not valid JSON ({err.msg}: line {err.lineno}, column {err.colno})")
        except ValueError as err:
            return Unusable(f"{file_name} is not valid JSON ({err})")
        except RecursionError:
            return Unusable(f"{file_name} is not valid JSON (nested too deeply)")
        if not isinstance(value, dict):
            return Unusable(f"{file_name} should hold a JSON object, got {type(value).__name__}")
        return value

    def result(self, name: str) -> dict:
        """The lab sheet's result file `name` (kvlab.facts.sheet.LAB_RESULTS), e.g. "counts"."""
        return self.json(LAB_RESULTS[name])

    def report(self) -> str:
        if REPORT_FILE not in self._cache:
            try:
                self._cache[REPORT_FILE] = self.text(REPORT_FILE)
            except Unusable as err:
                self._cache[REPORT_FILE] = err
        value = self._cache[REPORT_FILE]
        if isinstance(value, Unusable):
            raise value
        return value


def _no_constant(name):
    raise ValueError(f"{name} is not a JSON number")


KINDS = {
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "number": ("a finite number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "ints": ("a list of integers", lambda v: isinstance(v, list)
             and all(isinstance(x, int) and not isinstance(x, bool) for x in v)),
}


def field(folder: Folder, name: str, key: str, kind: str):
    """Key `key` of the sheet's file `name`, which must be of `kind` (KINDS)."""
    file_name, data = LAB_RESULTS[name], folder.result(name)
    if key not in data:
        raise Unusable(f"{file_name} has no key {key!r}")
    words, fits = KINDS[kind]
    if not fits(data[key]):
        raise Unusable(f"{file_name}: {key} should be {words}, got {_shown(data[key])}")
    return data[key]


def _shown(value) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


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
            problems.append(f'"{key}" should be {{"distinct": 1..{settings.samples}}}, got {_shown(row)}')
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
        return False, f"counts must be integers >= 1, got {_shown(data)}"
    ordered = [data[k] for k in sorted(expected, key=float)]
    if ordered != sorted(ordered):
        return False, f"survivors must not shrink as p grows, got {_shown(data)}"
    answer = (settings.key or {}).get("topp")
    if answer is None:
        return True, f"keys {expected}: {_shown(data)}"
    wrong = [f'"{k}": {data[k]}, key {answer[k]}' for k in expected if data[k] != answer[k]]
    if wrong:
        return False, "survivors differ from the key: " + "; ".join(wrong)
    return True, f"{_shown(data)}, equal to the key"


def report_headings(folder, settings):
    lines = {line.strip() for line in folder.report().splitlines()}
    missing = [heading for heading in REPORT_HEADINGS if heading not in lines]
    return not missing, "all three present" if not missing else f"missing {', '.join(missing)}"


# --- numbers in the report: found as what they are, in the KV cache section -----------------------

# A number as written: 4.63, 14,880, 204,800; not a piece of a longer number or word ("15.00" holds no "5.00").
_NUMBER = r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\d,]\d|\.\d)"
_SPACING = " \t*_`"
_BOLD = r"[\s*_`]*"
SPEEDUP_UNITS = ("×", "x", "X", "배", "times")
SPEEDUP_WORDS = ("speedup", "speed-up", "배율")
BYTE_UNITS = {"바이트": 1, "bytes": 1, "byte": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20}
BYTE_WORDS = ("measured_bytes",)
MIN_SIGNIFICANT = {"speedup": 2, "scaled bytes": 3}


def _after_unit(units) -> re.Pattern:
    """A number, then one of `units`: a sign (× or x) right after it, as in 4.63× ("2 × layers" is a
    product, not a speedup), a word (배, times, bytes) after spaces or emphasis."""
    def unit(u):
        spacing = "[*_]*" if u in ("×", "x", "X") else _BOLD
        return spacing + re.escape(u) + (r"(?![A-Za-z])" if u.isascii() else "")
    return re.compile(_NUMBER + "(" + "|".join(unit(u) for u in units) + ")")  # group 3: spacing and unit


def _after_word(words) -> re.Pattern:
    alternatives = "|".join(re.escape(w) for w in words)
    return re.compile(rf"(?:{alternatives})[^\d\n|]{{0,12}}?" + _NUMBER, re.IGNORECASE)  # not across a table cell


SPEEDUP_AFTER, SPEEDUP_LABELLED = _after_unit(SPEEDUP_UNITS), _after_word(SPEEDUP_WORDS)
BYTES_AFTER, BYTES_LABELLED = _after_unit(BYTE_UNITS), _after_word(BYTE_WORDS)


def kv_section(report: str) -> str | None:
    """The text of the report's `## KV 캐시` section (to the next heading of level 1 or 2), or None."""
    lines = report.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == KV_HEADING]
    if not starts:
        return None
    body = []
    for line in lines[starts[0] + 1:]:
        if re.match(r"#{1,2}\s", line.strip()):
            break
        body.append(line)
    return "\n".join(body)


# A clause that states no measured number: a hypothetical ("after repeat_kv it would be 409,600 bytes",
# "이후라면"), a prediction, or a comparison with another number ("not the formula's", "보다", "다릅니다").
# Matched case-blind, as words in English (a hypothetical "if" is not the "if" of "diff").
HYPOTHETICAL = ("would", "could", "if", "predict", "predicts", "predicted", "라면", "다면", "텐데", "예측")
COMPARED = ("than", "not the", "instead of", "rather than", "unlike", "differ", "differs", "보다", "아니라",
            "대신", "다릅", "달리", "비해")
# Where a clause ends: a sentence's end (not a decimal point), a colon or semicolon, a comma before a
# space (not a thousands separator), a table cell's bar, a line's end; a parenthesis is a clause of its own.
_CLAUSE_END = re.compile(r"[.!?。](?=\s|$)|[:;|\n]|,(?=\s)")
_PARENTHESIS = re.compile(r"\([^()\n]*\)")


def _states_no_measurement(clause: str) -> bool:
    lowered = clause.lower()
    for marker in (*HYPOTHETICAL, *COMPARED):
        if marker.isascii():
            if re.search(rf"(?<![a-z]){re.escape(marker)}(?![a-z])", lowered):
                return True
        elif marker in clause:
            return True
    return False


def stated_as_measured(section: str) -> str:
    """`section` with every clause that states no measured number blanked out (HYPOTHETICAL, COMPARED),
    so that a number is found only where the report gives it as what was measured: "measured_bytes =
    204,800 bytes" is kept, "(after repeat_kv it would be 409,600 bytes)" and "not the formula's 409,600
    bytes" are not. A parenthesis is judged on its own, then the clauses around it; blanked text
    becomes spaces, so no two numbers join."""
    def blank(match: re.Match) -> str:
        return " " * len(match.group(0)) if _states_no_measurement(match.group(0)) else match.group(0)

    text = _PARENTHESIS.sub(blank, section)
    kept, start = [], 0
    for end in [m.end() for m in _CLAUSE_END.finditer(text)] + [len(text)]:
        clause = text[start:end]
        kept.append(" " * len(clause) if _states_no_measurement(clause) else clause)
        start = end
    return "".join(kept)


def rounds_to(written: str, value: float, min_significant: int) -> bool:
    """`written` (e.g. "4.63", "1,234.5") is `value` rounded to the decimals written, with at least
    `min_significant` significant digits."""
    digits = written.replace(",", "")
    decimals = len(digits.partition(".")[2])
    if len(digits.replace(".", "").lstrip("0")) < min_significant:
        return False
    return abs(float(digits) - value) <= 0.5 * 10 ** -decimals * (1 + 1e-9)


def speedup_forms(section: str) -> list[tuple[str, str]]:
    """(number, as written) for every number the section writes as a speedup."""
    found = [(m.group(1) + (m.group(2) or ""), m.group(0).strip()) for m in SPEEDUP_AFTER.finditer(section)]
    found += [(m.group(1) + (m.group(2) or ""), m.group(0).strip()) for m in SPEEDUP_LABELLED.finditer(section)]
    return found


def byte_forms(section: str) -> list[tuple[str, int, str]]:
    """(number, bytes per unit, as written) for every number the section writes as bytes."""
    found = [(m.group(1) + (m.group(2) or ""), BYTE_UNITS[m.group(3).strip(_SPACING)], m.group(0).strip())
             for m in BYTES_AFTER.finditer(section)]
    found += [(m.group(1) + (m.group(2) or ""), 1, m.group(0).strip()) for m in BYTES_LABELLED.finditer(section)]
    return found


def _bytes_match(number: str, unit: int, value: int) -> bool:
    if unit == 1:
        return "." not in number and int(number.replace(",", "")) == value
    return rounds_to(number, value / unit, MIN_SIGNIFICANT["scaled bytes"])


def _shown_forms(forms) -> str:
    written = list(dict.fromkeys(form[-1] for form in forms))
    return ", ".join(written[:6]) + (", ..." if len(written) > 6 else "") if written else "none"


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
                   f"what it states as measured {as_what}: {_shown_forms(forms)}")


def report_speedup(folder, settings):
    speedup = field(folder, "time", "speedup", "number")
    return _written_in_kv_section(folder, f"speedup {speedup:.3f}", "time.json", "a speedup", speedup_forms,
                                  lambda form: rounds_to(form[0], speedup, MIN_SIGNIFICANT["speedup"]))


def report_measured_bytes(folder, settings):
    measured = field(folder, "kvbytes", "measured_bytes", "int")
    return _written_in_kv_section(folder, f"measured_bytes {measured:,}", "kvbytes.json", "bytes", byte_forms,
                                  lambda form: _bytes_match(form[0], form[1], measured))


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
