"""Cost curves: the lab's steps 1-3 (fed tokens, same ids, median time) for every N in the sweep."""
from kvlab.facts.budget import Budget
from kvlab.io import read_json, write_csv_atomic, write_json_atomic
from kvlab.measure.curves import cost_sweep
from kvlab.measure.steps import use_threads
from kvlab.checkpoints import load_model_input
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)
    p = snakemake.params
    log.info("sweep over N=%s: %d warm-up, %d timed runs (%d from N=%s)", p.new_tokens, p.warmup, p.repeats,
             p.long_repeats, p.long_from)
    use_threads(p.threads)
    rows, runs = cost_sweep(model, prompt["ids"], p.new_tokens, p.warmup, p.repeats, p.long_from, p.long_repeats,
                            p.max_seconds, device, Budget(p.budget_s))
    write_json_atomic(snakemake.output.sweep_runs, runs)
    write_csv_atomic(snakemake.output.sweep, rows)


run(snakemake, main)
