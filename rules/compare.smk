# Several models measured the same way (kvlab.measure.cost): one job per model in config["compare"],
# the lab's own pretrained model first as "lab", then a table, a figure and a report section.
# Each job's params hold its own entry only, so adding or removing a model reruns that model's job
# and what collects the rows, never the other models' jobs.


# The device a compared model runs on: its entry's, or the config's.
COMPARE_DEVICE = lambda wildcards: COMPARE_ENTRIES[wildcards.name].get(
    "device", config["device"]
)


rule compare_cost:
    input:
        unpack(
            lambda wildcards: lab_config.compare_inputs(
                COMPARE_ENTRIES[wildcards.name], CHECKPOINTS, RESULTS["prompt"].path
            )
        ),
    output:
        cost="results/compare/{name}/cost.json",
    log:
        "results/logs/compare/{name}.log",
    benchmark:
        "results/benchmarks/compare/{name}.tsv"
    wildcard_constraints:
        name="[A-Za-z0-9_-]+",
    # The clock must not share the CPU with other jobs: take every core.
    threads: all_cores
    resources:
        **resources.asked_by_weights(
            lambda wildcards, input: lab_config.compare_weight_bytes(
                COMPARE_ENTRIES[wildcards.name], input.get("checkpoint")
            ),
            COMPARE_DEVICE,
            timed=True,
        ),
    params:
        **timing_params(),
        entry=lambda wildcards: COMPARE_ENTRIES[wildcards.name],
        device=COMPARE_DEVICE,
        dtype=lambda wildcards: COMPARE_ENTRIES[wildcards.name].get(
            "dtype", config["dtype"]
        ),
        settings=config["extras"]["compare"],
        seed=config["lab"]["kvbytes"]["seed"],
    script:
        "../scripts/compare_cost.py"


rule compare_table:
    input:
        costs=expand("results/compare/{name}/cost.json", name=COMPARE_ENTRIES),
    output:
        compare=reported("compare"),
    log:
        "results/logs/compare_table.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        # the caption (report/compare.rst) states P and N
        settings=config["extras"]["compare"],
        names=list(COMPARE_ENTRIES),
        kinds={
            name: "random (cost only)" if "architecture" in entry else "checkpoint"
            for name, entry in COMPARE_ENTRIES.items()
        },
    script:
        "../scripts/compare_table.py"
