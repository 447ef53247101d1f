# Config validation and input functions shared by every rule file.
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvlab.config import config_error

try:
    validate(config, schema="../schemas/config.schema.yaml")
except WorkflowError:
    # Snakemake's message is a page of schema dump; say in one line which key is wrong and why.
    raise WorkflowError(
        config_error(config, workflow.source_path("../schemas/config.schema.yaml"))
    ) from None

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
            raise WorkflowError(
                f"config key 'tokenizer': {path} is not a folder with a tokenizer.json"
            )
    elif not path.is_file():
        raise WorkflowError(f"config key '{key}': file not found: {path}")
    return str(path)


def input_path(key):
    """The path of an input: the user's file, or the embedded default's output."""
    return _configured_path(key) if config[key] else DEFAULT_INPUTS[key]


def tokenizer_inputs(wildcards=None):
    """The tokenizer folder's files, named, for `unpack()`: Snakemake tracks files, not folders."""
    folder = input_path("tokenizer")
    files = {"tokenizer": f"{folder}/tokenizer.json"}
    if not config["tokenizer"] or Path(folder, "tokenizer_config.json").is_file():
        files["tokenizer_config"] = f"{folder}/tokenizer_config.json"
    return files


def model_params():
    """The params every job that loads a checkpoint passes on."""
    return dict(
        device=config["device"],
        dtype=config["dtype"],
        overrides=config["model_overrides"],
    )
