# kvlab: what a KV cache and the sampling knobs do to MiniMind.
# This file only sets up: the rules live in rules/, the logic in the kvlab package.
from snakemake.utils import min_version

min_version("9.0")


# The repository's config.yaml, wherever the workflow runs from; --configfile/--config override it.
configfile: f"{workflow.basedir}/config.yaml"


include: "rules/common.smk"
include: "rules/default_model.smk"
include: "rules/checkpoints.smk"
include: "rules/lab.smk"
include: "rules/extras.smk"
include: "rules/serving.smk"
include: "rules/compare.smk"
include: "rules/figures.smk"
include: "rules/report.smk"
include: "rules/grade.smk"


# Only with the user's own model_minimind.py: importing it runs its code, in that one job.
if config["minimind_src"]:

    include: "rules/fidelity.smk"


# The front page of `snakemake --report`.
report: "report/workflow.rst"


# A run that failed because Slurm refused it: one line on what to install or set.
onerror:
    print_failure_hints(log)


rule all:
    default_target: True
    input:
        LAB_RESULTS.values(),
        rules.report.output,
        rules.lab_report_html.output,
        rules.lab_tables.output,
        EXTRA_RESULTS.values(),
        [figure["path"] for figure in FIGURES.values()],
        rules.check.output,
        FIDELITY.values(),
