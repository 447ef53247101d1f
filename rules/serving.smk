# Beyond the lab sheet, the serving half: many requests at once (llama-batched-bench's table) and what
# the way a server reserves the cache does to how many requests fit. Knobs: config["extras"].

if EXTRAS["batch"]["prompt_tokens"] > config["lab"]["prompt"]["cut_tokens"] + 1:
    stop(
        f"config key 'extras.batch.prompt_tokens': {EXTRAS['batch']['prompt_tokens']} is longer than "
        f"the lab's prompt (lab.prompt.cut_tokens + 1 = {config['lab']['prompt']['cut_tokens'] + 1})"
    )


rule batch:
    input:
        unpack(tokenizer_inputs),
        **checkpoint_inputs("pretrain"),
        prompt=LAB_DETAILS["prompt"],
        val_data=input_path("val_data"),
    output:
        batch=report(
            EXTRA_RESULTS["batch"],
            caption="../report/batch.rst",
            category="Beyond the lab",
            subcategory="Batching",
        ),
        runs=EXTRA_DETAILS["batch_runs"],
    log:
        "results/logs/batch.log",
    benchmark:
        "results/benchmarks/batch.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **model_params(),
        **timing_params(),
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
        unpack(tokenizer_inputs),
        **checkpoint_inputs("pretrain"),
        val_data=input_path("val_data"),
    output:
        kv_waste=report(
            EXTRA_RESULTS["kv_waste"],
            caption="../report/kv_waste.rst",
            category="Beyond the lab",
            subcategory="KV reservation",
        ),
        requests=EXTRA_DETAILS["kv_waste_requests"],
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
