"""Many requests at once: llama-batched-bench's table for the lab's model, both modes, every B."""
from kvlab.checkpoints import load_model_input
from kvlab.engine.data import read_texts
from kvlab.facts.budget import Budget
from kvlab.io import read_json, write_csv_atomic, write_json_atomic
from kvlab.measure.batch import batch_bench
from kvlab.measure.prompt import document_prompts
from kvlab.measure.steps import use_threads
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    p = snakemake.params
    model, device = load_model_input(snakemake, "pretrain")
    tokenizer = load_tokenizer_input(snakemake)
    shared = read_json(snakemake.input.prompt)["ids"][: p.prompt_tokens]
    distinct = document_prompts(tokenizer, read_texts(snakemake.input.val_data), max(p.sizes), p.prompt_tokens,
                                source=snakemake.input.val_data, key="extras.batch.sizes")
    use_threads(p.threads)
    rows, runs = batch_bench(model, shared, distinct, p.new_tokens, p.sizes, p.warmup, p.repeats, p.max_seconds,
                             p.memory_limit_gib, device, Budget(p.budget_s))
    differing = [f"{row['mode']} B={row['B']}" for row in rows if not row["same_as_single"]]
    log.info("greedy rows equal to their prompt alone: %s", "all" if not differing else f"not in {differing}")
    write_json_atomic(snakemake.output.batch_runs, runs)
    write_csv_atomic(snakemake.output.batch, rows)


run(snakemake, main)
