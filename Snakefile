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
include: "rules/serve.smk"
include: "rules/export.smk"
include: "rules/compare.smk"
include: "rules/figures.smk"
include: "rules/report.smk"
include: "rules/grade.smk"


# Only with the user's own model_minimind.py: importing it runs its code, in that one job.
if WITH_FIDELITY:

    include: "rules/fidelity.smk"


# The front page of `snakemake --report`.
report: "report/workflow.rst"


# A run that failed because Slurm refused it: one line on what to install or set.
onerror:
    print_failure_hints(log)


# Every result a reader sees (kvlab.facts.results), and the self-check.
rule all:
    default_target: True
    input:
        built_by_all(OPTIONAL_BUILT),
        rules.check.output,
