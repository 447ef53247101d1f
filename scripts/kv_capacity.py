"""KV capacity: bytes per token (formula and measured) and requests per memory budget."""
from kvlab.measure.capacity import kv_capacity
from kvlab.io import write_csv_atomic
from kvlab.checkpoints import load_model_input
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    p = snakemake.params
    rows = kv_capacity(model, p.architectures, p.dtypes, p.contexts, p.budgets_gib, p.tokens, p.seed, device)
    for row in rows:
        log.info("%s %s, %s GiB: %s", row["model"], row["dtype"], row["budget_gib"], row["vllm_line"])
    write_csv_atomic(snakemake.output.kv_capacity, rows)


run(snakemake, main)
