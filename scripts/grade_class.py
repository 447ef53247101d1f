"""The class table (grades.csv, one row per student of the sheet) and each test's pass rate
(tests.csv), from the students' results.json files."""
from kvlab.io import read_json, write_csv_atomic
from kvlab.grade.classroom import class_rows, pass_rate_rows
from kvlab.workflow import log, run


def main(snakemake):
    graded = [read_json(path) for path in snakemake.input.results]
    rows = class_rows(graded)
    write_csv_atomic(snakemake.output.grades, rows)
    write_csv_atomic(snakemake.output.tests, pass_rate_rows(graded))
    log.info("%d students, %d handed in", len(rows), sum(r["extra_data"]["submitted"] for r in graded))


run(snakemake, main)
