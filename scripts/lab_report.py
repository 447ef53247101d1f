"""The lab's two reports as one HTML page with their figures and Korean font in it, for `snakemake --report`."""
from kvlab.io import write_text_atomic
from kvlab.present.figures import hangul_font_path
from kvlab.present.pages import report_page
from kvlab.workflow import run


def main(snakemake):
    i = snakemake.input
    page = report_page(i.template, [i.report, i.beyond], i.figures, hangul_font_path(), snakemake.params.language)
    write_text_atomic(snakemake.output.lab_report, page)


run(snakemake, main)
