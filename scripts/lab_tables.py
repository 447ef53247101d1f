"""The lab sheet's six result files as one HTML page of tables, for `snakemake --report`."""
from kvlab.io import write_text_atomic
from kvlab.present.tables import render_tables
from kvlab.workflow import run


def main(snakemake):
    paths = {name: path for name, path in snakemake.input.items() if name != "template"}
    write_text_atomic(snakemake.output.lab_tables, render_tables(snakemake.input.template, paths, snakemake.params.language))


run(snakemake, main)
