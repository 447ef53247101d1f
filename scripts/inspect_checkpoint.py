"""A checkpoint as the lab will load it: layout, config and the source of every field, the head count
measured when nobody stated it, whether the tokenizer fits (kvlab.checkpoints.inspect_checkpoint)."""
from kvlab.checkpoints import inspect_checkpoint
from kvlab.io import write_json_atomic
from kvlab.workflow import load_tokenizer_input, log, run


def main(snakemake):
    p = snakemake.params
    inspection = inspect_checkpoint(
        snakemake.input.checkpoint, p.config_key, p.overrides, load_tokenizer_input(snakemake),
        snakemake.input.val_data, p.compared_as, p.built,
    )
    log.info("%s: %s layout, %d parameters, sources %s", snakemake.input.checkpoint, inspection["layout"],
             inspection["parameters"], inspection["sources"])
    if inspection["head_count"]:
        log.info("head count: %s", inspection["head_count"]["reason"])
    write_json_atomic(snakemake.output.inspection, inspection)


run(snakemake, main)
