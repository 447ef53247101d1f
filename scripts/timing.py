"""Step 3: median generation time with and without the cache, after warm-up."""
from kvlab.io import read_json, write_json_atomic
from kvlab.lab.steps import time_generation
from kvlab.checkpoints import load_model_input
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)
    p = snakemake.params
    result, raw = time_generation(model, prompt["ids"], p.new_tokens, p.warmup, p.repeats, device)
    log.info("runs: %s", raw["runs_s"])
    write_json_atomic(snakemake.output.runs, raw)
    write_json_atomic(snakemake.output.time, result)


run(snakemake, main)
