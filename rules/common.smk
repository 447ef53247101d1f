# Shared by all the rule files. The config's validation, the workflow's files by name, the input
# functions and the declared resources. Nothing here imports PyTorch or reads a checkpoint:
# `snakemake -n`, --dag, --rulegraph, --lint and --report only look at paths.
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvlab import resources
from kvlab.cluster import print_failure_hints
from kvlab.config import config_error, load_schema, typed_by_schema
from kvlab.lab import grading, sheet
from kvlab.lab.compare import LAB_NAME, CompareError, check_architecture, check_entries
from kvlab.lab.compare import parameter_estimate
from kvlab.lab.minimind_src import MiniMindSourceError, check_source_path


def stop(message):
    """End the run before any job with `message` as its one line of output (exit status 1):
    the config key or file it names is all the user needs, not a traceback."""
    raise SystemExit(message)


SCHEMA = workflow.source_path("../schemas/config.schema.yaml")
# --config's nested values arrive as strings ("0.99"): typed as the schema says, then validated.
config.update(typed_by_schema(config, load_schema(SCHEMA)))
try:
    validate(config, schema="../schemas/config.schema.yaml")
except WorkflowError:
    # Snakemake's message is a page of schema dump; say in one line which key is wrong and why.
    stop(config_error(config, SCHEMA))


def _by_value(value):
    """`value` with the keys of every mapping in it sorted. Snakemake records a job's params by
    repr(), so a dict's key order would count as a change; sorted, two configs equal by value
    (keys reordered, a comment added, 0.30 written for 0.3) record the same params."""
    if isinstance(value, dict):
        return {key: _by_value(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_by_value(item) for item in value]
    return value


# Every rule's params are read from `config`: canonical here, canonical everywhere.
config.update(_by_value(config))

# --- the inputs: the user's files, or the embedded default's -------------------------------------

# Where each input comes from when its config key is null: the embedded default's rules.
DEFAULT_INPUTS = {
    "pretrain": "results/default/pretrain.pth",
    "sft": "results/default/sft.pth",
    "tokenizer": "results/default/tokenizer",
    "val_data": "results/default/corpus/pretrain_val.jsonl",
}


def _configured_path(key):
    """The path a user gave for `key`, checked to exist now, before any job runs."""
    path = Path(config[key]).expanduser()
    if key == "tokenizer":
        if not (path / "tokenizer.json").is_file():
            stop(
                f"config key 'tokenizer': {path} is not a folder with a tokenizer.json"
            )
    elif key == "minimind_src":
        try:
            check_source_path(path)
        except MiniMindSourceError as err:
            stop(f"config key 'minimind_src': {err}")
    elif not path.is_file():
        stop(f"config key '{key}': file not found: {path}")
    return str(path)


# Each configured path is checked once, now, so a wrong one stops the run with one line
# before any rule asks for it (an input function's error would come wrapped in a traceback).
CONFIGURED_INPUTS = {
    key: _configured_path(key)
    for key in (*DEFAULT_INPUTS, "minimind_src")
    if config[key]
}


def input_path(key):
    """The path of an input: the user's file, or the embedded default's output."""
    return CONFIGURED_INPUTS.get(key, DEFAULT_INPUTS[key])


def tokenizer_inputs(wildcards=None):
    """The tokenizer folder's files, named, for `unpack()`: Snakemake tracks files, not folders."""
    folder = input_path("tokenizer")
    files = {"tokenizer": f"{folder}/tokenizer.json"}
    if not config["tokenizer"] or Path(folder, "tokenizer_config.json").is_file():
        files["tokenizer_config"] = f"{folder}/tokenizer_config.json"
    return files


# --- the files the workflow writes, by name: `rule all`, the report and lab_tables read these ------

# The lab sheet's steps 1-6 (kvlab.lab.sheet), and what those steps write beside them.
LAB_RESULTS = {name: f"results/{file}" for name, file in sheet.LAB_RESULTS.items()}
LAB_DETAILS = {
    "prompt": "results/prompt.json",
    "model_card": "results/model_card.json",
    "time_runs": "results/time_runs.json",
    "temp_answers": "results/temp_answers.json",
    "topp_sharp": "results/topp_sharp.json",
}
# Beyond the sheet (rules/extras.smk, rules/compare.smk), and what they write beside.
EXTRA_DETAILS = {
    "sweep_runs": "results/sweep_runs.json",
    "batch_runs": "results/batch_runs.json",
    "kv_waste_requests": "results/kv_waste_requests.json",
}
EXTRA_RESULTS = {
    "sweep": "results/sweep.csv",
    "latency": "results/latency.json",
    "kv_capacity": "results/kv_capacity.csv",
    "topp_curve": "results/topp_curve.csv",
    "temp_curve": "results/temp_curve.csv",
    "compare": "results/compare.csv",
    "batch": "results/batch.tsv",
    "kv_waste": "results/kv_waste.csv",
    "step_anatomy": "results/step_anatomy.json",
}
# One rule a figure (rules/figures.smk), named by the key; its caption is report/NAME.rst.
FIGURES = {
    "figure_cost_curves": {"data": "sweep", "subcategory": "Cost curves"},
    "figure_step_times": {"data": "latency", "subcategory": "Latency split"},
    "figure_topp_survivors": {"data": "topp_curve", "subcategory": "Top-p curve"},
    "figure_temperature_effect": {
        "data": "temp_curve",
        "subcategory": "Temperature curve",
    },
    "figure_compare": {"data": "compare", "subcategory": "Model comparison"},
    "figure_batch": {"data": "batch", "subcategory": "Batching"},
    "figure_kv_waste": {"data": "kv_waste", "subcategory": "KV reservation"},
    "figure_step_anatomy": {"data": "step_anatomy", "subcategory": "Step anatomy"},
}
for name, figure in FIGURES.items():
    figure["path"] = f"results/figures/{name.removeprefix('figure_')}.png"
# Only when the user names their own MiniMind code (rules/fidelity.smk).
FIDELITY = {"fidelity": "results/fidelity.json"} if config["minimind_src"] else {}
REPORT_INPUTS = {
    **LAB_RESULTS,
    **LAB_DETAILS,
    **EXTRA_RESULTS,
    **EXTRA_DETAILS,
    **{name: figure["path"] for name, figure in FIGURES.items()},
    **FIDELITY,
}

# --- the models compared side by side (rules/compare.smk) ---------------------------------------

try:
    check_entries(
        config["compare"],
        config["extras"]["compare"]["prompt_tokens"],
        config["lab"]["prompt"]["cut_tokens"] + 1,
    )
    for index, arch in enumerate(config["extras"]["capacity"]["architectures"]):
        check_architecture(arch, f"config key 'extras.capacity.architectures[{index}]'")
except CompareError as err:
    stop(str(err))


def compare_entries():
    """The lab's model (its pretrained checkpoint), then the configured ones; a checkpoint that
    this workflow does not make must exist now."""
    entries = {LAB_NAME: {"name": LAB_NAME, "inspected": "pretrain"}}
    for index, entry in enumerate(config["compare"]):
        entry = dict(entry)
        if "checkpoint" in entry:
            path = Path(entry["checkpoint"]).expanduser()
            if not path.is_file() and not str(path).startswith("results/"):
                stop(
                    f"config key 'compare[{index}]' ({entry['name']}).checkpoint: file not found: {path}"
                )
            entry.update(checkpoint=str(path), inspected=entry["name"])
        entries[entry["name"]] = entry
    return entries


COMPARE_ENTRIES = compare_entries()


def compare_inputs(wildcards):
    """The lab's prompt, and the model's checkpoint with its inspection, when it has one."""
    entry = COMPARE_ENTRIES[wildcards.name]
    files = {"prompt": LAB_DETAILS["prompt"]}
    if "inspected" in entry:
        inspected = checkpoint_inputs(entry["inspected"])
        files["checkpoint"] = inspected[entry["inspected"]]
        files["checkpoint_inspected"] = inspected[f"{entry['inspected']}_inspected"]
    return files


# --- checkpoints: each one the config names is inspected by one job (rules/checkpoints.smk) --------

CHECKPOINTS = {
    key: {
        "path": input_path(key),
        "config_key": key,
        "overrides": config["model_overrides"],
        "compared_as": None,
    }
    for key in ("pretrain", "sft")
}
for name, entry in COMPARE_ENTRIES.items():
    if "checkpoint" in entry:
        CHECKPOINTS[name] = {
            "path": entry["checkpoint"],
            "config_key": "compare",  # and the entry's name: its index would rerun it when one before goes
            "overrides": entry.get("model_overrides", {}),
            "compared_as": name,
        }


def checkpoint_inputs(*names):
    """Inputs of a job that loads the checkpoints `names`: each file, and what its inspection found
    (kvlab.checkpoints.load_model_input reads both)."""
    files = {}
    for name in names:
        files[name] = CHECKPOINTS[name]["path"]
        files[f"{name}_inspected"] = f"results/checkpoints/{name}.json"
    return files


def model_params():
    """The params every job that loads a checkpoint passes on."""
    return dict(device=config["device"], dtype=config["dtype"])


def timing_params():
    """The params of every job that times something: torch's threads, and how long a timing may
    repeat while its spread is unstable."""
    return dict(
        threads=config["timing"]["threads"], max_seconds=config["timing"]["max_seconds"]
    )


def all_cores(wildcards):
    """`threads:` of the timing rules: every core of the run, so no other job shares the CPU with
    the clock. Commands that run no job (--report, --dag, --rulegraph, --lint, --summary) may
    give no --cores; then there is nothing to share and one thread is recorded. So does a run on
    Slurm, where the timed jobs ask for a whole node instead (model_job(timed=True))."""
    return workflow.resource_settings.cores or 1


def workflow_file(path):
    """A file of the workflow itself (e.g. a template), as a job input named relative to the
    working directory: a finished build moved together with the workflow records the same
    input paths, so nothing reruns after the move. `path` is relative to the Snakefile.
    """
    return os.path.relpath(Path(workflow.basedir, path))


# --- resources: declared sizes (kvlab/resources.py), times the attempt; a site tunes them in its
# profile. Jobs that load a model are sized by their weights' bytes and ask for a GPU on cuda;
# jobs that time something have a node to themselves on Slurm.


def declared(sizes):
    return {
        key: lambda wildcards, attempt, key=key: resources.declared(sizes, attempt)[key]
        for key in sizes
    }


LIGHT_JOB = declared(resources.LIGHT)
TRAINING_JOB = declared(resources.TRAINING)


def sized_by(weight_bytes, device=lambda wildcards: config["device"], timed=False):
    """resources: of a job whose models weigh `weight_bytes(wildcards, input)` in float16."""
    asked = {
        key: lambda wildcards, input, attempt, key=key: resources.model_sized(
            weight_bytes(wildcards, input), attempt
        )[key]
        for key in resources.MODEL_BASE
    }
    asked["gpu"] = lambda wildcards: int(device(wildcards) == "cuda")
    if timed:
        asked["slurm_extra"] = "--exclusive"
    return asked


def model_job(*names, timed=False, device=lambda wildcards: config["device"]):
    """resources: of a job that loads the checkpoints `names`, sized by their files."""
    return sized_by(
        lambda wildcards, input: sum(
            Path(input[name]).stat().st_size for name in names
        ),
        device=device,
        timed=timed,
    )


def compare_job():
    """resources: of compare_cost, sized by its model's parameters, on its own device; timed."""

    def weight_bytes(wildcards, input):
        entry = COMPARE_ENTRIES[wildcards.name]
        size = (
            Path(input.checkpoint).stat().st_size if "checkpoint" in input.keys() else 0
        )
        return 2 * parameter_estimate(entry, size)

    return sized_by(
        weight_bytes,
        device=lambda wildcards: COMPARE_ENTRIES[wildcards.name].get(
            "device", config["device"]
        ),
        timed=True,
    )


# --- grading a class (rules/grade.smk): the class sheet's students, read now ----------------------

GRADE = config["grade"]
ANSWER_KEY = {name: LAB_RESULTS[name] for name in ("temp", "topp", "kvbytes")}
CLASS = "results/class"


def _class_sheet():
    """The students of the class sheet, validated the Snakemake catalog's way; {} without a sheet."""
    if not GRADE["class_sheet"]:
        return {}
    import pandas as pd

    try:
        students = grading.read_class_sheet(GRADE["class_sheet"])
        schema = workflow.source_path("../schemas/class_sheet.schema.yaml")
        try:
            validate(pd.DataFrame(students), schema=schema)
        except WorkflowError:
            stop(
                grading.sheet_error(students, load_schema(schema), GRADE["class_sheet"])
            )
    except grading.ClassSheetError as err:
        stop(str(err))
    return {student["student_id"]: student for student in students}


STUDENTS = _class_sheet()
NO_SHEET = (
    "config key 'grade.class_sheet' is not set: give the class sheet, a TSV of student_id and "
    "results (e.g. --config grade='{class_sheet: examples/class/students.tsv}'); see docs/teaching.md"
)
# Snakemake parses this file before it is told the targets: asked for on the command line, `grade`
# without a sheet stops here in one line; asked for otherwise, the rule's input function says it.
if not STUDENTS and "grade" in sys.argv[1:]:
    stop(NO_SHEET)
# A folder that is not there scores 0 (no submission); said once, in case it is a typo on the sheet.
if "grade" in sys.argv[1:] and (
    absent := [s for s in STUDENTS.values() if not Path(s["results"]).is_dir()]
):
    print(
        f"grade: {len(absent)} of {len(STUDENTS)} students have no folder and score 0 (no submission): "
        + ", ".join(f"{s['student_id']} ({s['results']})" for s in absent),
        file=sys.stderr,
    )


def class_outputs(wildcards):
    if not STUDENTS:
        raise WorkflowError(NO_SHEET)
    return [
        *rules.grade_class.output,
        *rules.class_page.output,
        *[figure["path"] for figure in CLASS_FIGURES.values()],
    ]


def student_inputs(wildcards):
    """The answer key, and the sheet's files the student's folder holds now: a resubmitted or added
    file reruns this student's job only; a missing one is the job's verdict, not Snakemake's error.
    """
    folder = STUDENTS[wildcards.student_id]["results"]
    return {**ANSWER_KEY, "submitted": grading.submitted_files(folder)}


CLASS_FIGURES = {
    "figure_class_scores": {"data": "grades", "path": f"{CLASS}/scores.png"},
    "figure_class_tests": {"data": "tests", "path": f"{CLASS}/tests.png"},
}
