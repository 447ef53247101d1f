"""The class page of the HTML report: the grades, each test's pass rate, both figures embedded, and
every student's tests not passed with their output (a student's text is escaped, never markup)."""
from kvlab.io import read_json, write_text_atomic
from kvlab.grade.class_page import class_page
from kvlab.workflow import run


def main(snakemake):
    i = snakemake.input
    p = snakemake.params
    page = class_page(i.template, [read_json(path) for path in i.results], list(i.figures), p.language, p.key)
    write_text_atomic(snakemake.output.class_page, page)


run(snakemake, main)
