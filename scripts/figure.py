"""Draw one figure of kvlab.facts.results.FIGURES (params.figure) from the rows or the JSON its
data result holds, with its labels in the report's language (params.language)."""
import importlib
from pathlib import Path

from kvlab.facts.results import FIGURES
from kvlab.io import read_csv_rows, read_json
from kvlab.workflow import run


def main(snakemake):
    figure = FIGURES[snakemake.params.figure]
    path = snakemake.input.data
    data = read_json(path) if Path(path).suffix == ".json" else read_csv_rows(path)
    draw = getattr(importlib.import_module(figure.drawn_by), figure.name)
    draw(data, snakemake.output.figure, language=snakemake.params.language)


run(snakemake, main)
