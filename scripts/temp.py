"""Step 5: distinct SFT answers at each temperature."""
from kvlab.io import write_json_atomic
from kvlab.measure.steps import temperature_answers
from kvlab.checkpoints import load_model_input
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    model, device = load_model_input(snakemake, "sft")
    p = snakemake.params
    counts, side = temperature_answers(model, tokenizer, p.question, p.temperatures, p.samples, p.max_new_tokens, p.seed, device)
    log.info("distinct answers: %s", counts)
    write_json_atomic(snakemake.output.temp_answers, side)
    write_json_atomic(snakemake.output.temp, counts)


run(snakemake, main)
