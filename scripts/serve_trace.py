"""Continuous batching against static on a seeded trace: the exact counts, the cache beside kv_waste's
policies, the timed ratios, every request's events and the timeline's data (kvlab.measure.serving_trace)."""
from kvlab.checkpoints import load_model_input
from kvlab.engine.data import read_texts
from kvlab.facts.serving import ServingSettings
from kvlab.engine.device import dtype_name
from kvlab.io import read_json, write_csv_atomic, write_json_atomic, write_jsonl_atomic
from kvlab.measure import serving_trace
from kvlab.measure.prompt import document_prompts
from kvlab.measure.steps import use_threads
from kvlab.workflow import load_tokenizer_input, run


def main(snakemake):
    p = snakemake.params
    settings = ServingSettings.of(p.serving)
    model, device = load_model_input(snakemake, "pretrain")
    tokenizer = load_tokenizer_input(snakemake)
    count = max(settings.requests, settings.prefix_requests, settings.parallel_requests)
    prompts = document_prompts(tokenizer, read_texts(snakemake.input.val_data), count, settings.prompt_cap,
                               source=snakemake.input.val_data, key="extras.serving.requests")
    system_prompt = read_json(snakemake.input.prompt)["ids"]
    bytes_per_token = model.config.kv_bytes_per_token(dtype_name(next(model.parameters()).dtype))
    use_threads(p.threads)
    found = serving_trace.measure(model, prompts, system_prompt, settings, bytes_per_token)
    out = snakemake.output
    write_jsonl_atomic(out.serve_events, found["events"])
    write_json_atomic(out.serve_trace, found["detail"])
    write_csv_atomic(out.serve_memory, found["memory"])
    write_csv_atomic(out.serve_timing, found["timing"])
    write_csv_atomic(out.serve_counts, found["counts"])


run(snakemake, main)
