"""The lab sheet's six result files as one HTML page of tables, for `snakemake --report`."""
from pathlib import Path

from kvlab.io import write_text_atomic
from kvlab.lab.tables import render_tables
from kvlab.workflow import run


def main(snakemake):
    # keyed by the result files' stems (the input names differ for count.json: `count` is reserved)
    paths = {Path(path).stem: path for name, path in snakemake.input.items() if name != "template"}
    write_text_atomic(snakemake.output.tables, render_tables(snakemake.input.template, paths))


run(snakemake, main)
