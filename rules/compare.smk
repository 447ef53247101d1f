# Several models measured the same way (kvlab.lab.compare): one job per model in config["compare"],
# the lab's own pretrained model first as "lab", then a table, a figure and a report section.
# Each job's params hold its own entry only, so adding or removing a model reruns that model's job
# and what collects the rows, never the other models' jobs.


rule compare_cost:
    input:
        unpack(compare_inputs),
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
        **compare_job(),
    params:
        entry=lambda wildcards: COMPARE_ENTRIES[wildcards.name],
        device=lambda wildcards: COMPARE_ENTRIES[wildcards.name].get(
            "device", config["device"]
        ),
        dtype=lambda wildcards: COMPARE_ENTRIES[wildcards.name].get(
            "dtype", config["dtype"]
        ),
        settings=COMPARE_SETTINGS,
        seed=config["lab"]["kvbytes"]["seed"],
    script:
        "../scripts/compare_cost.py"


rule compare_table:
    input:
        costs=expand("results/compare/{name}/cost.json", name=COMPARE_NAMES),
    output:
        table=report(
            "results/compare.csv",
            caption="../report/compare.rst",
            category="Beyond the lab",
            subcategory="Model comparison",
        ),
    log:
        "results/logs/compare_table.log",
    threads: 1
    resources:
        **light_job(),
    params:
        names=COMPARE_NAMES,
        settings=COMPARE_SETTINGS,
        kinds={
            name: "checkpoint" if "checkpoint" in entry else "random (cost only)"
            for name, entry in COMPARE_ENTRIES.items()
        },
    script:
        "../scripts/compare_table.py"


rule figure_compare:
    input:
        data="results/compare.csv",
    output:
        figure=report(
            "results/figures/compare.png",
            caption="../report/fig_compare.rst",
            category="Beyond the lab",
            subcategory="Model comparison",
        ),
    log:
        "results/logs/figure_compare.log",
    threads: 1
    resources:
        **light_job(reads=("data",)),
    params:
        kind="compare",
        language=config["report"]["language"],
    script:
        "../scripts/figure.py"
