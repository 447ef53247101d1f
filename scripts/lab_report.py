"""results/report.md as one HTML page with its figures in it, for `snakemake --report`."""
from kvlab.io import write_text_atomic
from kvlab.present.pages import report_page
from kvlab.workflow import run


def main(snakemake):
    page = report_page(snakemake.input.template, snakemake.input.report, snakemake.input.figures,
                       snakemake.params.language)
    write_text_atomic(snakemake.output.lab_report, page)


run(snakemake, main)
