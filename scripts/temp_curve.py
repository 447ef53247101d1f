"""Temperature curve: distinct SFT answers and mean sampled entropy for a grid of temperatures and the
lab sheet's own."""
from kvlab.facts.budget import Budget
from kvlab.measure.curves import grid, temp_curve
from kvlab.io import write_csv_atomic, write_json_atomic
from kvlab.checkpoints import load_model_input
from kvlab.workflow import load_tokenizer_input, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    model, device = load_model_input(snakemake, "sft")
    p = snakemake.params
    temperatures = grid(p.t_min, p.t_max, p.t_step)
    rows, answers, budget = temp_curve(model, tokenizer, p.question, temperatures, p.lab_temperatures, p.samples,
                                       p.max_new_tokens, p.seed, device, Budget(p.budget_s))
    # what the budget left out, only where it left something out (else the file is as without a budget)
    write_json_atomic(snakemake.output.temp_curve_answers, {"question": p.question, "seed": p.seed, "answers": answers,
                                                             **({"budget": budget} if budget["cut"] else {})})
    write_csv_atomic(snakemake.output.temp_curve, rows)


run(snakemake, main)
