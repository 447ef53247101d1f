"""Temperature curve: distinct SFT answers and mean sampled entropy for a grid of temperatures."""
import pandas as pd

from kvlab.curves import grid, temperature_curve
from kvlab.io import atomic_path, write_json_atomic
from kvlab.workflow import load_model_input, load_tokenizer_input, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    model, device = load_model_input(snakemake, "sft", tokenizer)
    p = snakemake.params
    temperatures = grid(p.t_min, p.t_max, p.t_step)
    rows, answers = temperature_curve(model, tokenizer, p.question, temperatures, p.samples, p.max_new_tokens,
                                      p.seed, device)
    write_json_atomic(snakemake.output.answers, {"question": p.question, "seed": p.seed, "answers": answers})
    with atomic_path(snakemake.output.curve) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


run(snakemake, main)
