"""Step 7: render one of the lab's reports (results/report.md, the sheet's; results/beyond.md, what lies
beyond it) from the result files."""
from kvlab.io import write_text_atomic
from kvlab.present.report import render_report
from kvlab.workflow import run


def main(snakemake):
    # the templates read each result by its input name
    results = {name: path for name, path in snakemake.input.items() if name not in ("template", "sections")}
    text = render_report(snakemake.input.template, results, snakemake.params.language, snakemake.params.given)
    write_text_atomic(snakemake.output[0], text)


run(snakemake, main)
