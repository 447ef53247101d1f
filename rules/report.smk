# Step 7: the report, rendered from the result files, and the sheet's results as HTML tables.
from kvlab.facts.sheet import LAB_RESULTS


rule report:
    input:
        # every result by the name the template reads it by (kvlab.facts.results.report_inputs)
        **report_inputs(WITH_FIDELITY),
        template=workflow_file("templates/report.md.j2"),
    output:
        report=reported("report"),
    log:
        "results/logs/report.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
    script:
        "../scripts/report.py"


# For `snakemake --report`, which shows an HTML result in the page (a Markdown or JSON file only
# as a download): the report as a page, with its figures in it.
rule lab_report:
    input:
        report=rules.report.output.report,
        figures=[figure.path for figure in lab_figures()],
        template=workflow_file("templates/lab_report.html.j2"),
    output:
        lab_report=reported("lab_report"),
    log:
        "results/logs/lab_report.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
    script:
        "../scripts/lab_report.py"


# For `snakemake --report`: the sheet's six result files as tables, so the HTML report shows
# the numbers in the page (a JSON file there is only a download link).
rule lab_tables:
    input:
        **inputs(*LAB_RESULTS),
        template=workflow_file("templates/lab_tables.html.j2"),
    output:
        lab_tables=reported("lab_tables"),
    log:
        "results/logs/lab_tables.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
    script:
        "../scripts/lab_tables.py"
