# Config validation and input functions shared by every rule file.
import os
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvlab import resources as cost
from kvlab.cluster import print_failure_hints
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


# What each job asks of a scheduler (Slurm, or --resources locally): threads, mem_mb and
# runtime (minutes) estimated from the model and the work by kvlab/resources.py, growing with
# each retry (attempt); one GPU for a job that loads a model when the config says cuda.

# The longest prompt the lab builds: bos and lab.prompt.cut_tokens tokens.
PROMPT_LEN = cost.prompt_len_bound(config["lab"]["prompt"]["cut_tokens"])


def _bytes(input, names):
    return sum(Path(getattr(input, name)).stat().st_size for name in names)


def model_job(checkpoints, work, timed=False, extra_params=0):
    """resources: of a job that loads the input named `checkpoints` (or each of a tuple of
    names) and does `work` (a kvlab.resources.Work), sized from the files once they exist.
    `timed`: it measures time, so on Slurm it has a node to itself; `extra_params`: other
    models it builds."""
    names = (checkpoints,) if isinstance(checkpoints, str) else checkpoints

    def params(input):
        files = [_bytes(input, [name]) for name in names]
        return sum(map(cost.checkpoint_params, files)) + extra_params, sum(files)

    def mem_mb(wildcards, input, attempt):
        held, file_bytes = params(input)
        return cost.model_mem_mb(held, config["dtype"], work, attempt, file_bytes)

    def runtime(wildcards, input, attempt):
        return cost.runtime_minutes(work, params(input)[0], attempt)

    asked = {"mem_mb": mem_mb, "runtime": runtime}
    if config["device"] == "cuda":
        asked["gpu"] = 1
    if timed:
        asked["slurm_extra"] = "--exclusive"
    return asked


def training_job(model, work):
    """resources: of a job that trains the embedded default's `model` (its config) on `work`,
    on the CPU (the default trains there whatever the device)."""
    vocab_size = config["default_model"]["tokenizer"]["vocab_size"]  # an upper bound
    params = cost.architecture_params({**model, "vocab_size": vocab_size})
    return {
        "mem_mb": lambda wildcards, attempt: cost.training_mem_mb(
            params,
            model["hidden_size"],
            model["num_hidden_layers"],
            vocab_size,
            work,
            attempt,
        ),
        "runtime": lambda wildcards, attempt: cost.runtime_minutes(
            work, params, attempt
        ),
    }


def light_job(reads=(), seconds=0.0, seconds_per_mb=0.0):
    """resources: of a job that loads no model: the process, a few copies of the inputs named
    in `reads`, and `seconds` plus `seconds_per_mb` of those inputs of work."""

    def mem_mb(wildcards, input, attempt):
        return cost.light_mem_mb(_bytes(input, reads), attempt)

    def runtime(wildcards, input, attempt):
        work_s = seconds + seconds_per_mb * _bytes(input, reads) / cost.MB
        return cost.light_runtime_minutes(work_s, attempt)

    return {"mem_mb": mem_mb, "runtime": runtime}


def compare_job():
    """resources: of compare_cost: the lab's cost steps at extras.compare's P and N (the counted
    pair, the warm-ups, the timed runs, a cache weighed) on each model: its checkpoint once it
    exists, else its architecture, in its own dtype, on its own device; timed."""
    settings = COMPARE_SETTINGS
    runs = 1 + settings["warmup"] + settings["repeats"]
    work = cost.greedy_pair(
        settings["prompt_tokens"], settings["new_tokens"], runs
    ) + cost.forward(settings["kv_tokens"])

    def entry_of(wildcards):
        return COMPARE_ENTRIES[wildcards.name]

    def file_bytes(wildcards, input):
        return (
            _bytes(input, ["checkpoint"]) if "checkpoint" in entry_of(wildcards) else 0
        )

    def mem_mb(wildcards, input, attempt):
        size = file_bytes(wildcards, input)
        entry = entry_of(wildcards)
        dtype = entry.get("dtype", config["dtype"])
        held = parameter_estimate(entry, size)
        return cost.model_mem_mb(held, dtype, work, attempt, size)

    def runtime(wildcards, input, attempt):
        held = parameter_estimate(entry_of(wildcards), file_bytes(wildcards, input))
        return cost.runtime_minutes(work, held, attempt)

    def gpu(wildcards):
        return int(entry_of(wildcards).get("device", config["device"]) == "cuda")

    return {
        "mem_mb": mem_mb,
        "runtime": runtime,
        "gpu": gpu,
        "slurm_extra": "--exclusive",
    }
