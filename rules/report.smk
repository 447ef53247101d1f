# Step 7: the report, rendered from the result files.


rule report:
    input:
        # fidelity.json too, when minimind_src is set (rules/fidelity.smk)
        **FIDELITY,
        template=workflow_file("templates/report.md.j2"),
        prompt="results/prompt.json",
        model_card="results/model_card.json",
        same="results/same.json",
        fed="results/count.json",
        time="results/time.json",
        time_runs="results/time_runs.json",
        kvbytes="results/kvbytes.json",
        temp="results/temp.json",
        temp_answers="results/temp_answers.json",
        topp="results/topp.json",
        topp_sharp="results/topp_sharp.json",
        # Beyond the lab sheet (rules/extras.smk). Every input's file stem must differ.
        sweep="results/sweep.csv",
        latency="results/latency.json",
        kv_capacity="results/kv_capacity.csv",
        topp_curve="results/topp_curve.csv",
        temp_curve="results/temp_curve.csv",
        cost_curves="results/figures/cost_curves.png",
        step_times="results/figures/step_times.png",
        topp_survivors="results/figures/topp_survivors.png",
        temperature_effect="results/figures/temperature_effect.png",
        compare="results/compare.csv",
        compare_figure="results/figures/compare.png",
    output:
        report=report(
            "results/report.md", caption="../report/report.rst", category="Lab report"
        ),
    log:
        "results/logs/report.log",
    threads: 1
    resources:
        **light_job(),
    params:
        language=config["report"]["language"],
    script:
        "../scripts/report.py"


# For `snakemake --report`: the sheet's six result files as tables, so the HTML report shows
# the numbers in the page (a JSON file there is only a download link).
rule lab_tables:
    input:
        template=workflow_file("templates/lab_tables.html.j2"),
        same="results/same.json",
        fed="results/count.json",
        time="results/time.json",
        kvbytes="results/kvbytes.json",
        temp="results/temp.json",
        topp="results/topp.json",
    output:
        tables=report(
            "results/lab_tables.html",
            caption="../report/lab_tables.rst",
            category="Lab sheet",
        ),
    log:
        "results/logs/lab_tables.log",
    threads: 1
    resources:
        **light_job(),
    script:
        "../scripts/lab_tables.py"
