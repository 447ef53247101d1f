"""The cache in fewer bits: what each dtype saves and changes, on the lab's model (kvlab.measure.kv_dtype)."""
from kvlab.checkpoints import load_model_input
from kvlab.engine.data import read_texts
from kvlab.facts.compare import architecture_config
from kvlab.facts.serving import ServingSettings
from kvlab.io import read_json, write_csv_atomic
from kvlab.measure import kv_dtype, steps
from kvlab.measure.prompt import document_prompts
from kvlab.measure.serving_workloads import main_trace
from kvlab.workflow import load_tokenizer_input, run


def main(snakemake):
    p = snakemake.params
    model, device = load_model_input(snakemake, "pretrain")
    tokenizer = load_tokenizer_input(snakemake)
    serving = ServingSettings.of(p.serving)
    prompts = document_prompts(tokenizer, read_texts(snakemake.input.val_data), serving.requests, serving.prompt_cap,
                               source=snakemake.input.val_data, key="extras.serving.requests")
    trace = main_trace(prompts, serving, None)  # every request at once: the pool decides how many run
    prefixes = [steps.prefix_ids(tokenizer, p.topp[key]) for key in ("prefix", "sharp_prefix")]
    minimind = architecture_config({key: value for key, value in p.minimind.items() if key != "name"})
    settings = {**p.settings, "tokens": p.tokens, "seed": p.seed, "lab_new_tokens": p.lab_new_tokens,
                "budget_gib": p.budget_gib, "minimind_name": p.minimind["name"], "block_size": serving.block_size,
                "max_batched_tokens": serving.max_batched_tokens}
    steps.use_threads(p.threads)
    rows = kv_dtype.measure(model, read_json(snakemake.input.prompt)["ids"], prefixes, p.topp["ps"], settings, trace,
                            minimind, device)
    write_csv_atomic(snakemake.output.kv_dtype, rows)


run(snakemake, main)
