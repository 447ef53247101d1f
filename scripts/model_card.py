"""What the lab ran on: architectures with the source of each field, the prompt's perplexity."""
from kvlab.io import read_json, write_json_atomic
from kvlab.lab.model_card import model_card
from kvlab.workflow import load_model_input, load_tokenizer_input, log, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    models = {key: (load_model_input(snakemake, key, tokenizer)[0], snakemake.input[key]) for key in ("pretrain", "sft")}
    prompt = read_json(snakemake.input.prompt)
    card = model_card(models, tokenizer, prompt["ids"], snakemake.params.head_counts)
    for warning in card["warnings"]:
        log.warning("WARNING: %s", warning)
    log.info("prompt perplexity %.2f over %d tokens", card["prompt_perplexity"]["perplexity"], len(prompt["ids"]))
    write_json_atomic(snakemake.output.card, card)


run(snakemake, main)
