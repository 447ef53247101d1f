"""Draw one of the report's figures (which one: the rule's name) from the rows or the JSON a rule
wrote, with its labels in the report's language (params.language)."""
from pathlib import Path

from kvlab.io import read_csv_rows, read_json
from kvlab.lab import figures
from kvlab.workflow import run

DRAW = {
    "figure_cost_curves": figures.cost_curve,
    "figure_step_times": figures.latency_curve,
    "figure_topp_survivors": figures.topp_curve,
    "figure_temperature_effect": figures.temperature_curve,
    "figure_compare": figures.compare_curve,
    "figure_batch": figures.batch_curve,
    "figure_kv_waste": figures.kv_waste_bars,
    "figure_step_anatomy": figures.step_anatomy_figure,
    "figure_class_scores": figures.class_scores,
    "figure_class_tests": figures.class_tests,
}


def main(snakemake):
    path = snakemake.input.data
    data = read_json(path) if Path(path).suffix == ".json" else read_csv_rows(path)
    DRAW[snakemake.rule](data, snakemake.output.figure, language=snakemake.params.language)


run(snakemake, main)
