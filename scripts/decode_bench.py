"""Decoding path against path on the lab's pretrained model and prompt: results/decode_bench.csv (one row a
path and length) and results/decode_bench.json (every run, the arithmetic limit, the speedups)."""
from kvlab.checkpoints import load_model_input
from kvlab.io import read_json, write_csv_atomic, write_json_atomic
from kvlab.measure.decode_bench import decode_bench, minimind_model_for
from kvlab.workflow import log, run


def main(snakemake):
    p = snakemake.params
    model, device = load_model_input(snakemake, "pretrain")
    minimind = None
    if "minimind_src" in snakemake.input.keys():
        minimind = minimind_model_for(model, snakemake.input.pretrain, snakemake.input.minimind_src)
    result = decode_bench(model, read_json(snakemake.input.prompt)["ids"], p.new_tokens, runs=p.runs,
                          warmup=p.warmup, max_seconds=p.max_seconds, device=device, minimind_model=minimind,
                          compile_mode=p.compile_mode, threads=p.threads)
    for row in result["rows"]:
        log.info("%-9s N=%-5d %.3f ms/token (%.3f-%.3f), same tokens as cat: %s", row["path"], row["new_tokens"],
                 row["ms_per_token"], row["q1_ms"], row["q3_ms"], row["same_tokens_as_cat"])
    write_json_atomic(snakemake.output.decode_bench_runs, result)
    write_csv_atomic(snakemake.output.decode_bench, [{"prompt_len": result["prompt_len"], **{
        key: value for key, value in row.items() if key != "samples_s"}} for row in result["rows"]])


run(snakemake, main)
