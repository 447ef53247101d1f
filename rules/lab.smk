# The lab sheet's steps 1-6: one rule per step, each writing the file a grader reads.


rule prompt:
    input:
        **inputs("tokenizer", "val_data"),
    output:
        prompt=RESULTS["prompt"].path,
    log:
        "results/logs/prompt.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        n_docs=config["lab"]["prompt"]["n_docs"],
        cut_tokens=config["lab"]["prompt"]["cut_tokens"],
    script:
        "../scripts/prompt.py"


rule model_card:
    input:
        **inputs("tokenizer", "pretrain", "sft", "prompt"),
    output:
        model_card=RESULTS["model_card"].path,
    log:
        "results/logs/model_card.log",
    threads: 1
    resources:
        **model_job("pretrain", "sft"),
    params:
        **model_params(),
    script:
        "../scripts/model_card.py"


rule same:
    input:
        **inputs("pretrain", "prompt"),
    output:
        same=reported("same"),
        counts=reported("counts"),
        # the same generation opened step by step, for the lab's page (explore_steps)
        steps_opened=RESULTS["steps_opened"].path,
    log:
        "results/logs/same.log",
    threads: 1
    resources:
        **model_job("pretrain"),
    params:
        **model_params(),
        new_tokens=config["lab"]["same"]["new_tokens"],
    script:
        "../scripts/same.py"


rule timing:
    input:
        **inputs("pretrain", "prompt"),
    output:
        time=reported("time"),
        time_runs=RESULTS["time_runs"].path,
    log:
        "results/logs/timing.log",
    benchmark:
        "results/benchmarks/timing.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        new_tokens=config["lab"]["time"]["new_tokens"],
        warmup=config["lab"]["time"]["warmup"],
        repeats=config["lab"]["time"]["repeats"],
    script:
        "../scripts/timing.py"


rule kvbytes:
    input:
        **inputs("pretrain"),
    output:
        kvbytes=reported("kvbytes"),
    log:
        "results/logs/kvbytes.log",
    threads: 1
    resources:
        **model_job("pretrain"),
    params:
        **model_params(),
        tokens=config["lab"]["kvbytes"]["tokens"],
        seed=config["lab"]["kvbytes"]["seed"],
    script:
        "../scripts/kvbytes.py"


rule temp:
    input:
        **inputs("tokenizer", "sft"),
    output:
        temp=reported("temp"),
        temp_answers=RESULTS["temp_answers"].path,
    log:
        "results/logs/temp.log",
    threads: 1
    resources:
        **model_job("sft"),
    params:
        **model_params(),
        question=config["lab"]["temp"]["question"],
        temperatures=config["lab"]["temp"]["temperatures"],
        samples=config["lab"]["temp"]["samples"],
        max_new_tokens=config["lab"]["temp"]["max_new_tokens"],
        seed=config["lab"]["temp"]["seed"],
    script:
        "../scripts/temp.py"


rule topp:
    input:
        **inputs("tokenizer", "pretrain"),
    output:
        topp=reported("topp"),
        topp_sharp=RESULTS["topp_sharp"].path,
    log:
        "results/logs/topp.log",
    threads: 1
    resources:
        **model_job("pretrain"),
    params:
        **model_params(),
        prefix=config["lab"]["topp"]["prefix"],
        sharp_prefix=config["lab"]["topp"]["sharp_prefix"],
        ps=config["lab"]["topp"]["ps"],
    script:
        "../scripts/topp.py"
