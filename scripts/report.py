"""Step 7: render results/report.md from the result files."""
from kvlab.io import write_text_atomic
from kvlab.present.report import render_report
from kvlab.workflow import run


def main(snakemake):
    # the template reads each result by its input name
    results = {name: path for name, path in snakemake.input.items() if name != "template"}
    text = render_report(snakemake.input.template, results, snakemake.params.language)
    write_text_atomic(snakemake.output.report, text)


run(snakemake, main)
