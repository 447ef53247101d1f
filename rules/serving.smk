# Beyond the lab sheet, the serving half: many requests at once (llama-batched-bench's table), what
# the way a server reserves the cache does to how many requests fit, and continuous batching against
# static on one trace (kvlab.serving's engine). Knobs: config["extras"].


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
        budget_s=EXTRAS["batch"].get("budget_s"),
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


# Continuous batching against static on one seeded trace (kvlab.measure.serving_trace). Each rule is
# given the knobs it reads, so changing the rate sweep's reruns only serve_rates.
# (kvlab.facts.serving: RATE_SWEEP, TRACE_ONLY; ServingSettings, the settings typed, in the jobs)
SERVING = EXTRAS["serving"]


# The steps both serving jobs run, compiled once a build and kept on disk (kvlab.engine.aot): the two
# load them, so that compiling is this job's time alone, said once. Its threads are the timing's, for
# which the steps are compiled.
rule compile_steps:
    input:
        **inputs("tokenizer", "pretrain", "val_data"),
    output:
        compiled_steps=RESULTS["compiled_steps"].path,
    log:
        "results/logs/compile_steps.log",
    benchmark:
        "results/benchmarks/compile_steps.tsv"
    threads: all_cores
    resources:
        **model_job("pretrain"),
    params:
        **timed_params(),
        serving=serving_settings.without(SERVING, serving_settings.RATE_SWEEP),
    script:
        "../scripts/compile_steps.py"


rule serve_trace:
    input:
        **inputs("tokenizer", "pretrain", "prompt", "val_data", "compiled_steps"),
    output:
        serve_counts=reported("serve_counts"),
        serve_memory=reported("serve_memory"),
        serve_timing=reported("serve_timing"),
        serve_trace=reported("serve_trace"),
        serve_events=RESULTS["serve_events"].path,
    log:
        "results/logs/serve_trace.log",
    benchmark:
        "results/benchmarks/serve_trace.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        serving=serving_settings.without(SERVING, serving_settings.RATE_SWEEP),
    script:
        "../scripts/serve_trace.py"


rule serve_rates:
    input:
        **inputs("tokenizer", "pretrain", "val_data", "compiled_steps"),
    output:
        serve_rates=reported("serve_rates"),
        serve_rates_runs=RESULTS["serve_rates_runs"].path,
    log:
        "results/logs/serve_rates.log",
    benchmark:
        "results/benchmarks/serve_rates.tsv"
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        serving=serving_settings.without(SERVING, serving_settings.TRACE_ONLY),
    script:
        "../scripts/serve_rates.py"


# The cache in fewer bits (kvlab.measure.kv_dtype): bytes and requests that fit against where the greedy
# tokens first change, per dtype, and the trace served from a pool of one memory budget at each. It
# times the serving, so it takes every core.
rule kv_dtype:
    input:
        **inputs("tokenizer", "pretrain", "prompt", "val_data"),
    output:
        kv_dtype=reported("kv_dtype"),
    log:
        "results/logs/kv_dtype.log",
    benchmark:
        "results/benchmarks/kv_dtype.tsv"
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        settings=EXTRAS["kv_dtype"],
        tokens=config["lab"]["kvbytes"]["tokens"],
        seed=config["lab"]["kvbytes"]["seed"],
        lab_new_tokens=config["lab"]["time"]["new_tokens"],
        topp=config["lab"]["topp"],
        budget_gib=EXTRAS["capacity"]["budgets_gib"][0],
        minimind=EXTRAS["capacity"]["architectures"][0],
        serving=serving_settings.without(SERVING, serving_settings.RATE_SWEEP),
    script:
        "../scripts/kv_dtype.py"
