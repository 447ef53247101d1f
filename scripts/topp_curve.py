"""Top-p curve: survivors of MiniMind's top-p rule for a grid of p, after both prefixes."""
from kvlab.measure.curves import grid, topp_curve
from kvlab.io import write_csv_atomic
from kvlab.checkpoints import load_model_input
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    model, device = load_model_input(snakemake, "pretrain")
    p = snakemake.params
    rows = topp_curve(model, tokenizer, p.prefix, p.sharp_prefix, grid(p.step, 1.0, p.step), p.lab_ps, device)
    log.info("%s", rows)
    write_csv_atomic(snakemake.output.topp_curve, rows)


run(snakemake, main)
