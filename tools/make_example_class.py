"""Write an example class (a class sheet and a handful of students' folders) from a built results folder.

    python tools/make_example_class.py results examples/class

The students are synthetic, made from the build's own files, each correct or broken the way students
get the lab wrong; expected.tsv holds the score each must get with config.yaml's grade.points and
grade.temp_tolerance (read from it here), graded against the answer key written beside them: key/,
the build's temp.json, topp.json and kvbytes.json (grade.key: examples/class/key grades the class
against the build it was made from, on any machine: docs/teaching.md). The seven files of the sheet
only: nothing here is executed by the grader.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import yaml

from kvlab.facts.sheet import LAB_RESULTS
from kvlab.grade.classroom import KEY_RESULTS

# The points and the tolerance the class is graded with: config.yaml's.
GRADE = yaml.safe_load((Path(__file__).resolve().parents[1] / "config.yaml").read_text(encoding="utf-8"))["grade"]
POINTS = GRADE["points"]


def load(folder: Path, name: str) -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def dump(folder: Path, name: str, data: dict) -> None:
    (folder / name).write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def handwritten_report(speedup: str, measured: str, count: dict, topp: dict, bytes_in_kv: bool = True) -> str:
    """A short report as a student writes it: the three headings, the speedup and the bytes as given."""
    ratio = count["fed_without_cache"] / count["fed_with_cache"]
    byte_line = f"캐시 크기는 {measured} 바이트로 공식과 같았다."
    topp_line = ", ".join(f"p={p}에서 {n}개" for p, n in topp.items())
    return "\n".join([
        "# KV 캐시 실습 보고서", "",
        "## KV 캐시", "",
        f"캐시를 쓰면 forward에 넣는 토큰이 {ratio:.1f}배 적었고, 시간으로는 {speedup}배 빨랐다.",
        "토큰 수만큼 빨라지지 않는 것은 한 스텝마다 드는 고정 비용(파이썬과 커널 호출) 때문이다.",
        byte_line if bytes_in_kv else "", "",
        "## 온도", "",
        "온도를 올릴수록 서로 다른 답이 많아졌다.", "",
        "## top-p", "",
        f"남은 후보: {topp_line}.",
        "" if bytes_in_kv else byte_line, "",
    ])


def make_class(results: Path, out: Path, tolerance: int = GRADE["temp_tolerance"]) -> list[dict]:
    """Write out/students.tsv, out/expected.tsv, the answer key (out/key/) and one folder per student;
    returns the expected rows."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # the key the scores hold for: the build's own files, as grade reads them (kvlab.grade.classroom)
    (out / "key").mkdir()
    for name in KEY_RESULTS:
        shutil.copyfile(results / LAB_RESULTS[name], out / "key" / LAB_RESULTS[name])
    count, timing = load(results, "count.json"), load(results, "time.json")
    kv, temp, topp = load(results, "kvbytes.json"), load(results, "temp.json"), load(results, "topp.json")
    config = load(results / "checkpoints", "pretrain.json")["config"]
    speedup = f"{timing['speedup']:.2f}"
    measured = f"{kv['measured_bytes']:,}"

    def folder(student_id: str, report: str | None = None, encoding: str = "utf-8", **changed) -> Path:
        path = out / student_id
        path.mkdir()
        for name in LAB_RESULTS.values():
            if name in changed:
                if changed[name] is not None:
                    text = changed[name] if isinstance(changed[name], str) else json.dumps(changed[name], indent=2)
                    (path / name).write_text(text, encoding="utf-8")
            else:
                shutil.copyfile(results / name, path / name)
        (path / "report.md").write_bytes((report or handwritten_report(speedup, measured, count, topp)).encode(encoding))
        return path

    students = []

    def student(student_id, name, lost, why):
        students.append({"student_id": student_id, "name": name, "lost": lost, "why": why})

    # s01: everything right; the report is the workflow's own.
    folder("s01", report=(results / "report.md").read_text(encoding="utf-8"))
    student("s01", "김민수", [], "correct; the report is the workflow's own")

    # s02: weighed the cache after repeat_kv: every head repeated, the bytes n_rep times the truth.
    n_rep = config["num_attention_heads"] // config["num_key_value_heads"]
    n_rep = n_rep if n_rep > 1 else 2
    wrong = {**kv, "k_shape": [kv["k_shape"][0], kv["k_shape"][1], kv["k_shape"][2] * n_rep, kv["k_shape"][3]],
             "measured_bytes": kv["measured_bytes"] * n_rep, "formula_bytes": kv["formula_bytes"] * n_rep}
    # Their report is the workflow's, which states the true bytes as measured and theirs only in a
    # hypothetical clause ("after repeat_kv it would be ..."): not a measurement of theirs.
    folder("s02", report=(results / "report.md").read_text(encoding="utf-8"), **{"kvbytes.json": wrong})
    student("s02", "이서연", ["kv_bytes", "report_measured_bytes"],
            "k_shape and bytes after repeat_kv; the report's measured bytes are not kvbytes.json's")

    # s03: the report's speedup is another run's (one 25% off), the bytes are under ## top-p.
    folder("s03", report=handwritten_report(f"{timing['speedup'] * 1.25:.2f}", measured, count, topp,
                                             bytes_in_kv=False))
    student("s03", "박지훈", ["report_speedup", "report_measured_bytes"],
            "the report's speedup is not time.json's; the bytes are outside ## KV 캐시")

    # s04: seeded once for all temperatures (the lowest one's count off), top-p without the shift.
    lowest = min(temp, key=float)
    k = temp[lowest]["distinct"]
    off = k - tolerance - 1 if k - tolerance - 1 >= 1 else k + tolerance + 1  # (the lowest count is small)
    no_shift = {p: n - 1 if n > 1 else n for p, n in topp.items()}
    if no_shift == topp:
        no_shift[max(topp, key=float)] += 1
    folder("s04", **{"temp.json": {**temp, lowest: {"distinct": off}}, "topp.json": no_shift})
    student("s04", "최유나", ["temp", "topp"], "one seed for all temperatures; top-p cut without the shift")

    # s05: temp.json never handed in; the report saved in the Windows Korean encoding (cp949).
    folder("s05", encoding="cp949", **{"temp.json": None})
    student("s05", "정하은", ["files", "temp", "report_headings", "report_speedup", "report_measured_bytes"],
            "temp.json missing; report.md is cp949, not UTF-8")

    # s06: counts written as strings, the warm-up run timed with the cache (slower), and same.json a
    # link to another student's file.
    as_text = {key: str(value) for key, value in count.items()}
    slow = {"with_cache_s": timing["without_cache_s"] * 1.1, "without_cache_s": timing["without_cache_s"]}
    slow["speedup"] = slow["without_cache_s"] / slow["with_cache_s"]
    path = folder("s06", report=handwritten_report(f"{slow['speedup']:.2f}", measured, count, topp),
                  **{"count.json": as_text, "time.json": slow, "same.json": None})
    (path / "same.json").symlink_to(Path("..") / "s01" / "same.json")
    student("s06", "강도윤", ["files", "same_ids", "fed_with_cache", "fed_without_cache", "cache_faster"],
            "count.json holds strings; the cache side was slower; same.json links outside the folder")

    # s07: kvbytes.json cut off mid-write.
    text = json.dumps(kv, indent=2)
    folder("s07", **{"kvbytes.json": text[: len(text) // 2]})
    student("s07", "윤서준", ["files", "kv_bytes", "report_measured_bytes"], "kvbytes.json is not valid JSON")

    # s08: on the sheet, no folder.
    student("s08", "임지아", list(POINTS), "no submission")

    total = sum(POINTS.values())
    with open(out / "students.tsv", "w", encoding="utf-8") as sheet:
        sheet.write("student_id\tname\tresults\n")
        sheet.writelines(f"{s['student_id']}\t{s['name']}\t{s['student_id']}\n" for s in students)
    with open(out / "expected.tsv", "w", encoding="utf-8") as expected:
        expected.write("student_id\tscore\tnot_passed\twhy\n")
        for s in students:
            score = total - sum(POINTS[test] for test in s["lost"])
            expected.write(f"{s['student_id']}\t{score}\t{' '.join(s['lost'])}\t{s['why']}\n")
    return students


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a built results folder (with checkpoints/pretrain.json)")
    parser.add_argument("out", type=Path, help="the class folder to write (replaced)")
    args = parser.parse_args()
    make_class(args.results, args.out)


if __name__ == "__main__":
    main()
