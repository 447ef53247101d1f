"""Four ways of reserving real requests' caches: bytes reserved, holding tokens, and requests that fit."""
from kvlab.checkpoints import load_model_input
from kvlab.facts.budget import Budget
from kvlab.engine.data import read_texts
from kvlab.io import write_csv_atomic, write_json_atomic
from kvlab.measure.kv_waste import kv_waste
from kvlab.measure.prompt import document_prompts
from kvlab.workflow import load_tokenizer_input, run


def main(snakemake):
    p = snakemake.params
    model, device = load_model_input(snakemake, "pretrain")
    tokenizer = load_tokenizer_input(snakemake)
    prompts = document_prompts(tokenizer, read_texts(snakemake.input.val_data), p.requests, p.prompt_cap,
                               share=p.prompt_share, source=snakemake.input.val_data, key="extras.kv_waste.requests")
    rows, requests = kv_waste(model, prompts, p.prompt_cap, p.answer_cap, p.temperature, p.top_p, p.seed,
                              tokenizer.eos_id, p.block_tokens, p.budgets_gib, device,
                              Budget(getattr(p, "budget_s", None)))
    write_json_atomic(snakemake.output.kv_waste_requests, requests)
    write_csv_atomic(snakemake.output.kv_waste, rows)


run(snakemake, main)
