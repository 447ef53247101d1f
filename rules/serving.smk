# Beyond the lab sheet, the serving half: many requests at once (llama-batched-bench's table) and what
# the way a server reserves the cache does to how many requests fit. Knobs: config["extras"].


rule batch:
    input:
        **inputs("tokenizer", "pretrain", "prompt", "val_data"),
    output:
        batch=reported("batch"),
        batch_runs=RESULTS["batch_runs"].path,
    log:
        "results/logs/batch.log",
    benchmark:
        "results/benchmarks/batch.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        prompt_tokens=EXTRAS["batch"]["prompt_tokens"],
        new_tokens=EXTRAS["batch"]["new_tokens"],
        sizes=EXTRAS["batch"]["sizes"],
        warmup=EXTRAS["batch"]["warmup"],
        repeats=EXTRAS["batch"]["repeats"],
        memory_limit_gib=EXTRAS["batch"]["memory_limit_gib"],
    script:
        "../scripts/batch.py"


rule kv_waste:
    input:
        **inputs("tokenizer", "pretrain", "val_data"),
    output:
        kv_waste=reported("kv_waste"),
        kv_waste_requests=RESULTS["kv_waste_requests"].path,
    log:
        "results/logs/kv_waste.log",
    benchmark:
        "results/benchmarks/kv_waste.tsv"
    threads: 1
    resources:
        **model_job("pretrain"),
    params:
        **model_params(),
        **EXTRAS["kv_waste"],
        # the capacity table's budgets
        budgets_gib=EXTRAS["capacity"]["budgets_gib"],
    script:
        "../scripts/kv_waste.py"
