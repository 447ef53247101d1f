"""The lab as a page a student plays with (results/explore.html): one self-contained file, from the result files."""
from kvlab.io import write_text_atomic
from kvlab.present.explore import render_explore
from kvlab.present.fonts import hangul_font_path
from kvlab.workflow import run


def main(snakemake):
    i = snakemake.input
    results = {name: path for name, path in i.items() if name not in ("template", "script", "style")}
    page = render_explore(i.template, i.script, i.style, results, hangul_font_path(), snakemake.params.language)
    write_text_atomic(snakemake.output.explore, page)


run(snakemake, main)
