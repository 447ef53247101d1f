# Step 7: the lab's two reports, rendered from the result files (the sheet's, and what lies beyond it), both
# as one HTML page, and the sheet's results as HTML tables.
from kvlab.facts.results import EXPLORE_READS, EXPLORE_TEMPLATE, REPORT_TEMPLATES
from kvlab.facts.sheet import LAB_RESULTS

# Every template of the reports: a section changed reruns both (they share their pieces).
REPORT_SECTIONS = sorted(
    workflow_file(str(path.relative_to(workflow.basedir)))
    for path in Path(workflow.basedir, REPORT_TEMPLATES).glob("*.j2")
)
# Which inputs the user named (the reports say whose models they measured).
GIVEN = {key: bool(config[key]) for key in ("pretrain", "sft", "tokenizer", "val_data")}

for name, entry in (("report", "report.md.j2"), ("beyond", "beyond.md.j2")):

    rule:
        name:
            name
        input:
            # every result by the name the templates read it by (kvlab.facts.results.report_inputs)
            **report_inputs(OPTIONAL_BUILT, name),
            template=workflow_file(f"{REPORT_TEMPLATES}/{entry}"),
            sections=REPORT_SECTIONS,
        output:
            reported(name),
        log:
            f"results/logs/{name}.log",
        threads: 1
        resources:
            **LIGHT_JOB,
        params:
            language=config["report"]["language"],
            given=GIVEN,
        script:
            "../scripts/report.py"


# For `snakemake --report`, which shows an HTML result in the page (a Markdown or JSON file only
# as a download): both reports as one page, with their figures and Korean font in it; and the Korean
# font of the report's front page (report/workflow.rst includes it where this page is in the report).
rule lab_report:
    input:
        report=RESULTS["report"].path,
        beyond=RESULTS["beyond"].path,
        figures=[figure.path for figure in lab_figures()],
        template=workflow_file("templates/lab_report.html.j2"),
        front_page=workflow_file("report/workflow.rst"),
    output:
        lab_report=reported("lab_report"),
        front_page_font=RESULTS["front_page_font"].path,
    log:
        "results/logs/lab_report.log",
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
        # the config's strings the front page shows (a class sheet's path is left out: grading a class
        # must not make the lab's page stale)
        front_page_values=[config["pretrain"], config["sft"]],
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


# The lab as a page a student plays with, one self-contained file (its data, script, style and Hangul font
# inline; no request leaves it): step 1's generation step by step with and without the cache, temperature
# and top-p on the model's own next-token logits, the cache against a memory budget
# (kvlab.present.explore).
rule explore:
    input:
        **inputs(*EXPLORE_READS),
        template=workflow_file(EXPLORE_TEMPLATE),
        script=workflow_file(EXPLORE_TEMPLATE.replace(".html.j2", ".js")),
        style=workflow_file(EXPLORE_TEMPLATE.replace(".html.j2", ".css")),
    output:
        explore=reported("explore"),
    log:
        "results/logs/explore.log",
    benchmark:
        "results/benchmarks/explore.tsv"
    threads: 1
    resources:
        **LIGHT_JOB,
    params:
        language=config["report"]["language"],
    script:
        "../scripts/explore.py"
