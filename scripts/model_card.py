"""What the lab ran on: architectures with the source of each field, the prompt's perplexity."""
from kvlab.checkpoints import load_inspected
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.model_card import model_card
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    tokenizer = load_tokenizer_input(snakemake)
    p = snakemake.params
    models, head_counts = {}, {}
    for name in ("pretrain", "sft"):
        inspection = read_json(snakemake.input[f"{name}_inspected"])
        models[name] = (snakemake.input[name], load_inspected(snakemake.input[name], inspection, p.device, p.dtype)[0])
        head_counts[name] = inspection["head_count"]
    prompt = read_json(snakemake.input.prompt)
    card = model_card(models, tokenizer, prompt["ids"], head_counts)
    for warning in card["warnings"]:
        log.warning("WARNING: %s", warning)
    log.info("prompt perplexity %.2f over %d tokens", card["prompt_perplexity"]["perplexity"], len(prompt["ids"]))
    write_json_atomic(snakemake.output.model_card, card)


run(snakemake, main)
