# Shared by the rule files, as the Snakemake catalog keeps it (the config validated once, and the
# input functions); the logic lives in the package (kvlab.config, kvlab.facts.results, kvlab.resources),
# where the tests reach it. Nothing here imports PyTorch or reads a checkpoint: `snakemake -n`,
# --dag, --rulegraph, --lint and --report only look at paths.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvlab import resources
from kvlab.cluster import print_failure_hints
from kvlab.grade.check import failed_check
from kvlab.facts import serving as serving_settings
from kvlab.present.i18n import category_name
import kvlab.config as lab_config
from kvlab.facts.results import (
    EXPORT_CHECKS,
    EXPORT_GGUF,
    EXPORT_HF,
    EXPORTED,
    FIGURES,
    RESULTS,
    built_by_all,
    lab_figures,
    report_inputs,
)


def stop(message):
    """End the run before any job with `message` as its one line of output (exit status 1):
    the config key or file it names is all the user needs, not a traceback."""
    raise SystemExit(message)


# --- the config, checked once, before any job ----------------------------------------------------

SCHEMA = workflow.source_path("../schemas/config.schema.yaml")
# --config's nested values arrive as strings ("0.99"): typed as the schema says, then validated.
config.update(lab_config.typed_by_schema(config, lab_config.load_schema(SCHEMA)))
try:
    validate(config, schema="../schemas/config.schema.yaml")
except WorkflowError:
    # Snakemake's message is a page of schema dump; say in one line which key is wrong and why.
    stop(lab_config.config_error(config, SCHEMA))
# Every rule's params are read from `config`: canonical here, canonical everywhere.
config.update(lab_config.by_value(config))
try:
    CONFIGURED_INPUTS = lab_config.configured_inputs(config)
    lab_config.check_config(config)
    COMPARE_ENTRIES = lab_config.compare_entries(config)
except lab_config.ConfigError as err:
    stop(str(err))
WITH_FIDELITY = bool(config["minimind_src"])
# The results of kvlab.facts.results.OPTIONAL this build asks for.
OPTIONAL_BUILT = ["fidelity"] * WITH_FIDELITY + [
    f"export_{model}" for model in EXPORTED if config["extras"]["export"]["in_build"]
]


def input_path(key):
    """The path of an input: the user's file, or the embedded default's output."""
    return (
        CONFIGURED_INPUTS[key]
        if key in CONFIGURED_INPUTS
        else lab_config.DEFAULT_INPUTS[key]
    )


# Each checkpoint the config names, inspected by one job (rules/checkpoints.smk).
CHECKPOINTS = lab_config.checkpoints(
    config, {key: input_path(key) for key in ("pretrain", "sft")}, COMPARE_ENTRIES
)

# --- outputs and inputs, by the names of kvlab.facts.results ------------------------------------


def reported(item):
    """The path of a result (by name) or a figure, as an output `snakemake --report` shows with its
    caption, in its category."""
    item = RESULTS[item] if isinstance(item, str) else item
    language = config["report"]["language"]
    return report(
        item.path,
        caption=f"../{item.caption}",
        category=category_name(item.category, language),
        subcategory=category_name(item.subcategory, language),
    )


def inputs(*names):
    """A job's inputs, each by its name: `tokenizer` (its folder's files), `val_data` and
    `minimind_src` (the configured inputs), `pretrain` and `sft` (each checkpoint, and what its
    inspection found: kvlab.checkpoints.load_model_input reads both),
    or a result of kvlab.facts.results (e.g. `prompt`)."""
    files = {}
    for name in names:
        if name == "tokenizer":
            files |= lab_config.tokenizer_files(
                input_path(name), given=bool(config[name])
            )
        elif name in ("val_data", "minimind_src"):
            files[name] = input_path(name)
        elif name in ("pretrain", "sft"):
            files[name] = CHECKPOINTS[name]["path"]
            files[f"{name}_inspected"] = f"results/checkpoints/{name}.json"
        else:
            files[name] = RESULTS[name].path
    return files


def workflow_file(path):
    """A file of the workflow itself (e.g. a template), as a job input named relative to the
    working directory: a finished build moved together with the workflow records the same
    input paths, so nothing reruns after the move. `path` is relative to the Snakefile.
    """
    return os.path.relpath(Path(workflow.basedir, path))


# --- params and resources ------------------------------------------------------------------------


def model_params():
    """The params of every job that loads a checkpoint."""
    return dict(device=config["device"], dtype=config["dtype"])


def timing_params():
    """How every timing measures: torch's threads, and how long it may repeat while its spread is
    unstable."""
    return dict(
        threads=config["timing"]["threads"], max_seconds=config["timing"]["max_seconds"]
    )


def timed_params():
    """The params of a job that loads a checkpoint and times it."""
    return model_params() | timing_params()


def all_cores(wildcards):
    """`threads:` of the timing rules: every core of the run, so no other job shares the CPU with
    the clock. Commands that run no job (--report, --dag, --rulegraph, --lint, --summary) may
    give no --cores; then there is nothing to share and one thread is recorded. So does a run on
    Slurm, where the timed jobs ask for a whole node instead (model_job(..., timed=True)).
    """
    return workflow.resource_settings.cores or 1


LIGHT_JOB = resources.asked(resources.LIGHT)
TRAINING_JOB = resources.asked(resources.TRAINING)


def model_job(*names, timed=False, device=lambda wildcards: config["device"]):
    """resources: of a job that loads the checkpoints of its inputs `names`, sized by their files."""
    return resources.asked_by_weights(resources.file_bytes(*names), device, timed)


def end_on_a_failed_check(path, verdicts):
    """The run's last line when `check` failed (the job printed its table): which rules failed. The
    output is removed, so the next run checks again, and the run exits 1."""
    line = failed_check(path)
    if line is not None:
        Path(path).unlink()
        print(f"kvlab: {line}; verdicts in {verdicts}", file=sys.stderr)
        sys.exit(1)
