"""The workflow's checkpoints: what the `inspect_checkpoint` job finds in one, and every model job
loading a checkpoint as that inspection says.

An inspection (results/checkpoints/NAME.json) holds the file's layout, its whole config with the
source of every field (kvlab.engine.architecture), the parameter count, whether the lab's tokenizer
fits it, and, for a MiniMind2-layout file whose head count nobody stated, the evidence of the
measurement that chose it. A checkpoint the lab cannot use stops the run in that job, with one line
naming the config key, before any job that would load it.
"""

from __future__ import annotations

import logging

from kvlab.engine.architecture import (
    OVERRIDE_KEY,
    Architecture,
    ArchitectureError,
    HeadCountUnknown,
    infer_architecture,
    measure_head_count,
    vocab_rows,
)
from kvlab.engine.checkpoint import CheckpointError, load_model, read_state_dict
from kvlab.engine.data import read_texts
from kvlab.engine.device import resolve_device, resolve_dtype
from kvlab.engine.tokenizer import Tokenizer, vocab_mismatch
from kvlab.io import read_json

log = logging.getLogger("kvlab")

# When a MiniMind2 file's head count must be measured: the first validation documents (the lab
# prompt's, by default), each bos first and cut to a window short enough for any model's training.
HEAD_COUNT_DOCS = 6
HEAD_COUNT_WINDOW = 64


def inspect_checkpoint(path, config_key: str, overrides: dict, tokenizer: Tokenizer, val_data,
                       compared_as: str | None = None, built: dict | None = None) -> dict:
    """The inspection of the checkpoint at `path`, which the config names under `config_key` ("pretrain",
    "sft", or "compare" for the entry named `compared_as`) with `overrides` (its model_overrides).
    The lab's own checkpoints must fit the tokenizer; a compared one is measured on token ids only, so
    whether it fits is recorded, not required. A head count is measured on validation text
    (`val_data`, a pretrain jsonl). `built`: for the embedded default's checkpoints, what they were
    built with (config default_model.model), the source of what the file cannot show.

    Raises ValueError with one line naming the config key when the file is no MiniMind checkpoint,
    the tokenizer does not belong to a lab checkpoint, or the head count can be neither read, stated
    nor measured."""
    where = f"config key '{config_key}'" + (f" ({compared_as})" if compared_as else "")
    heads_where = f"{where}.{OVERRIDE_KEY}" if compared_as else f"config key '{OVERRIDE_KEY}'"
    try:
        state_dict = read_state_dict(path)
        mismatch = vocab_mismatch(tokenizer.vocab_size, vocab_rows(state_dict))
        if mismatch and not compared_as:
            raise CheckpointError(f"tokenizer {tokenizer.folder} and checkpoint {path} do not belong together: "
                                  f"{mismatch}")
        head_count = None
        try:
            architecture = infer_architecture(state_dict, overrides, built=built)
        except HeadCountUnknown as unknown:
            if mismatch:
                raise ValueError(f"{heads_where}: {path}: {unknown}; kvlab cannot measure it "
                                 f"with the lab's tokenizer, which does not belong to this checkpoint") from None
            windows = [([tokenizer.bos_id] + tokenizer.encode(text))[:HEAD_COUNT_WINDOW]
                       for text in read_texts(val_data)[:HEAD_COUNT_DOCS]]
            head_count = measure_head_count(state_dict, windows, overrides)
            head_count["losses"] = {str(heads): loss for heads, loss in head_count["losses"].items()}
            if head_count["chosen"] is None:
                raise ValueError(f"{heads_where}: {path}: {unknown}; "
                                 f"measured: {head_count['reason']}") from None
            architecture = infer_architecture(state_dict, overrides, {"num_attention_heads": head_count["chosen"]},
                                              built)
    except CheckpointError as err:  # its message names the file
        raise ValueError(f"{where}: {err}") from None
    except ArchitectureError as err:
        raise ValueError(f"{where}: {path}: {err}") from None
    return {
        "checkpoint": str(path),
        "model_overrides": dict(overrides),
        **architecture.to_json(),
        "parameters": architecture.config.parameter_count(),
        "head_count": head_count,
        "tokenizer": {"folder": str(tokenizer.folder), "vocab_size": tokenizer.vocab_size, "fits": not mismatch,
                      "reason": mismatch},
    }


def load_inspected(path, inspection: dict, device_name: str, dtype_name: str):
    """The checkpoint at `path` built as its inspection says, on the configured device and dtype, with
    the log saying where each architecture field came from. Returns (model, device)."""
    device = resolve_device(device_name)
    architecture = Architecture.from_json(inspection)
    model = load_model(path, device=device, dtype=resolve_dtype(dtype_name), architecture=architecture)
    sources = architecture.sources
    log.info("loaded %s on %s (%s layout): %s", path, device, architecture.layout,
             {field: f"{value} ({sources[field]})" for field, value in architecture.to_dict()["config"].items()})
    return model, device


def load_model_input(snakemake, name: str):
    """The checkpoint of input `name` (e.g. "pretrain"), built as input `{name}_inspected` says, with
    the rule's device and dtype params. Returns (model, device)."""
    inspection = read_json(snakemake.input[f"{name}_inspected"])
    return load_inspected(snakemake.input[name], inspection, snakemake.params.device, snakemake.params.dtype)
