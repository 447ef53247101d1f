"""What the lab's page needs beside the lab's results: step 1's generation (as `same` opened it) step by step, both prefixes' logits."""
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.explore import explore_data
from kvlab.checkpoints import load_model_input
from kvlab.workflow import load_tokenizer_input, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)
    p = snakemake.params
    data = explore_data(read_json(snakemake.input.steps_opened), model, tokenizer, prompt["ids"], p.prefix,
                        p.sharp_prefix, p.bars, device)
    write_json_atomic(snakemake.output.explore_steps, data)


run(snakemake, main)
