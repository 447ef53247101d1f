# Beyond the lab sheet: `kvlab serve` (kvlab.server) measured as a client sees it, at rising request
# rates (kvlab.measure.serving_bench). Only when asked for (`rule all` does not build it: a few minutes):
#   snakemake --cores 2 results/figures/serve_bench.png
# Knobs: config["extras"]["serve_bench"].


rule serve_bench:
    input:
        **inputs("tokenizer", "sft", "val_data"),
    output:
        serve_bench=reported("serve_bench"),
        serve_bench_runs=RESULTS["serve_bench_runs"].path,
    log:
        "results/logs/serve_bench.log",
    benchmark:
        "results/benchmarks/serve_bench.tsv"
    # The server and its client time each other: no other job on the CPU. Every load run ends by count
    # and time, and all traffic stays on the loopback.
    threads: all_cores
    resources:
        **model_job("sft", timed=True),
    params:
        **model_params(),
        **EXTRAS["serve_bench"],
    script:
        "../scripts/serve_bench.py"
