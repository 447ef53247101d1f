"""Draw one of the report's figures from the rows a rule wrote (which one: params.kind), with its
labels in the report's language (params.language)."""
from kvlab.lab import figures
from kvlab.io import read_csv_rows, read_json
from kvlab.workflow import run

DRAW = {
    "cost_curves": (figures.cost_curve, "csv"),
    "step_times": (figures.latency_curve, "json"),
    "topp_survivors": (figures.topp_curve, "csv"),
    "temperature_effect": (figures.temperature_curve, "csv"),
    "compare": (figures.compare_curve, "csv"),
}


def main(snakemake):
    draw, kind = DRAW[snakemake.params.kind]
    data = read_json(snakemake.input.data) if kind == "json" else read_csv_rows(snakemake.input.data)
    draw(data, snakemake.output.figure, language=snakemake.params.language)


run(snakemake, main)
