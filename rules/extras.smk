# Beyond the lab sheet: the lab's measurements as curves, the cache as serving capacity,
# the report's figures, and a self-check of a results folder. Knobs: config["extras"].

from kvlab.lab.check import LAB_FILES

EXTRAS = config["extras"]

EXTRA_RESULTS = [
    "results/sweep.csv",
    "results/latency.json",
    "results/kv_capacity.csv",
    "results/topp_curve.csv",
    "results/temp_curve.csv",
]
FIGURES = {
    "cost_curves": "results/figures/cost_curves.png",
    "step_times": "results/figures/step_times.png",
    "topp_survivors": "results/figures/topp_survivors.png",
    "temperature_effect": "results/figures/temperature_effect.png",
}
# `check` grades kvlab.lab.check.LAB_FILES in the folder extras.check.results_dir names:
# a student's is read as it is; the default, "results", makes it wait for this build.
CHECKED_FOLDER = Path(EXTRAS["check"]["results_dir"]).expanduser()
if (
    CHECKED_FOLDER.resolve() != Path("results").resolve()
    and not CHECKED_FOLDER.is_dir()
):
    stop(f"config key 'extras.check.results_dir': folder not found: {CHECKED_FOLDER}")


rule sweep:
    input:
        prompt="results/prompt.json",
        pretrain=input_path("pretrain"),
    output:
        sweep=report(
            "results/sweep.csv",
            caption="../report/sweep.rst",
            category="Beyond the lab",
            subcategory="Cost curves",
        ),
    log:
        "results/logs/sweep.log",
    benchmark:
        "results/benchmarks/sweep.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        # every N: the counted pair, the warm-ups, the timed runs (at most `repeats`)
        **model_job(
            "pretrain",
            sum(
                (
                    cost.greedy_pair(
                        PROMPT_LEN,
                        new_tokens,
                        runs=1
                        + EXTRAS["sweep"]["warmup"]
                        + max(
                            EXTRAS["sweep"]["repeats"], EXTRAS["sweep"]["long_repeats"]
                        ),
                    )
                    for new_tokens in EXTRAS["sweep"]["new_tokens"]
                ),
                cost.Work(),
            ),
            timed=True,
        ),
    params:
        **model_params(),
        new_tokens=EXTRAS["sweep"]["new_tokens"],
        warmup=EXTRAS["sweep"]["warmup"],
        repeats=EXTRAS["sweep"]["repeats"],
        long_from=EXTRAS["sweep"]["long_from"],
        long_repeats=EXTRAS["sweep"]["long_repeats"],
    script:
        "../scripts/sweep.py"


rule latency:
    input:
        prompt="results/prompt.json",
        pretrain=input_path("pretrain"),
    output:
        latency=report(
            "results/latency.json",
            caption="../report/latency.rst",
            category="Beyond the lab",
            subcategory="Latency split",
        ),
    log:
        "results/logs/latency.log",
    benchmark:
        "results/benchmarks/latency.tsv"
    threads: all_cores
    resources:
        **model_job(
            "pretrain",
            cost.greedy_pair(
                PROMPT_LEN,
                config["lab"]["time"]["new_tokens"],
                runs=EXTRAS["latency"]["warmup"] + EXTRAS["latency"]["repeats"],
            ),
            timed=True,
        ),
    params:
        **model_params(),
        # the lab's timed generation (step 3), so the prediction compares with time.json
        new_tokens=config["lab"]["time"]["new_tokens"],
        warmup=EXTRAS["latency"]["warmup"],
        repeats=EXTRAS["latency"]["repeats"],
    script:
        "../scripts/latency.py"


rule kv_capacity:
    input:
        pretrain=input_path("pretrain"),
    output:
        capacity=report(
            "results/kv_capacity.csv",
            caption="../report/kv_capacity.rst",
            category="Beyond the lab",
            subcategory="KV capacity",
        ),
    log:
        "results/logs/kv_capacity.log",
    benchmark:
        "results/benchmarks/kv_capacity.tsv"
    threads: 1
    resources:
        # a cache weighed for the lab's model and each architecture, in each dtype
        **model_job(
            "pretrain",
            cost.forward(
                EXTRAS["capacity"]["measure_tokens"],
                calls=(1 + len(EXTRAS["capacity"]["architectures"]))
                * len(EXTRAS["capacity"]["dtypes"]),
            ),
            extra_params=max(
                [
                    cost.architecture_params(a)
                    for a in EXTRAS["capacity"]["architectures"]
                ],
                default=0,
            ),
        ),
    params:
        **model_params(),
        architectures=EXTRAS["capacity"]["architectures"],
        dtypes=EXTRAS["capacity"]["dtypes"],
        contexts=EXTRAS["capacity"]["contexts"],
        budgets_gib=EXTRAS["capacity"]["budgets_gib"],
        tokens=EXTRAS["capacity"]["measure_tokens"],
        seed=config["lab"]["kvbytes"]["seed"],
    script:
        "../scripts/kv_capacity.py"


rule topp_curve:
    input:
        unpack(tokenizer_inputs),
        pretrain=input_path("pretrain"),
    output:
        curve=report(
            "results/topp_curve.csv",
            caption="../report/topp_curve.rst",
            category="Beyond the lab",
            subcategory="Top-p curve",
        ),
    log:
        "results/logs/topp_curve.log",
    benchmark:
        "results/benchmarks/topp_curve.tsv"
    threads: 1
    resources:
        **model_job("pretrain", TOPP_FORWARDS),
    params:
        **model_params(),
        prefix=config["lab"]["topp"]["prefix"],
        sharp_prefix=config["lab"]["topp"]["sharp_prefix"],
        lab_ps=config["lab"]["topp"]["ps"],
        step=EXTRAS["topp_curve"]["step"],
    script:
        "../scripts/topp_curve.py"


rule temp_curve:
    input:
        unpack(tokenizer_inputs),
        sft=input_path("sft"),
    output:
        curve=report(
            "results/temp_curve.csv",
            caption="../report/temp_curve.rst",
            category="Beyond the lab",
            subcategory="Temperature curve",
        ),
        answers="results/temp_curve_answers.json",
    log:
        "results/logs/temp_curve.log",
    benchmark:
        "results/benchmarks/temp_curve.tsv"
    threads: 1
    resources:
        **model_job(
            "sft",
            cost.sampled(
                cost.chat_len_bound(config["lab"]["temp"]["question"]),
                config["lab"]["temp"]["max_new_tokens"],
                config["lab"]["temp"]["samples"],
                runs=cost.grid_count_bound(
                    EXTRAS["temp_curve"]["min"],
                    EXTRAS["temp_curve"]["max"],
                    EXTRAS["temp_curve"]["step"],
                ),
            ),
        ),
    params:
        **model_params(),
        question=config["lab"]["temp"]["question"],
        samples=config["lab"]["temp"]["samples"],
        max_new_tokens=config["lab"]["temp"]["max_new_tokens"],
        seed=config["lab"]["temp"]["seed"],
        t_min=EXTRAS["temp_curve"]["min"],
        t_max=EXTRAS["temp_curve"]["max"],
        t_step=EXTRAS["temp_curve"]["step"],
    script:
        "../scripts/temp_curve.py"


# One rule per figure: redrawing a figure never reruns the measurement behind it.


rule figure_cost_curves:
    input:
        data="results/sweep.csv",
    output:
        figure=report(
            FIGURES["cost_curves"],
            caption="../report/fig_cost_curves.rst",
            category="Beyond the lab",
            subcategory="Cost curves",
        ),
    log:
        "results/logs/figure_cost_curves.log",
    threads: 1
    resources:
        **light_job(reads=("data",)),
    params:
        kind="cost_curves",
        language=config["report"]["language"],
    script:
        "../scripts/figure.py"


rule figure_step_times:
    input:
        data="results/latency.json",
    output:
        figure=report(
            FIGURES["step_times"],
            caption="../report/fig_step_times.rst",
            category="Beyond the lab",
            subcategory="Latency split",
        ),
    log:
        "results/logs/figure_step_times.log",
    threads: 1
    resources:
        **light_job(reads=("data",)),
    params:
        kind="step_times",
        language=config["report"]["language"],
    script:
        "../scripts/figure.py"


rule figure_topp_survivors:
    input:
        data="results/topp_curve.csv",
    output:
        figure=report(
            FIGURES["topp_survivors"],
            caption="../report/fig_topp_survivors.rst",
            category="Beyond the lab",
            subcategory="Top-p curve",
        ),
    log:
        "results/logs/figure_topp_survivors.log",
    threads: 1
    resources:
        **light_job(reads=("data",)),
    params:
        kind="topp_survivors",
        language=config["report"]["language"],
    script:
        "../scripts/figure.py"


rule figure_temperature_effect:
    input:
        data="results/temp_curve.csv",
    output:
        figure=report(
            FIGURES["temperature_effect"],
            caption="../report/fig_temperature_effect.rst",
            category="Beyond the lab",
            subcategory="Temperature curve",
        ),
    log:
        "results/logs/figure_temperature_effect.log",
    threads: 1
    resources:
        **light_job(reads=("data",)),
    params:
        kind="temperature_effect",
        language=config["report"]["language"],
    script:
        "../scripts/figure.py"


rule check:
    input:
        checked=[str(CHECKED_FOLDER / name) for name in LAB_FILES],
    output:
        check="results/check.json",
    log:
        table="results/logs/check.log",
        verdicts="results/logs/check.json",
    threads: 1
    resources:
        **light_job(),
    params:
        results_dir=lambda wildcards, input: str(Path(input.checked[0]).parent),
        temperatures=config["lab"]["temp"]["temperatures"],
        samples=config["lab"]["temp"]["samples"],
        ps=config["lab"]["topp"]["ps"],
    script:
        "../scripts/check.py"
