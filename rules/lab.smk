# The lab sheet's steps 1-6: one rule per step, each writing the file a grader reads.


rule prompt:
    input:
        unpack(tokenizer_inputs),
        val_data=input_path("val_data"),
    output:
        prompt=LAB_DETAILS["prompt"],
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
        unpack(tokenizer_inputs),
        **checkpoint_inputs("pretrain", "sft"),
        prompt=LAB_DETAILS["prompt"],
    output:
        card=LAB_DETAILS["model_card"],
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
        **checkpoint_inputs("pretrain"),
        prompt=LAB_DETAILS["prompt"],
    output:
        same=report(
            LAB_RESULTS["same"],
            caption="../report/same.rst",
            category="Lab sheet",
        ),
        counts=report(
            LAB_RESULTS["counts"],
            caption="../report/count.rst",
            category="Lab sheet",
        ),
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
        **checkpoint_inputs("pretrain"),
        prompt=LAB_DETAILS["prompt"],
    output:
        time=report(
            LAB_RESULTS["time"],
            caption="../report/time.rst",
            category="Lab sheet",
        ),
        runs=LAB_DETAILS["time_runs"],
    log:
        "results/logs/timing.log",
    benchmark:
        "results/benchmarks/timing.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **model_params(),
        **timing_params(),
        new_tokens=config["lab"]["time"]["new_tokens"],
        warmup=config["lab"]["time"]["warmup"],
        repeats=config["lab"]["time"]["repeats"],
    script:
        "../scripts/timing.py"


rule kvbytes:
    input:
        **checkpoint_inputs("pretrain"),
    output:
        kvbytes=report(
            LAB_RESULTS["kvbytes"],
            caption="../report/kvbytes.rst",
            category="Lab sheet",
        ),
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
        unpack(tokenizer_inputs),
        **checkpoint_inputs("sft"),
    output:
        temp=report(
            LAB_RESULTS["temp"],
            caption="../report/temp.rst",
            category="Lab sheet",
        ),
        answers=LAB_DETAILS["temp_answers"],
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
        unpack(tokenizer_inputs),
        **checkpoint_inputs("pretrain"),
    output:
        topp=report(
            LAB_RESULTS["topp"],
            caption="../report/topp.rst",
            category="Lab sheet",
        ),
        sharp=LAB_DETAILS["topp_sharp"],
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
