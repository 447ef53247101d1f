# Step 7: the report, rendered from the result files, and the sheet's results as HTML tables.


rule report:
    input:
        # every result by the name the template reads it by (rules/common.smk)
        **REPORT_INPUTS,
        template=workflow_file("templates/report.md.j2"),
    output:
        report=report(
            "results/report.md", caption="../report/report.rst", category="Lab report"
        ),
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
rule lab_report_html:
    input:
        report=rules.report.output.report,
        figures=[figure["path"] for figure in FIGURES.values()],
        template=workflow_file("templates/lab_report.html.j2"),
    output:
        page=report(
            "results/lab_report.html",
            caption="../report/lab_report.rst",
            category="Lab report",
        ),
    log:
        "results/logs/lab_report_html.log",
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
        **LAB_RESULTS,
        template=workflow_file("templates/lab_tables.html.j2"),
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
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
    script:
        "../scripts/lab_tables.py"
