"""What every Snakemake `script:` entry point shares: logging to the rule's log file,
one-line errors for bad input, and loading models from the rule's params."""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

import torch

from kvlab.checkpoint import CheckpointError, load_model
from kvlab.lab import DataError, resolve_device, resolve_dtype
from kvlab.tokenizer import TokenizerError, load_tokenizer

# Errors whose message already says what is wrong and where: shown as one line, no traceback.
USER_ERRORS = (CheckpointError, TokenizerError, DataError, ValueError, FileNotFoundError)

log = logging.getLogger("kvlab")


def run(snakemake, main) -> None:
    """Call `main(snakemake)` with the log file set up; turn bad input into a one-line error and exit 1."""
    log_path = Path(snakemake.log[0]) if snakemake.log else None
    handlers = [logging.StreamHandler(sys.stderr)]
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handlers = [logging.FileHandler(log_path, mode="w", encoding="utf-8")]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", handlers=handlers, force=True)
    # One torch thread in every job: the model is tiny, so a second thread buys little and, on a
    # busy machine, makes timings erratic; results also stay the same whatever --cores is.
    # Timing rules still reserve every core (threads:) so no other job shares the CPU with them.
    torch.set_num_threads(1)
    try:
        main(snakemake)
    except USER_ERRORS as err:
        message = f"kvlab error in rule {snakemake.rule}: {err}"
        log.error(message)
        print(message, file=sys.stderr)
        sys.exit(1)
    except Exception:
        log.error(traceback.format_exc())
        raise


def check_vocab(tokenizer, model, checkpoint) -> None:
    """Every id the tokenizer can produce must have a row in the checkpoint's embedding.
    (A model vocabulary larger than the tokenizer's is fine: padded vocabularies are common.)"""
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"tokenizer {tokenizer.folder} has {tokenizer.vocab_size} ids but checkpoint {checkpoint} "
            f"holds only vocab_size={model.config.vocab_size}: they do not belong together"
        )


def tokenizer_folder(snakemake):
    return Path(snakemake.input.tokenizer).parent


def load_tokenizer_input(snakemake):
    return load_tokenizer(tokenizer_folder(snakemake))


def load_model_input(snakemake, key: str, tokenizer=None):
    """Load the checkpoint named by input `key` with the rule's device/dtype/overrides params,
    checked against the tokenizer when one is given."""
    params = snakemake.params
    device = resolve_device(params.device)
    model = load_model(snakemake.input[key], device=device, dtype=resolve_dtype(params.dtype), **params.overrides)
    log.info("loaded %s on %s: %s", snakemake.input[key], device, model.config.to_dict())
    if tokenizer is not None:
        check_vocab(tokenizer, model, snakemake.input[key])
    return model, device
