"""Latency split: every forward call of the lab's timed generation, both modes; TTFT, TPOT, a fit."""
from kvlab.facts.budget import Budget
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.curves import step_latency
from kvlab.measure.steps import use_threads
from kvlab.checkpoints import load_model_input
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)
    p = snakemake.params
    use_threads(p.threads)
    result = step_latency(model, prompt["ids"], p.new_tokens, p.warmup, p.repeats, p.max_seconds, device,
                          Budget(getattr(p, "budget_s", None)))
    fit = result["fit"]
    log.info("TTFT %.2f / %.2f ms, TPOT %.3f / %.3f ms (with / without cache)",
             result["with_cache"]["ttft_s"] * 1e3, result["without_cache"]["ttft_s"] * 1e3,
             result["with_cache"]["tpot_s"] * 1e3, result["without_cache"]["tpot_s"] * 1e3)
    log.info("fit: %.3f ms + %.3f us x fed (R2 %.3f); predicted speedup %.2f", fit["fixed_s"] * 1e3,
             fit["per_token_s"] * 1e6, fit["r2"], result["predicted"]["speedup"])
    write_json_atomic(snakemake.output.latency, result)


run(snakemake, main)
