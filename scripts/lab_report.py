"""The lab's two reports as one HTML page with their figures and Korean font in it, for `snakemake --report`;
and the Korean font of the report's front page (report/workflow.rst)."""
from kvlab.io import write_text_atomic
from kvlab.present.fonts import hangul_font_path
from kvlab.present.pages import front_page_font, report_page
from kvlab.workflow import run


def main(snakemake):
    i = snakemake.input
    page = report_page(i.template, [i.report, i.beyond], i.figures, hangul_font_path(), snakemake.params.language)
    write_text_atomic(snakemake.output.lab_report, page)
    write_text_atomic(snakemake.output.front_page_font, front_page_font(i.front_page, snakemake.params.front_page_values))


run(snakemake, main)
