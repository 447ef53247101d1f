"""The class page (results/class/class.html) and its two figures: the class's scores and each test's
pass rate. A student's text is escaped, never markup."""

from __future__ import annotations

import base64
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Patch
import numpy as np

from markupsafe import Markup

from kvlab.grade.classroom import class_rows, pass_rate_rows
from kvlab.present.drawing import drawing, save
from kvlab.present.fonts import font_family, with_font
from kvlab.present.i18n import N_, gettext_for
from kvlab.present.pages import sandboxed_template

# Every label the figures draw, in English (its Korean in the catalog: kvlab.present.i18n).
LABELS = {
    "score": N_("score (points)"),
    "students": N_("students"),
    "scores_title": N_("Scores of the class ({students} students, maximum {max_score})"),
    "pass_rate": N_("students who handed in a folder and passed (%)"),
    "tests_title": N_("Pass rate of each test ({graded} folders)"),
    "under_half": N_("passed by fewer than half"),
    "half_or_more": N_("passed by half or more"),
}


def class_page(template_path, graded: list[dict], figure_paths, language: str, key: str | None = None) -> str:
    """The class page (results/class/class.html) from the students' results.json files: the summary,
    which answer key they were held to (grade.key's folder, or None: this build's own results), each
    test's pass rate with what it grades, the figures embedded, and each student's row with the tests
    not passed and their output. Its words are in `language` (the catalog of kvlab.present.i18n), the
    tests' lines of kvlab.grade.check.RULES too; the outputs stay as the grader wrote them. Rendered
    with autoescape: names and outputs quote what students wrote. The page carries its Hangul font
    (kvlab.present.fonts), cut to its characters."""
    figures = {Path(path).stem: base64.b64encode(Path(path).read_bytes()).decode("ascii") for path in figure_paths}
    grades = class_rows(graded)
    scores = sorted(row["score"] for row in grades)
    middle = len(scores) // 2
    median = scores[middle] if len(scores) % 2 else (scores[middle - 1] + scores[middle]) / 2
    summary = {"students": len(grades), "handed_in": sum(1 for r in graded if r["extra_data"]["submitted"]),
               "max_score": grades[0]["max_score"], "median": median,
               "full_marks": sum(1 for row in grades if row["score"] == row["max_score"])}
    students = [{**row, "submitted": result["extra_data"]["submitted"],
                 "failed": [test for test in result["tests"] if test["status"] == "failed"]}
                for row, result in zip(grades, graded)]
    translate = gettext_for(language)
    tests = [{**row, "what": translate(row["what"])} for row in pass_rate_rows(graded)]
    template = sandboxed_template(template_path, autoescape=True, language=language)
    # the Hangul font, cut to the page's own characters (a student's name among them)
    return with_font(lambda font_face: template.render(
        lang=language, summary=summary, key=key, tests=tests, students=students, figures=figures,
        font_face=Markup(font_face), font_family=Markup(font_family())))


def class_scores(rows: list[dict], path, language: str = "en") -> None:
    """A histogram of the class's scores, one bar per possible score (grades.csv)."""
    max_score = int(rows[0]["max_score"])
    counts = np.bincount([int(row["score"]) for row in rows], minlength=max_score + 1)
    with drawing(language, LABELS) as text:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.bar(np.arange(max_score + 1), counts, 0.8, color="tab:blue")
        ax.set_xticks(np.arange(max_score + 1))
        ax.set_xlim(-0.6, max_score + 0.6)
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel(text("score"))
        ax.set_ylabel(text("students"))
        ax.set_title(text("scores_title", students=len(rows), max_score=max_score))
        save(fig, path)


def class_tests(rows: list[dict], path, language: str = "en") -> None:
    """One horizontal bar per test, in the sheet's order: the share of the folders handed in that
    passed it (tests.csv), red where fewer than half passed, a line at half, and a legend that says so."""
    rates = np.array([0.0 if row["graded"] == 0 else 100 * row["passed"] / row["graded"] for row in rows])
    with drawing(language, LABELS) as text:
        fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
        positions = np.arange(len(rows))[::-1]
        colors = {True: "tab:red", False: "tab:green"}
        ax.barh(positions, rates, 0.6, color=[colors[bool(rate < 50)] for rate in rates])
        ax.axvline(50, color="grey", ls=":", lw=1)
        ax.legend([Patch(color=colors[True]), Patch(color=colors[False])],
                  [text("under_half"), text("half_or_more")], fontsize=8, loc="lower right")
        for y, row, rate in zip(positions, rows, rates):
            ax.annotate(f"{row['passed']}/{row['graded']}", (rate, y), textcoords="offset points", xytext=(3, 0),
                        va="center", fontsize=8)
        ax.set_yticks(positions, [f"{row['number']}. {row['test']}" for row in rows], fontsize=8)
        ax.set_xlim(0, 110)
        ax.set_xlabel(text("pass_rate"))
        ax.set_title(text("tests_title", graded=rows[0]["graded"]))
        save(fig, path)
