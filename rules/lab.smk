# The lab sheet's steps 1-6: one rule per step, each writing the file a grader reads.

# Step 6 (and its curve): one forward call after each prefix, bos in front.
TOPP_FORWARDS = cost.forward(
    1
    + max(
        cost.text_tokens_bound(config["lab"]["topp"][key])
        for key in ("prefix", "sharp_prefix")
    ),
    calls=2,
)


rule prompt:
    input:
        unpack(tokenizer_inputs),
        val_data=input_path("val_data"),
    output:
        prompt="results/prompt.json",
    log:
        "results/logs/prompt.log",
    threads: 1
    resources:
        **light_job(reads=("val_data", "tokenizer")),
    params:
        n_docs=config["lab"]["prompt"]["n_docs"],
        cut_tokens=config["lab"]["prompt"]["cut_tokens"],
    script:
        "../scripts/prompt.py"


rule model_card:
    input:
        unpack(tokenizer_inputs),
        prompt="results/prompt.json",
        pretrain=input_path("pretrain"),
        sft=input_path("sft"),
    output:
        card="results/model_card.json",
    log:
        "results/logs/model_card.log",
    threads: 1
    resources:
        # the prompt's perplexity under each model
        **model_job(("pretrain", "sft"), cost.forward(PROMPT_LEN, calls=2)),
    params:
        **model_params(),
        head_counts=HEAD_COUNTS,
    script:
        "../scripts/model_card.py"


rule same:
    input:
        prompt="results/prompt.json",
        pretrain=input_path("pretrain"),
    output:
        same=report(
            "results/same.json",
            caption="../report/same.rst",
            category="Lab sheet",
        ),
        fed=report(
            "results/count.json",
            caption="../report/count.rst",
            category="Lab sheet",
        ),
    log:
        "results/logs/same.log",
    threads: 1
    resources:
        **model_job(
            "pretrain",
            cost.greedy_pair(PROMPT_LEN, config["lab"]["same"]["new_tokens"]),
        ),
    params:
        **model_params(),
        new_tokens=config["lab"]["same"]["new_tokens"],
    script:
        "../scripts/same.py"


rule timing:
    input:
        prompt="results/prompt.json",
        pretrain=input_path("pretrain"),
    output:
        time=report(
            "results/time.json",
            caption="../report/time.rst",
            category="Lab sheet",
        ),
        runs="results/time_runs.json",
    log:
        "results/logs/timing.log",
    benchmark:
        "results/benchmarks/timing.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job(
            "pretrain",
            cost.greedy_pair(
                PROMPT_LEN,
                config["lab"]["time"]["new_tokens"],
                runs=config["lab"]["time"]["warmup"]
                + config["lab"]["time"]["repeats"],
            ),
            timed=True,
        ),
    params:
        **model_params(),
        new_tokens=config["lab"]["time"]["new_tokens"],
        warmup=config["lab"]["time"]["warmup"],
        repeats=config["lab"]["time"]["repeats"],
    script:
        "../scripts/timing.py"


rule kvbytes:
    input:
        pretrain=input_path("pretrain"),
    output:
        kvbytes=report(
            "results/kvbytes.json",
            caption="../report/kvbytes.rst",
            category="Lab sheet",
        ),
    log:
        "results/logs/kvbytes.log",
    threads: 1
    resources:
        **model_job("pretrain", cost.forward(config["lab"]["kvbytes"]["tokens"])),
    params:
        **model_params(),
        tokens=config["lab"]["kvbytes"]["tokens"],
        seed=config["lab"]["kvbytes"]["seed"],
    script:
        "../scripts/kvbytes.py"


rule temp:
    input:
        unpack(tokenizer_inputs),
        sft=input_path("sft"),
    output:
        temp=report(
            "results/temp.json",
            caption="../report/temp.rst",
            category="Lab sheet",
        ),
        answers="results/temp_answers.json",
    log:
        "results/logs/temp.log",
    threads: 1
    resources:
        **model_job(
            "sft",
            cost.sampled(
                cost.chat_len_bound(config["lab"]["temp"]["question"]),
                config["lab"]["temp"]["max_new_tokens"],
                config["lab"]["temp"]["samples"],
                runs=len(config["lab"]["temp"]["temperatures"]),
            ),
        ),
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
        pretrain=input_path("pretrain"),
    output:
        topp=report(
            "results/topp.json",
            caption="../report/topp.rst",
            category="Lab sheet",
        ),
        sharp="results/topp_sharp.json",
    log:
        "results/logs/topp.log",
    threads: 1
    resources:
        **model_job("pretrain", TOPP_FORWARDS),
    params:
        **model_params(),
        prefix=config["lab"]["topp"]["prefix"],
        sharp_prefix=config["lab"]["topp"]["sharp_prefix"],
        ps=config["lab"]["topp"]["ps"],
    script:
        "../scripts/topp.py"
