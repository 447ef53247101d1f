"""Step 4: the cache's bytes after feeding random tokens, against the formula."""
from kvlab.io import write_json_atomic
from kvlab.measure.steps import measure_kv_bytes
from kvlab.checkpoints import load_model_input
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    result = measure_kv_bytes(model, snakemake.params.tokens, snakemake.params.seed, device)
    log.info("%s", result)
    write_json_atomic(snakemake.output.kvbytes, result)


run(snakemake, main)
