"""Step 7: render one of the lab's reports (results/report.md, the sheet's; results/beyond.md, what lies
beyond it) from the result files."""
from pathlib import Path

from kvlab.io import write_text_atomic
from kvlab.present.report import render_report
from kvlab.workflow import build_provenance, run


def main(snakemake):
    # the templates read each result by its input name
    results = {name: path for name, path in snakemake.input.items() if name not in ("template", "sections")}
    # the workflow's folder (templates/report/NAME.md.j2 is in it): which commit made the report
    build = build_provenance(Path(snakemake.input.template).resolve().parents[2])
    text = render_report(snakemake.input.template, results, snakemake.params.language, snakemake.params.given,
                         build)
    write_text_atomic(snakemake.output[0], text)


run(snakemake, main)
