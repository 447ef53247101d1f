"""Grade a class: the class sheet, one student's folder as a Gradescope results file, the class table.

Every test is a rule of kvlab.grade.check (RULES, in the sheet's order), held to an answer key: the
workflow's own results on the same checkpoints, or a folder of them kept from the build a class was
made from (grade.key: examples/class/key). The formats are the ones graders already use:

- the class sheet is a tab-separated table read with pandas, as the Snakemake catalog's sample
  sheets are: `student_id`, `results` (the student's folder, relative to the sheet's own folder
  unless absolute) and an optional `name`; other columns are kept out of the way;
- each student's `results.json` is Gradescope's autograder format (score, output, visibility and
  tests[] with name, number, score, max_score, status, output, visibility);
- the class table has one row per student of the sheet, as nbgrader's grades CSV: a student whose
  folder is missing scores 0, with the reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

from kvlab.facts.sheet import HANDED_IN, LAB_RESULTS
from kvlab.grade.check import RULES, Settings, check_results, run_rule
from kvlab.grade.folder import Folder

REQUIRED_COLUMNS = ("student_id", "results")
# A student id names a folder under results/class/ and a Snakemake wildcard: letters, digits, . _ -
STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
NO_SUBMISSION = "no submission"
# The answer key: the workflow's own results of these sheet files, on the same checkpoints.
KEY_RESULTS = ("temp", "topp", "kvbytes")
# What a key's own files must pass, without a key: the rules that read them.
KEY_RULES = ("temp", "topp", "kv_bytes")
NO_SHEET = ("config key 'grade.class_sheet' is not set: give the class sheet, a TSV of student_id and results "
            "(e.g. --config grade='{class_sheet: examples/class/students.tsv}'); see docs/teaching.md")


class ClassSheetError(ValueError):
    """The class sheet cannot be used; the message names the file, the line and what was expected."""


def read_class_sheet(path) -> list[dict]:
    """The sheet's students in order, each {"student_id", "name", "results"} (results as a path
    relative to where the sheet's path is relative to). Raises ClassSheetError, one line."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ClassSheetError(f"config key 'grade.class_sheet': file not found: {path}")
    try:
        table = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, encoding="utf-8")
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ClassSheetError(f"{path}: not a UTF-8 tab-separated table with a header line "
                              f"({str(err).splitlines()[0]})") from None
    missing = [column for column in REQUIRED_COLUMNS if column not in table.columns]
    if missing:
        raise ClassSheetError(f"{path}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                              f"(expected a header line with student_id, results and optionally name, "
                              f"separated by tabs; found {', '.join(map(str, table.columns))})")
    students, lines = [], {}
    for line, row in enumerate(table.to_dict("records"), start=2):  # line 1 is the header
        student_id, folder = row["student_id"].strip(), row["results"].strip()
        if not STUDENT_ID.fullmatch(student_id):
            raise ClassSheetError(f"{path}, line {line}: student_id {student_id!r} should be letters, digits, "
                                  f". _ or - (it names the student's folder under results/class/)")
        if student_id in lines:
            raise ClassSheetError(f"{path}, line {line}: student_id {student_id} is already on line {lines[student_id]}")
        if not folder:
            raise ClassSheetError(f"{path}, line {line}: student {student_id} has no results folder "
                                  f"(give the folder their files are in, or will be)")
        lines[student_id] = line
        folder_path = Path(folder).expanduser()
        if not folder_path.is_absolute():
            folder_path = path.parent / folder_path
        students.append({"student_id": student_id, "name": row.get("name", "").strip(), "results": str(folder_path)})
    if not students:
        raise ClassSheetError(f"{path}: no students (one line per student after the header)")
    return students


def sheet_error(students: list[dict], schema: dict, path) -> str | None:
    """The first student row the class sheet's schema refuses, as one line; None if all pass."""
    validator = jsonschema.Draft202012Validator(schema)
    for line, row in enumerate(students, start=2):
        error = jsonschema.exceptions.best_match(validator.iter_errors(row))
        if error is not None:
            column = ".".join(map(str, error.absolute_path)) or "(row)"
            return f"{path}, line {line}: column {column}: {error.message}"
    return None


def submitted_files(folder) -> list[str]:
    """The sheet's files the folder holds as regular files (or links to one inside the folder): what
    a student's job depends on, so that a resubmitted or added file reruns it and nothing outside
    the folder is ever looked at."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    root = folder.resolve()
    found = []
    for name in HANDED_IN:
        path = folder / name
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            continue
        if path.is_file():
            found.append(str(path))
    return found


def student_inputs(student: dict, key_paths: dict[str, str]) -> dict:
    """A student's job inputs: the answer key's files, and the sheet's files the student's folder holds
    now (a resubmitted or added file reruns this student's job only; a missing one is the job's
    verdict, not Snakemake's error)."""
    return {**key_paths, "submitted": submitted_files(student["results"])}


def class_outputs(students: dict, paths: list[str]) -> list[str]:
    """What `grade` builds (`paths`), refused in one line when the class sheet names no students."""
    if not students:
        raise ClassSheetError(NO_SHEET)
    return paths


def load_key(paths: dict) -> dict:
    """The answer key: the workflow's own KEY_RESULTS ({name: path})."""
    return {name: json.loads(Path(path).read_text(encoding="utf-8")) for name, path in paths.items()}


def key_files(folder) -> dict[str, str]:
    """The answer key kept in `folder` (grade.key): {name: path} of KEY_RESULTS, by the sheet's file names."""
    return {name: str(Path(folder) / LAB_RESULTS[name]) for name in KEY_RESULTS}


def key_problem(folder, settings: Settings) -> str | None:
    """Why `folder` is no answer key for the lab's `settings` (its temperatures, samples and top-p
    values; no key), in one line; None when it is one: its three files there and passing the rules
    that read them (a key made with other temperatures or p would fail every student)."""
    folder = Path(folder)
    if not folder.is_dir():
        return f"folder not found: {folder}"
    missing = [path for path in key_files(folder).values() if not Path(path).is_file()]
    if missing:
        return (f"{folder} is not an answer key: {', '.join(Path(path).name for path in missing)} missing "
                f"(a key holds {', '.join(LAB_RESULTS[name] for name in KEY_RESULTS)} of one build)")
    files = Folder(folder, settings.max_bytes)
    for rule in KEY_RULES:
        verdict = run_rule(rule, files, settings)
        if not verdict["ok"]:
            return f"{folder} is not an answer key for the lab's settings: {rule}: {verdict['detail']}"
    return None


def _test(number: int, name: str, points: int, ok: bool, output: str) -> dict:
    return {"name": f"{name}: {RULES[name][1]}", "number": str(number), "score": points if ok else 0,
            "max_score": points, "status": "passed" if ok else "failed", "output": output,
            "visibility": "visible"}


def grade_student(student: dict, settings: Settings, points: dict) -> dict:
    """Gradescope's results.json for one student ({"student_id", "name", "results"}); a missing
    folder scores 0 on every test, with the reason."""
    folder = Path(student["results"])
    max_score = sum(points[name] for name in RULES)
    extra = {"student_id": student["student_id"], "name": student["name"], "results": student["results"],
             "max_score": max_score}
    if not folder.is_dir():
        reason = f"{NO_SUBMISSION}: {folder} {'is not a folder' if folder.exists() else 'not found'}"
        tests = [_test(i, name, points[name], False, reason) for i, name in enumerate(RULES, start=1)]
        return {"score": 0, "output": reason, "visibility": "visible", "tests": tests,
                "extra_data": {**extra, "submitted": False, "reason": reason, "warnings": []}}
    result = check_results(folder, settings)
    tests = [_test(i, name, points[name], verdict["ok"], verdict["detail"])
             for i, (name, verdict) in enumerate(result["rules"].items(), start=1)]
    score = sum(test["score"] for test in tests)
    failed = [name for name, verdict in result["rules"].items() if not verdict["ok"]]
    output = f"{score} of {max_score} points." + (f" Not passed: {', '.join(failed)}." if failed else "")
    output += "".join(f"\nWarning: {warning}" for warning in result["warnings"])
    return {"score": score, "output": output, "visibility": "visible", "tests": tests,
            "extra_data": {**extra, "submitted": True, "reason": "", "warnings": result["warnings"]}}


def rule_of(test: dict) -> str:
    """The rule's name of a Gradescope test ("same_ids: step 1: ..." -> "same_ids")."""
    return test["name"].split(":", 1)[0]


def class_rows(graded: list[dict]) -> list[dict]:
    """grades.csv: one row per student, in the sheet's order: student_id, name, score, max_score,
    the points of each test, and a note (the reason for a 0, or the tests not passed)."""
    rows = []
    for result in graded:
        extra = result["extra_data"]
        row = {"student_id": extra["student_id"], "name": extra["name"], "score": result["score"],
               "max_score": extra["max_score"]}
        row.update({rule_of(test): test["score"] for test in result["tests"]})
        failed = [rule_of(test) for test in result["tests"] if test["status"] == "failed"]
        row["note"] = extra["reason"] if not extra["submitted"] else (
            f"not passed: {' '.join(failed)}" if failed else "")
        rows.append(row)
    return rows


def pass_rate_rows(graded: list[dict]) -> list[dict]:
    """tests.csv: per test, how many of the students who handed in a folder passed it (a missing
    folder says nothing about which step was hard)."""
    handed_in = [result for result in graded if result["extra_data"]["submitted"]]
    rows = []
    for number, name in enumerate(RULES, start=1):
        passed = sum(1 for result in handed_in for test in result["tests"]
                     if rule_of(test) == name and test["status"] == "passed")
        points = next((test["max_score"] for test in graded[0]["tests"] if rule_of(test) == name), 0)
        rows.append({"number": number, "test": name, "what": RULES[name][1], "points": points,
                     "passed": passed, "graded": len(handed_in),
                     "pass_rate": round(passed / len(handed_in), 4) if handed_in else float("nan")})
    return rows
