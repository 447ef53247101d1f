# Beyond the lab sheet: the lab's measurements as curves (sweep, latency, topp_curve, temp_curve), a
# step opened (step_anatomy), decoding path against path (decode_bench, only when asked for), the
# cache as serving capacity (kv_capacity), and a self-check of a results folder (check).
# Knobs: config["extras"].
from kvlab.facts.sheet import HANDED_IN
from kvlab.grade.classroom import submitted_files

EXTRAS = config["extras"]


rule sweep:
    input:
        **inputs("pretrain", "prompt"),
    output:
        sweep=reported("sweep"),
        sweep_runs=RESULTS["sweep_runs"].path,
    log:
        "results/logs/sweep.log",
    benchmark:
        "results/benchmarks/sweep.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        new_tokens=EXTRAS["sweep"]["new_tokens"],
        warmup=EXTRAS["sweep"]["warmup"],
        repeats=EXTRAS["sweep"]["repeats"],
        long_from=EXTRAS["sweep"]["long_from"],
        long_repeats=EXTRAS["sweep"]["long_repeats"],
        budget_s=EXTRAS["sweep"].get("budget_s"),
    script:
        "../scripts/sweep.py"


rule latency:
    input:
        **inputs("pretrain", "prompt"),
    output:
        latency=reported("latency"),
    log:
        "results/logs/latency.log",
    benchmark:
        "results/benchmarks/latency.tsv"
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        # the lab's timed generation (step 3), so the report can set the two side by side
        new_tokens=config["lab"]["time"]["new_tokens"],
        warmup=EXTRAS["latency"]["warmup"],
        repeats=EXTRAS["latency"]["repeats"],
        budget_s=EXTRAS["latency"].get("budget_s"),
    script:
        "../scripts/latency.py"


# Where a step's time goes (a shrunk copy of the model for the fixed cost, torch.profiler for the
# computation) and MiniMind's torch.cat cache against one allocated once and written in place
# (kvlab.measure.anatomy); the lab's own steps keep MiniMind's cache.
rule step_anatomy:
    input:
        **inputs("pretrain", "prompt"),
    output:
        step_anatomy=reported("step_anatomy"),
    log:
        "results/logs/step_anatomy.log",
    benchmark:
        "results/benchmarks/step_anatomy.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        # the lab's timed generation (step 3): its last step is the one opened
        **EXTRAS["step_anatomy"],
        new_tokens=config["lab"]["time"]["new_tokens"],
    script:
        "../scripts/step_anatomy.py"


# Decoding path against path (kvlab.measure.decode_bench): MiniMind's torch.cat cache, a preallocated one,
# the compiled step and, with minimind_src, MiniMind's own generate. Only when asked for: compiling takes
# tens of seconds (snakemake --cores 2 results/figures/decode_bench.png).
rule decode_bench:
    input:
        **inputs("pretrain", "prompt", *(["minimind_src"] if WITH_FIDELITY else [])),
    output:
        decode_bench=reported("decode_bench"),
        decode_bench_runs=RESULTS["decode_bench_runs"].path,
    log:
        "results/logs/decode_bench.log",
    benchmark:
        "results/benchmarks/decode_bench.tsv"
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **model_job("pretrain", timed=True),
    params:
        **timed_params(),
        **EXTRAS["decode_bench"],
    script:
        "../scripts/decode_bench.py"


rule kv_capacity:
    input:
        **inputs("pretrain"),
    output:
        kv_capacity=reported("kv_capacity"),
    log:
        "results/logs/kv_capacity.log",
    benchmark:
        "results/benchmarks/kv_capacity.tsv"
    threads: 1
    resources:
        **model_job("pretrain"),
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
        **inputs("tokenizer", "pretrain"),
    output:
        topp_curve=reported("topp_curve"),
    log:
        "results/logs/topp_curve.log",
    benchmark:
        "results/benchmarks/topp_curve.tsv"
    threads: 1
    resources:
        **model_job("pretrain"),
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
        **inputs("tokenizer", "sft"),
    output:
        temp_curve=reported("temp_curve"),
        temp_curve_answers=RESULTS["temp_curve_answers"].path,
    log:
        "results/logs/temp_curve.log",
    benchmark:
        "results/benchmarks/temp_curve.tsv"
    threads: 1
    resources:
        **model_job("sft"),
    params:
        **model_params(),
        question=config["lab"]["temp"]["question"],
        lab_temperatures=config["lab"]["temp"]["temperatures"],
        samples=config["lab"]["temp"]["samples"],
        max_new_tokens=config["lab"]["temp"]["max_new_tokens"],
        seed=config["lab"]["temp"]["seed"],
        t_min=EXTRAS["temp_curve"]["min"],
        t_max=EXTRAS["temp_curve"]["max"],
        t_step=EXTRAS["temp_curve"]["step"],
        budget_s=EXTRAS["temp_curve"].get("budget_s"),
    script:
        "../scripts/temp_curve.py"


# What the lab's page (rule explore, rules/report.smk) needs beside the lab's results: step 1's generation
# opened step by step in both modes (tokens fed, K/V rows computed per layer, the cache held) and the
# next-token logits after step 6's two prefixes (kvlab.measure.explore). Its steps' times are latency's.
rule explore_steps:
    input:
        **inputs("tokenizer", "pretrain", "prompt"),
        steps_opened=rules.same.output.steps_opened,
    output:
        explore_steps=RESULTS["explore_steps"].path,
    log:
        "results/logs/explore_steps.log",
    benchmark:
        "results/benchmarks/explore_steps.tsv"
    threads: 1
    resources:
        **model_job("pretrain"),
    params:
        **model_params(),
        prefix=config["lab"]["topp"]["prefix"],
        sharp_prefix=config["lab"]["topp"]["sharp_prefix"],
        bars=EXTRAS["explore"]["bars"],
    script:
        "../scripts/explore_steps.py"


# `check` grades the lab sheet's files (kvlab.facts.sheet) in the folder extras.check.results_dir
# names. The default, "results", makes it wait for this build and hold each file to its shape and its
# own numbers (the build's results are the answer key: holding them to themselves proves nothing);
# another folder, a student's, is read as it is and held to the answer key `grade` uses (grade.key,
# or this build's temp, topp and kvbytes results, which it then waits for), with grade's tolerance,
# its verdicts written apart (results/check/NAME.json) from the build's own results/check.json.
CHECKED_FOLDER = lab_config.checked_folder(config)
CHECKS_THIS_BUILD = lab_config.checks_this_build(config)
CHECK_KEY = {} if CHECKS_THIS_BUILD else lab_config.answer_key(config)
CHECK_LOG = lab_config.check_log(config)


rule check:
    input:
        # another folder's answer key (none for this build's)
        **CHECK_KEY,
        # this build's results wait for their jobs; another folder's files are taken as they are
        # (one missing is a rule's verdict, not Snakemake's MissingInputException)
        checked=(
            [str(CHECKED_FOLDER / name) for name in HANDED_IN]
            if CHECKS_THIS_BUILD
            else submitted_files(CHECKED_FOLDER)
        ),
    output:
        check=lab_config.check_output(config),
    log:
        table=f"{CHECK_LOG}.log",
        verdicts=f"{CHECK_LOG}.json",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        # held to the key: as far from its distinct-answer counts as grade allows
        **(
            {}
            if CHECKS_THIS_BUILD
            else {"temp_tolerance": config["grade"]["temp_tolerance"]}
        ),
        results_dir=lambda wildcards: str(CHECKED_FOLDER),
        temperatures=config["lab"]["temp"]["temperatures"],
        samples=config["lab"]["temp"]["samples"],
        ps=config["lab"]["topp"]["ps"],
        max_file_bytes=config["grade"]["max_file_bytes"],
    script:
        "../scripts/check.py"


# A failed check is a verdict, not a broken job: it ends the run on one line, without Snakemake's
# report of a failed job.
onsuccess:
    end_on_a_failed_check(rules.check.output.check, rules.check.log.verdicts)
