"""Grading a class (rules/grade.smk, kvlab.grade.classroom, kvlab.grade.check): the example class grades to
its expected scores against the key it carries, by the README's command on a fresh clone, with no job
of the lab; each broken folder costs only its student with a readable reason, the report's numbers
are found only as what they are, the class page speaks the report's language, and a resubmission
reruns one job and the class outputs."""
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import kvlab.config as lab_config
from kvlab.facts.sheet import LAB_RESULTS
from kvlab.io import read_csv_rows
from kvlab.grade import check, classroom
from kvlab.grade.folder import Folder
from kvlab.present.i18n import messages as i18n_messages
from kvlab.grade.class_page import class_page

from helpers import (ROOT, assert_hangul_drawn_in_the_pages_own_face, chromium_and_playwright, copy_workflow, course_config,
                     dry_run_jobs, snakemake)

EXAMPLE = ROOT / "examples" / "class"
POINTS = {"files": 1, "same_ids": 1, "fed_with_cache": 2, "fed_without_cache": 2, "cache_faster": 1, "kv_bytes": 2,
          "temp": 1, "topp": 1, "report_headings": 1, "report_speedup": 1, "report_measured_bytes": 1}
EVIL_NAME = "<img src=x onerror=\"document.title='pwned'\">"
CLASS_JOBS = {"grade_class": 1, "figure_class_scores": 1, "figure_class_tests": 1, "class_page": 1, "grade": 1}


def expected_scores(folder) -> dict:
    rows = (Path(folder) / "expected.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return {line.split("\t")[0]: (int(line.split("\t")[1]), line.split("\t")[2].split()) for line in rows}


def settings_for(key_folder, **changes):
    """The lab's default settings, with the key read from `key_folder` (a correct folder holds it)."""
    key = {name: json.loads((Path(key_folder) / f"{name}.json").read_text(encoding="utf-8"))
           for name in ("temp", "topp", "kvbytes")}
    return check.Settings(**{"temperatures": (0.3, 1.0, 1.5), "samples": 30, "ps": (0.5, 0.9, 0.99), "key": key,
                             "temp_tolerance": 2, **changes})


def grade_example():
    """The example class graded in-process against the key it carries: {student_id: results.json}."""
    settings = settings_for(EXAMPLE / "key")
    students = classroom.read_class_sheet(EXAMPLE / "students.tsv")
    return {s["student_id"]: classroom.grade_student(s, settings, POINTS) for s in students}


def test_the_committed_example_class_grades_to_its_expected_scores():
    """examples/class was made from a default build and carries that build's key (examples/class/key,
    the files its correct student handed in). Every student's score and failed tests are the ones
    expected.tsv names."""
    for name in classroom.KEY_RESULTS:
        file_name = LAB_RESULTS[name]
        assert (EXAMPLE / "key" / file_name).read_bytes() == (EXAMPLE / "s01" / file_name).read_bytes()
    graded = grade_example()
    for student_id, (score, lost) in expected_scores(EXAMPLE).items():
        result = graded[student_id]
        assert result["score"] == score, (student_id, result["output"])
        assert [classroom.rule_of(t) for t in result["tests"] if t["status"] == "failed"] == lost, student_id
    assert graded["s08"]["output"].startswith("no submission") and graded["s08"]["score"] == 0
    assert "after repeat_kv" in next(t["output"] for t in graded["s02"]["tests"] if t["name"].startswith("kv_bytes"))
    assert "not UTF-8" in graded["s05"]["tests"][-1]["output"]
    assert "outside the folder" in graded["s06"]["tests"][1]["output"]
    assert (EXAMPLE / "s06" / "same.json").is_symlink()  # git keeps the link


def test_the_example_class_points_are_the_configs():
    assert yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))["grade"]["points"] == POINTS


def test_the_readmes_grade_command_scores_the_example_class_as_documented(tmp_path):
    """On a fresh clone, nothing built: the README's `grade` command grades examples/class against the key
    it carries, runs no job of the lab, and every score is expected.tsv's; the class page (Korean, the
    config's language) names the key."""
    from test_docs import bash_lines

    commands = [c for c in bash_lines((ROOT / "README.md").read_text(encoding="utf-8"), "snakemake") if " grade " in c]
    assert len(commands) == 1 and "key: examples/class/key" in commands[0], commands
    clone = copy_workflow(tmp_path / "kvlab")
    shutil.copytree(EXAMPLE, clone / "examples" / "class", symlinks=True)
    words = shlex.split(commands[0])
    run = subprocess.run([sys.executable, "-m", *words], cwd=clone, capture_output=True, text=True)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    start = output.index("Job stats:")
    stats = output[start:output.index("\ntotal", start)].splitlines()[3:]
    jobs = {name: int(count) for name, count in map(str.split, stats)}
    assert jobs == {"grade_student": 8, **CLASS_JOBS}, jobs  # nothing of the lab
    rows = {row["student_id"]: row for row in read_csv_rows(clone / "results/class/grades.csv")}
    for student_id, (score, lost) in expected_scores(EXAMPLE).items():
        assert rows[student_id]["score"] == score, (student_id, rows[student_id])
        assert [name for name in POINTS if rows[student_id][name] == 0] == lost, student_id
    page = (clone / "results/class/class.html").read_text(encoding="utf-8")
    assert "<code>examples/class/key</code>(grade.key)" in page and "4단계:" in page


HANGUL = re.compile("[\uac00-\ud7a3]")


@pytest.mark.parametrize("language", ["ko", "en"])
def test_the_class_page_speaks_the_reports_language(tmp_path, language):
    """Every word of the page is the report's language, the tests' lines of kvlab.grade.check.RULES
    too: in Korean no English line of RULES is left; in English no Hangul in them (the students'
    names and their files' words are theirs)."""
    figures = []
    for name in ("class_scores", "class_tests"):
        figures.append(tmp_path / f"{name}.png")
        figures[-1].write_bytes(b"a figure")
    graded = list(grade_example().values())
    page = class_page(ROOT / "templates" / "class.html.j2", graded, figures, language, key="examples/class/key")
    tests = page[page.index('<table id="tests">'):page.index("</table>")]
    whats = re.findall(r"<td><code>\w+</code></td><td>(.*?)</td>", tests)
    assert len(whats) == len(check.RULES)
    english = [line for _rule, line in check.RULES.values()]
    headers = page[:page.index("</tr>", page.index('<table id="students">'))]  # all but the students' rows
    if language == "ko":
        assert not [line for line in english if line.replace("'", "&#39;") in page], page
        assert all(HANGUL.search(what) for what in whats), whats
        assert "<title>반 채점</title>" in page and "통과하지 못한 테스트와 이유" in headers
        assert "학생 8명 중 7명이 제출했습니다." in page
        # the summary's sentences apart, not run together ("제출했습니다.만점은")
        summary = re.sub(r"\s+", " ", page[page.index('<p id="summary">'):page.index("</p>")])
        assert "제출했습니다. " in summary and not re.search("[\uac00-\ud7a3][.][\uac00-\ud7a3]", summary), summary
    else:
        assert whats == [line.replace("'", "&#39;") for line in english]
        assert not HANGUL.search(headers), headers
        assert "7 of 8 students handed in a folder." in page and "<code>examples/class/key</code>" in page
        summary = re.sub(r"\s+", " ", page[page.index('<p id="summary">'):page.index("</p>")])
        assert "a folder. The maximum" in summary, summary


def test_a_key_that_is_not_one_stops_in_one_line(tmp_path):
    """grade.key names a folder of one build's temp, topp and kvbytes, made with the lab's temperatures
    and p: anything else stops the run before any job, naming the key."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))
    key = shutil.copytree(EXAMPLE / "key", tmp_path / "key")
    config["grade"]["key"] = str(key)
    lab_config.check_config(config)  # the example's key is one for config.yaml's lab
    assert lab_config.answer_key(config) == {name: str(key / LAB_RESULTS[name]) for name in classroom.KEY_RESULTS}
    for change, message in [
        (lambda: config["lab"]["temp"].update(temperatures=[0.3, 1.5]), "temp: keys ['0.3', '1.0', '1.5'], expected"),
        (lambda: (key / "topp.json").unlink(), "is not an answer key: topp.json missing"),
        (lambda: config["grade"].update(key=str(tmp_path / "nowhere")), "folder not found"),
    ]:
        change()
        with pytest.raises(lab_config.ConfigError) as err:
            lab_config.check_config(config)
        assert str(err.value).startswith("config key 'grade.key': ") and message in str(err.value), str(err.value)
        assert "\n" not in str(err.value)


# --- the report's numbers: found as what they are, in ## KV 캐시 ------------------------------------


def report_folder(tmp_path, report, speedup=4.634, measured=204800):
    folder = tmp_path / "student"
    folder.mkdir(exist_ok=True)
    (folder / "time.json").write_text(json.dumps({"with_cache_s": 1.0, "without_cache_s": speedup,
                                                  "speedup": speedup}), encoding="utf-8")
    (folder / "kvbytes.json").write_text(json.dumps({"measured_bytes": measured}), encoding="utf-8")
    (folder / "report.md").write_text(report, encoding="utf-8")
    return Folder(folder)


SETTINGS = check.Settings(temperatures=(0.3,), samples=30, ps=(0.5,))


@pytest.mark.parametrize("report, speedup, ok", [
    ("## KV 캐시\n시간은 **4.63×** 빨랐다.\n", 4.634, True),
    ("## KV 캐시\nspeedup = 4.6\n", 4.634, True),
    ("## KV 캐시\n4.6 times faster\n", 4.634, True),
    # the holes: 3.45x written, 5.0 measured, found inside "15.00"; 0.29 "found as 0.3"
    ("## KV 캐시\n시간은 3.45x, 15.00초\n", 5.0, False),
    ("## KV 캐시\n온도 0.3에서 0.3×\n", 0.29, False),
    ("## KV 캐시\n배율 4.63\n", 4.634, True),
    ("## KV 캐시\n4.63\n", 4.634, False),  # a bare number is not a speedup
    ("## KV 캐시\n2 × 층\n", 2.0, False),  # a product sign is not a speedup, and 2 has one digit
    ("## KV 캐시\n없음\n## 온도\n4.63× 빨랐다\n", 4.634, False),  # outside the section
    ("## KV cache\n4.63×\n", 4.634, False),  # no section by that heading
], ids=["sign", "word", "times", "15.00", "0.3", "배율", "bare", "product", "elsewhere", "no-section"])
def test_the_speedup_is_found_only_as_a_speedup_in_the_kv_section(tmp_path, report, speedup, ok):
    verdict = check.report_speedup(report_folder(tmp_path, report, speedup=speedup), SETTINGS)
    assert verdict[0] is ok, verdict[1]


@pytest.mark.parametrize("report, ok", [
    ("## KV 캐시\n**measured_bytes = 204,800 바이트**\n", True),
    ("## KV 캐시\nthe cache holds 204800 bytes\n", True),
    ("## KV 캐시\n200.0 KiB\n", True),
    ("## KV 캐시\n204,800 토큰\n", False),
    ("## KV 캐시\n1204,800 bytes 2204800 B\n", False),
    ("## KV 캐시\n없음\n## top-p\n204,800 바이트\n", False),
], ids=["label-and-unit", "bytes", "KiB", "not-bytes", "inside-a-number", "elsewhere"])
def test_the_bytes_are_found_only_as_bytes_in_the_kv_section(tmp_path, report, ok):
    verdict = check.report_measured_bytes(report_folder(tmp_path, report), SETTINGS)
    assert verdict[0] is ok, verdict[1]


@pytest.mark.parametrize("report, ok", [
    # the workflow's own sentences, with a cache weighed after repeat_kv (409,600 bytes) in kvbytes.json
    ("## KV 캐시\n**measured_bytes = 204,800 바이트**로 공식과 같습니다. KV 헤드 2개만 둡니다(`repeat_kv` 이후라면 "
     "409,600 바이트).\n", False),
    ("## KV 캐시\nhold **measured_bytes = 204,800 bytes**, exactly the formula. With 2 KV heads, not the 4 query heads "
     "(after `repeat_kv` it would be 409,600 bytes), so the cache is small.\n", False),
    ("## KV 캐시\nhold **measured_bytes = 204,800 bytes**, not the formula's 409,600 bytes.\n", False),
    ("## KV 캐시\n**measured_bytes = 204,800 바이트**로, 공식의 409,600 바이트와 다릅니다.\n", False),
    ("## KV 캐시\nThe cache would hold 409,600 bytes if K were kept after repeat_kv.\n", False),
    ("## KV 캐시\n캐시는 쿼리 헤드로 잰 409,600 바이트보다 작습니다.\n", False),
    # stated as measured, in a sentence that also compares it with the formula, or beside a hypothetical
    ("## KV 캐시\n캐시 크기는 409,600 바이트로 공식과 같았다.\n", True),
    ("## KV 캐시\n**measured_bytes = 409,600 바이트** (`repeat_kv` 이전이라면 204,800 바이트).\n", True),
    ("## KV 캐시\nThe cache holds 409,600 bytes, measured. It would be 204,800 bytes before repeat_kv.\n", True),
], ids=["ko-hypothetical", "en-hypothetical", "en-not-the-formula", "ko-differs", "if-would", "ko-than",
        "ko-measured", "measured-beside-hypothetical", "en-measured-then-hypothetical"])
def test_the_bytes_are_found_only_where_the_report_states_them_as_measured(tmp_path, report, ok):
    """Issue 38: a folder whose cache was weighed after repeat_kv (409,600 bytes) kept the workflow's
    report, which states 204,800 bytes as measured and 409,600 only in a hypothetical clause: that
    clause is no measurement of the student's, and report_measured_bytes fails."""
    verdict = check.report_measured_bytes(report_folder(tmp_path, report, measured=409600), SETTINGS)
    assert verdict[0] is ok, verdict[1]


def test_a_speedup_in_a_hypothetical_or_compared_clause_is_not_the_measured_one(tmp_path):
    for report, ok in (("## KV 캐시\nThe line predicts 4.63×, above the 3.10× measured.\n", False),
                       ("## KV 캐시\n시간은 3.10배 빨랐고, 직선은 4.63배를 예측합니다.\n", False),
                       ("## KV 캐시\n시간은 4.63배 빨랐습니다(직선이라면 5.10배).\n", True)):
        verdict = check.report_speedup(report_folder(tmp_path, report, speedup=4.634), SETTINGS)
        assert verdict[0] is ok, (report, verdict[1])


def test_the_workflows_own_reports_pass_in_both_languages(tmp_path):
    """The rendered report of either language states its numbers as the rules find them (the English
    one keeps the Korean headings)."""
    for lines in (["## KV 캐시", "| **배율** | **56.4×** | | **4.63×** (4.13–5.16×) |",
                   "**measured_bytes = 204,800 바이트**로, 공식"],
                  ["## KV 캐시", "| **ratio** | **56.4×** | | **4.63×** (4.13–5.16×) |",
                   "hold **measured_bytes = 204,800 bytes**, exactly"]):
        folder = report_folder(tmp_path, "\n".join(lines) + "\n")
        assert check.report_speedup(folder, SETTINGS)[0] and check.report_measured_bytes(folder, SETTINGS)[0]
    # the report's one bytes sentence (templates/report/kv_cache.md.j2), in both languages, as check reads it
    from kvlab.present.i18n import gettext_for

    template = (ROOT / "templates" / "report" / "kv_cache.md.j2").read_text(encoding="utf-8")
    assert template.count("**measured_bytes = {{ measured }} bytes**") == 2
    sentence = next(line for line in i18n_messages() if line.startswith("**Cache size.**") and "exactly" in line)
    assert "**measured_bytes = %(measured)s 바이트**" in gettext_for("ko")(sentence)


# --- an untrusted folder ---------------------------------------------------------------------------


def test_an_untrusted_folder_costs_only_the_tests_that_need_each_file(tmp_path):
    folder = tmp_path / "student"
    shutil.copytree(EXAMPLE / "s01", folder)
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps({"fed_with_cache": 1}), encoding="utf-8")
    (folder / "count.json").unlink()
    (folder / "count.json").symlink_to(outside)  # absolute link out of the folder
    (folder / "time.json").write_text('{"with_cache_s": NaN, "without_cache_s": 1, "speedup": 1}', encoding="utf-8")
    (folder / "topp.json").write_text(" " * 200_000 + "{}", encoding="utf-8")  # over a 100,000-byte cap
    (folder / "temp.json").unlink()
    (folder / "temp.json").mkdir()  # not a file
    (folder / "same.json").write_text("[" * 20_000 + "]" * 20_000, encoding="utf-8")  # nested too deep to parse
    result = check.check_results(folder, settings_for(EXAMPLE / "s01", max_bytes=100_000))
    rules = result["rules"]
    assert "outside the folder" in rules["fed_with_cache"]["detail"] and not rules["fed_with_cache"]["ok"]
    assert "NaN is not a JSON number" in rules["cache_faster"]["detail"]
    assert "over the 100,000-byte cap" in rules["topp"]["detail"]
    assert rules["temp"]["detail"] == "temp.json is not a regular file"
    assert not rules["same_ids"]["ok"] and "same.json" in rules["same_ids"]["detail"]
    assert rules["kv_bytes"]["ok"] and rules["report_headings"]["ok"]  # the files left alone still pass
    assert outside.read_text(encoding="utf-8") == json.dumps({"fed_with_cache": 1})  # never touched
    assert {line.split(" ")[0] for line in rules["files"]["detail"].split("; ")} == {
        "count.json", "time.json", "topp.json", "temp.json", "same.json"}


def test_wrong_types_are_named(tmp_path):
    folder = tmp_path / "student"
    shutil.copytree(EXAMPLE / "s01", folder)
    (folder / "kvbytes.json").write_text(json.dumps({"tokens": 100, "measured_bytes": 204800.0,
                                                     "formula_bytes": True, "k_shape": "1,100,2,32"}), encoding="utf-8")
    (folder / "same.json").write_text(json.dumps([1, 2]), encoding="utf-8")
    rules = check.check_results(folder, settings_for(EXAMPLE / "s01"))["rules"]
    assert rules["kv_bytes"]["detail"] == "kvbytes.json: measured_bytes should be an integer, got 204800.0"
    assert rules["same_ids"]["detail"] == "same.json should hold a JSON object, got list"
    assert rules["files"]["detail"] == "same.json should hold a JSON object, got list"  # types are the rules' job


# --- the class sheet -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("student_id\tname\n s1\tA\n", "missing column results (expected a header line with student_id, results"),
    ("student_id\tresults\ns1\ta\ns1\tb\n", "line 3: student_id s1 is already on line 2"),
    ("student_id\tresults\n../x\ta\n", "line 2: student_id '../x' should be letters, digits"),
    ("student_id\tresults\ns1\t\n", "line 2: student s1 has no results folder"),
    ("student_id\tresults\n", "no students"),
], ids=["missing-column", "duplicate", "bad-id", "no-folder", "empty"])
def test_class_sheet_errors_are_one_line(tmp_path, text, message):
    sheet = tmp_path / "class.tsv"
    sheet.write_text(text, encoding="utf-8")
    with pytest.raises(classroom.ClassSheetError) as err:
        classroom.read_class_sheet(sheet)
    assert message in str(err.value) and str(sheet) in str(err.value) and "\n" not in str(err.value)


def test_folders_are_relative_to_the_sheet_and_extra_columns_are_ignored(tmp_path):
    sheet = tmp_path / "course" / "class.tsv"
    sheet.parent.mkdir()
    sheet.write_text("email\tstudent_id\tresults\na@b\tk1\tsubmissions/k1\nc@d\tk2\t/abs/k2\n", encoding="utf-8")
    students = classroom.read_class_sheet(sheet)
    assert students == [{"student_id": "k1", "name": "", "results": str(sheet.parent / "submissions" / "k1")},
                        {"student_id": "k2", "name": "", "results": "/abs/k2"}]


# --- through Snakemake: the class graded from the build's own results --------------------------------


@pytest.fixture(scope="module")
def graded(course_build, course, tmp_path_factory):
    """A class made by tools/make_example_class.py from the course build, graded by `snakemake grade`
    in a copy of the build (the lab's results are the key; the copy keeps the build up to date)."""
    # at the build's depth: the workflow's templates are inputs named relative to the working folder
    workdir = shutil.copytree(course_build, tmp_path_factory.mktemp("grading"), symlinks=True, dirs_exist_ok=True)
    class_dir = tmp_path_factory.mktemp("class") / "class"
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_example_class.py"), str(workdir / "results"),
                    str(class_dir)], check=True)
    # a ninth student, not handed in, whose name is markup: the page must show it as text
    with open(class_dir / "students.tsv", "a", encoding="utf-8") as sheet:
        sheet.write(f"s09\t{EVIL_NAME}\ts09\n")
    before = {path: path.stat().st_mtime_ns for path in (workdir / "results").glob("*.json")}
    config = grade_config(course, class_dir)
    run = snakemake(workdir, "grade", config=config)
    return {"workdir": workdir, "class": class_dir, "run": run, "before": before, "course": course}


def grade_config(course, class_dir, **grade):
    """The build's config (the course files, the tests' small sizes) and a class to grade."""
    return {**course_config(course), "grade": {"class_sheet": str(class_dir / "students.tsv"), "points": POINTS,
                                               "temp_tolerance": 2, "max_file_bytes": 1 << 20, **grade}}


def test_snakemake_grade_gives_the_expected_scores(graded, course):
    rows = {str(row["student_id"]): row for row in read_csv_rows(graded["workdir"] / "results/class/grades.csv")}
    assert list(rows) == [f"s0{i}" for i in range(1, 10)] and rows["s09"]["score"] == 0
    for student_id, (score, lost) in expected_scores(graded["class"]).items():
        row = rows[student_id]
        assert row["score"] == score and row["max_score"] == sum(POINTS.values()), (student_id, row)
        assert [name for name in POINTS if row[name] == 0 and POINTS[name]] == lost, student_id
    assert rows["s08"]["note"].startswith("no submission:") and rows["s01"]["name"] == "김민수"
    gradescope = json.loads((graded["workdir"] / "results/class/s02/results.json").read_text(encoding="utf-8"))
    assert set(gradescope) >= {"score", "output", "visibility", "tests"}
    assert {tuple(sorted(test)) for test in gradescope["tests"]} == {
        ("max_score", "name", "number", "output", "score", "status", "visibility")}
    tests = read_csv_rows(graded["workdir"] / "results/class/tests.csv")
    assert [row["test"] for row in tests] == list(POINTS) and all(row["graded"] == 7 for row in tests)
    page = (graded["workdir"] / "results/class/class.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == 2 and "임지아" in page
    # grading never wrote into the lab's results, nor ran a lab job
    after = {path: path.stat().st_mtime_ns for path in (graded["workdir"] / "results").glob("*.json")}
    assert after == graded["before"]
    assert "Job stats" in graded["run"].stdout + graded["run"].stderr
    jobs = dry_run_jobs(graded["workdir"], config=grade_config(graded["course"], graded["class"]))
    assert jobs == {}, jobs  # nothing of the lab is stale after grading


def test_a_resubmission_reruns_one_student_and_the_class(graded):
    workdir, class_dir = graded["workdir"], graded["class"]
    config = grade_config(graded["course"], class_dir)
    report = class_dir / "s03" / "report.md"
    handed_in = report.read_text(encoding="utf-8")
    report.write_text(handed_in.replace("## top-p", "## top-p\n\n고쳐서 다시 냄.\n"), encoding="utf-8")
    assert dry_run_jobs(workdir, "grade", config=config) == {"grade_student": 1, **CLASS_JOBS}
    # the same files again (newer, but the checksums Snakemake recorded): nothing to grade
    report.write_text(handed_in, encoding="utf-8")
    assert dry_run_jobs(workdir, "grade", config=config) == {}


def test_a_new_student_runs_only_theirs_and_points_rerun_grading_only(graded):
    workdir, class_dir = graded["workdir"], graded["class"]
    sheet = class_dir / "students.tsv"
    bigger = class_dir / "bigger.tsv"
    bigger.write_text(sheet.read_text(encoding="utf-8") + "s10\t새 학생\ts01\n", encoding="utf-8")
    config = grade_config(graded["course"], class_dir, class_sheet=str(bigger))
    assert dry_run_jobs(workdir, "grade", config=config) == {"grade_student": 1, **CLASS_JOBS}
    config = grade_config(graded["course"], class_dir, points={**POINTS, "topp": 3})
    assert dry_run_jobs(workdir, "grade", config=config) == {"grade_student": 9, **CLASS_JOBS}


def test_the_class_page_in_a_browser(graded):
    """As a teacher opens it: both figures load, one row per student, and a name that is markup is
    shown as text, never run."""
    executable, sync_playwright = chromium_and_playwright("the class page")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto((graded["workdir"] / "results/class/class.html").as_uri())
            page.locator("#students").wait_for(timeout=30_000)
            images = page.locator("img")
            loaded = images.evaluate_all("images => images.map(image => image.complete && image.naturalWidth > 0)")
            assert loaded == [True, True]
            assert page.locator("#students tr").count() == 1 + 9 and page.locator("#tests tr").count() == 1 + 11
            assert page.title() == "반 채점" and EVIL_NAME in page.locator("#students").inner_text()
            assert "no submission" in page.locator("#students tr", has_text="s08").inner_text()
            # its Hangul drawn in the face it carries, on a machine with or without a Korean font
            assert_hangul_drawn_in_the_pages_own_face(page, "h1")
        finally:
            browser.close()


def test_grade_without_a_class_sheet_says_which_key(course_build, course):
    config = course_config(course)
    result = snakemake(course_build, "-n", "grade", config=config, check=False)
    assert result.returncode == 1
    assert (result.stdout + result.stderr).strip().splitlines()[-1].startswith("config key 'grade.class_sheet' is not set")


def test_a_bad_class_sheet_stops_before_any_job(course_build, course, tmp_path):
    sheet = tmp_path / "class.tsv"
    sheet.write_text("student_id\tresults\ns1\ta\ns1\tb\n", encoding="utf-8")
    config = grade_config(course, tmp_path, class_sheet=str(sheet))
    result = snakemake(course_build, "-n", "grade", config=config, check=False)
    assert result.returncode == 1
    assert (result.stdout + result.stderr).strip().splitlines()[-1] == (
        f"{sheet}, line 3: student_id s1 is already on line 2")


def test_the_class_tests_figure_says_what_its_colours_mean(tmp_path, monkeypatch):
    """Red bars are the tests fewer than half passed, green the rest, and the legend says so; the title
    claims no more than the pass rates show."""
    from kvlab.grade import class_page as page_module

    rows = [{"number": i + 1, "test": name, "passed": passed, "graded": 4}
            for i, (name, passed) in enumerate((("same_ids", 4), ("kv_bytes", 1), ("topp", 2)))]
    figures = []

    def keep(fig, path, rect=None):
        figures.append(fig)

    monkeypatch.setattr(page_module, "save", keep)
    page_module.class_tests(rows, tmp_path / "class_tests.png", "en")
    [fig] = figures
    ax = fig.axes[0]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend == ["passed by fewer than half", "passed by half or more"]
    red, green = (handle.get_facecolor() for handle in ax.get_legend().legend_handles)
    assert [bar.get_facecolor() for bar in ax.patches[:3]] == [green, red, green]  # 4/4, 1/4, 2/4 (half)
    assert "hard" not in ax.get_title()
