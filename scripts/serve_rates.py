"""Latency against the request rate, static and continuous, at fractions of the measured saturation
throughput (kvlab.measure.serving_rates.rate_sweep)."""
from kvlab.checkpoints import load_model_input
from kvlab.engine.data import read_texts
from kvlab.facts.serving import ServingSettings
from kvlab.io import write_csv_atomic, write_json_atomic
from kvlab.measure import serving_rates
from kvlab.measure.prompt import document_prompts
from kvlab.measure.steps import use_threads
from kvlab.workflow import load_tokenizer_input, run


def main(snakemake):
    p = snakemake.params
    settings = ServingSettings.of(p.serving)
    model, device = load_model_input(snakemake, "pretrain")
    tokenizer = load_tokenizer_input(snakemake)
    prompts = document_prompts(tokenizer, read_texts(snakemake.input.val_data), settings.requests,
                               settings.prompt_cap, source=snakemake.input.val_data, key="extras.serving.requests")
    use_threads(p.threads)
    rows, runs = serving_rates.rate_sweep(model, prompts, settings)
    write_json_atomic(snakemake.output.serve_rates_runs, runs)
    write_csv_atomic(snakemake.output.serve_rates, rows)


run(snakemake, main)
