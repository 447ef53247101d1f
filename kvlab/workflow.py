"""What every Snakemake `script:` entry point shares: logging to the rule's log file,
one-line errors for bad input, and loading models from the rule's params."""

from __future__ import annotations

import logging
import sys
import traceback
from contextlib import ExitStack, redirect_stderr
from pathlib import Path

import torch

from kvlab.engine.checkpoint import CheckpointError, load_model
from kvlab.engine.data import DataError
from kvlab.engine.device import resolve_device, resolve_dtype
from kvlab.engine.tokenizer import TokenizerError, load_tokenizer

# Errors whose message already says what is wrong and where: shown as one line, no traceback.
USER_ERRORS = (CheckpointError, TokenizerError, DataError, ValueError, FileNotFoundError)

log = logging.getLogger("kvlab")


def run(snakemake, main) -> None:
    """Call `main(snakemake)` with its log set up: the logger and everything written to stderr
    (library warnings, progress) go, in order, to the rule's log file. Bad input becomes a
    one-line error on the console (and in the log) and exit status 1."""
    console = sys.stderr
    with ExitStack() as stack:
        stream = console
        if snakemake.log:
            log_path = Path(snakemake.log[0])
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # one handle for both, so the logger's lines and stray stderr never overwrite each other
            stream = stack.enter_context(open(log_path, "w", encoding="utf-8", buffering=1))
            stack.enter_context(redirect_stderr(stream))
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                            handlers=[logging.StreamHandler(stream)], force=True)
        # One torch thread in every job: the model is tiny, so a second thread buys little and, on a
        # busy machine, makes timings erratic; results also stay the same whatever --cores is.
        # Timing rules still reserve every core (threads:) so no other job shares the CPU with them.
        torch.set_num_threads(1)
        try:
            main(snakemake)
        except USER_ERRORS as err:
            message = f"kvlab error in rule {snakemake.rule}: {err}"
            log.error(message)
            print(message, file=console)
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


def load_tokenizer_input(snakemake):
    """The tokenizer folder that holds input `tokenizer` (its tokenizer.json)."""
    return load_tokenizer(Path(snakemake.input.tokenizer).parent)


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
