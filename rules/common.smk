# Config validation and input functions shared by every rule file.
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvlab.config import config_error
from kvlab.workflow import describe_checkpoint
from kvlab.lab.minimind_src import MiniMindSourceError, check_source_path


def stop(message):
    """End the run before any job with `message` as its one line of output (exit status 1):
    the config key or file it names is all the user needs, not a traceback."""
    raise SystemExit(message)


try:
    validate(config, schema="../schemas/config.schema.yaml")
except WorkflowError:
    # Snakemake's message is a page of schema dump; say in one line which key is wrong and why.
    stop(config_error(config, workflow.source_path("../schemas/config.schema.yaml")))


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

# Where each input comes from when its config key is null: the embedded default's rules.
DEFAULT_INPUTS = {
    "pretrain": "results/default/pretrain.pth",
    "sft": "results/default/sft.pth",
    "tokenizer": "results/default/tokenizer",
    "val_data": "results/default/corpus/pretrain_val.jsonl",
}

LAB_RESULTS = [
    f"results/{name}.json"
    for name in ("same", "count", "time", "kvbytes", "temp", "topp")
]


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


# Beyond the sheet, only when the user names their own MiniMind code (rules/fidelity.smk):
# {input name: path}, for `rule all` and the report.
FIDELITY = {"fidelity": "results/fidelity.json"} if config["minimind_src"] else {}


def tokenizer_inputs(wildcards=None):
    """The tokenizer folder's files, named, for `unpack()`: Snakemake tracks files, not folders."""
    folder = input_path("tokenizer")
    files = {"tokenizer": f"{folder}/tokenizer.json"}
    if not config["tokenizer"] or Path(folder, "tokenizer_config.json").is_file():
        files["tokenizer_config"] = f"{folder}/tokenizer_config.json"
    return files


def describe_configured_checkpoints():
    """For each checkpoint the user gave: its layout and vocabulary, checked against the configured
    tokenizer, and the head count of a MiniMind2 file measured when nobody stated it. Any problem
    stops the run here, before a job starts, with one line."""
    described = {}
    for key in ("pretrain", "sft"):
        if not config[key]:
            continue
        try:
            described[key] = describe_checkpoint(
                input_path(key),
                config["model_overrides"],
                tokenizer_dir=input_path("tokenizer") if config["tokenizer"] else None,
                val_path=input_path("val_data") if config["val_data"] else None,
                n_docs=config["lab"]["prompt"]["n_docs"],
                cache_dir=".snakemake/kvlab",
            )
        except ValueError as err:
            message = str(err)
            if not message.startswith("config key"):
                message = f"config key '{key}': {message}"
            stop(message)
    return described


CONFIGURED_CHECKPOINTS = describe_configured_checkpoints()
# Head counts measured for MiniMind2-layout files ({"pretrain": {"num_attention_heads": 8}}), and why.
MEASURED = {
    key: d["measured"] for key, d in CONFIGURED_CHECKPOINTS.items() if d["measured"]
}
HEAD_COUNTS = {
    key: d["head_count"] for key, d in CONFIGURED_CHECKPOINTS.items() if d["head_count"]
}


def model_params():
    """The params every job that loads a checkpoint passes on."""
    return dict(
        device=config["device"],
        dtype=config["dtype"],
        overrides=config["model_overrides"],
        measured=MEASURED,
    )


# --- the models compared side by side (rules/compare.smk) ---------------------------------------

from kvlab.lab.compare import (
    LAB_NAME,
    CompareError,
    check_entries,
    parameter_estimate,
    resources as compare_resources,
)

COMPARE_SETTINGS = config["extras"]["compare"]


def compare_entries():
    """The lab's model, then the configured ones, each checked before any job runs."""
    try:
        check_entries(
            config["compare"],
            COMPARE_SETTINGS["prompt_tokens"],
            config["lab"]["prompt"]["cut_tokens"] + 1,
        )
    except CompareError as err:
        stop(str(err))
    entries = {
        LAB_NAME: {
            "name": LAB_NAME,
            "checkpoint": input_path("pretrain"),
            "model_overrides": config["model_overrides"],
            "measured": MEASURED.get("pretrain", {}),
        }
    }
    for index, entry in enumerate(config["compare"]):
        entry = dict(entry)
        if "checkpoint" in entry:
            path = Path(entry["checkpoint"]).expanduser()
            # a file this workflow makes (results/...) may not exist yet; any other must
            if not path.is_file() and not str(entry["checkpoint"]).startswith(
                "results/"
            ):
                stop(
                    f"config key 'compare[{index}]' ({entry['name']}).checkpoint: file not found: {path}"
                )
            entry["checkpoint"] = str(path)
        entries[entry["name"]] = entry
    return entries


COMPARE_ENTRIES = compare_entries()
COMPARE_NAMES = list(COMPARE_ENTRIES)
COMPARE_RESULTS = ["results/compare.csv", "results/figures/compare.png"]


def compare_inputs(wildcards):
    entry = COMPARE_ENTRIES[wildcards.name]
    files = {"prompt": "results/prompt.json"}
    if "checkpoint" in entry:
        files["checkpoint"] = entry["checkpoint"]
    return files


def compare_job_resources(name):
    entry = COMPARE_ENTRIES[name]
    path = Path(entry.get("checkpoint", ""))
    size = path.stat().st_size if "checkpoint" in entry and path.is_file() else None
    # a checkpoint not made yet is taken as the size of MiniMind2-small (26 M parameters)
    parameters = parameter_estimate(entry, size) or 26_000_000
    runs = COMPARE_SETTINGS["warmup"] + COMPARE_SETTINGS["repeats"] + 1
    return compare_resources(
        parameters,
        COMPARE_SETTINGS["prompt_tokens"],
        COMPARE_SETTINGS["new_tokens"],
        runs,
    )


def all_cores(wildcards):
    """`threads:` of the timing rules: every core of the run, so no other job shares the CPU with
    the clock. Commands that run no job (--report, --dag, --rulegraph, --lint, --summary) may
    give no --cores; then there is nothing to share and one thread is recorded."""
    return workflow.resource_settings.cores or 1


def workflow_file(path):
    """A file of the workflow itself (e.g. a template), as a job input named relative to the
    working directory: a finished build moved together with the workflow records the same
    input paths, so nothing reruns after the move. `path` is relative to the Snakefile.
    """
    return os.path.relpath(Path(workflow.basedir, path))
