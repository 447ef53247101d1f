"""Steps 1-2: greedy with and without the cache, opened step by step; same tokens? how many tokens fed?"""
from kvlab.io import read_json, write_json_atomic
from kvlab.measure.steps import generation_opened, opened_same_and_count
from kvlab.checkpoints import load_model_input
from kvlab.workflow import log, run


def main(snakemake):
    model, device = load_model_input(snakemake, "pretrain")
    prompt = read_json(snakemake.input.prompt)
    opened = generation_opened(model, prompt["ids"], snakemake.params.new_tokens, device)
    same, count = opened_same_and_count(opened)
    log.info("same_ids %s; fed %d with cache, %d without", same["same_ids"], count["fed_with_cache"], count["fed_without_cache"])
    write_json_atomic(snakemake.output.steps_opened, opened)
    write_json_atomic(snakemake.output.same, same)
    write_json_atomic(snakemake.output.counts, count)


run(snakemake, main)
