"""The measured numbers a report writes, found as what they are: a speedup (4.63×, 4.63배, "speedup
4.63") or a number of bytes (204,800 bytes, 200 KiB, "measured_bytes = 204,800"), only in the report's
`## KV 캐시` section and only in the clauses that state a measurement (not a hypothetical, a prediction
or a comparison with another number). kvlab.grade.check's rules report_speedup and
report_measured_bytes hold a report to its own time.json and kvbytes.json with these.
"""

from __future__ import annotations

import re

from kvlab.facts.sheet import KV_HEADING

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


def bytes_match(number: str, unit: int, value: int) -> bool:
    """Whether `number`, written in units of `unit` bytes, is `value` bytes: exactly in bytes, rounded as
    written (with MIN_SIGNIFICANT digits) in KiB or MiB."""
    if unit == 1:
        return "." not in number and int(number.replace(",", "")) == value
    return rounds_to(number, value / unit, MIN_SIGNIFICANT["scaled bytes"])


def shown_forms(forms) -> str:
    """The first six of `forms` as written, for a detail; "none" when there are none."""
    written = list(dict.fromkeys(form[-1] for form in forms))
    return ", ".join(written[:6]) + (", ..." if len(written) > 6 else "") if written else "none"
