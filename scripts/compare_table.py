"""compare.csv: one row a model, the lab's own first."""
from kvlab.io import read_json, write_csv_atomic
from kvlab.facts.compare import compare_rows
from kvlab.workflow import run


def main(snakemake):
    costs = {name: read_json(path) for name, path in zip(snakemake.params.names, snakemake.input.costs)}
    write_csv_atomic(snakemake.output.compare, compare_rows(costs, snakemake.params.kinds))


run(snakemake, main)
