"""Step 3: median generation time with and without the cache, after warm-up."""
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.steps import time_generation, use_threads
from kvlab.checkpoints import load_model_input
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)
    p = snakemake.params
    use_threads(p.threads)
    result, raw = time_generation(model, prompt["ids"], p.new_tokens, p.warmup, p.repeats, p.max_seconds, device)
    for label, summary in raw["summary"].items():
        log.info("%s: %d runs %s, median %.4f s, IQR/median %.1f%%%s; CPU %.0f%% of the wall time, %.0f involuntary "
                 "switches/s%s", label, summary["n"], raw["runs_s"][label], summary["median_s"],
                 100 * summary["iqr_share"], " (unstable)" if summary["unstable"] else "", 100 * summary["cpu_share"],
                 summary["switches_per_s"], " (contended)" if summary["contended"] else "")
    write_json_atomic(snakemake.output.time_runs, raw)
    write_json_atomic(snakemake.output.time, result)


run(snakemake, main)
