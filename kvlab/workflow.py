"""What every Snakemake `script:` entry point shares: logging to the rule's log file,
one-line errors for bad input, and loading models from the rule's params; and what the
rule files ask of a user's checkpoint before any job runs (`describe_checkpoint`).

PyTorch is imported only where a model is loaded, so that jobs which load none (the corpus,
the tokenizer, the prompt, figures, the report, the check) start without it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import signal
import sys
import traceback
from contextlib import ExitStack, redirect_stderr
from pathlib import Path

from kvlab.engine.tokenizer import load_tokenizer, vocab_mismatch

# Errors whose message already says what is wrong and where: shown as one line, no traceback.
# (CheckpointError, TokenizerError, DataError, ArchitectureError and CheckFailed are ValueErrors.)
USER_ERRORS = (ValueError, FileNotFoundError)
# When a MiniMind2 file's head count must be measured: each of the first lab.prompt.n_docs validation
# documents, bos first, cut to this many tokens (short enough for any model's training length).
HEAD_COUNT_WINDOW = 64

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
        # One torch thread in every job that uses torch (its script imported it by now): the model is
        # tiny, so a second thread buys little and, on a busy machine, makes timings erratic; results
        # also stay the same whatever --cores is. Timing rules still reserve every core (threads:).
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        # A scheduler stops a job with SIGTERM (scancel, a time limit) before it kills it: exit the
        # Python way, so an output being written is removed, never left half-written.
        signal.signal(signal.SIGTERM, exit_on_sigterm)
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


def exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def check_vocab(tokenizer, model, checkpoint) -> None:
    """The tokenizer and the checkpoint must belong together (kvlab.engine.tokenizer.vocab_mismatch)."""
    reason = vocab_mismatch(tokenizer.vocab_size, model.config.vocab_size)
    if reason:
        raise ValueError(f"tokenizer {tokenizer.folder} and checkpoint {checkpoint} do not belong together: {reason}")


def load_tokenizer_input(snakemake):
    """The tokenizer folder that holds input `tokenizer` (its tokenizer.json)."""
    return load_tokenizer(Path(snakemake.input.tokenizer).parent)


def load_model_input(snakemake, key: str, tokenizer=None):
    """Load the checkpoint named by input `key` with the rule's device/dtype/overrides params (and the
    head count measured at parse time, if any), checked against the tokenizer when one is given."""
    p = snakemake.params
    model, device = load_checkpoint(snakemake.input[key], p.device, p.dtype, p.overrides, p.measured.get(key, {}))
    if tokenizer is not None:
        check_vocab(tokenizer, model, snakemake.input[key])
    return model, device


def load_checkpoint(path, device_name: str, dtype_name: str, overrides: dict, measured: dict | None = None):
    """A MiniMind checkpoint on the configured device and dtype, with the log saying where each
    architecture field came from. Returns (model, device)."""
    from kvlab.engine.checkpoint import load_model
    from kvlab.engine.device import resolve_device, resolve_dtype

    device = resolve_device(device_name)
    model = load_model(path, device=device, dtype=resolve_dtype(dtype_name), measured=measured, **overrides)
    sources = model.architecture.sources
    log.info("loaded %s on %s (%s layout): %s", path, device, model.architecture.layout,
             {field: f"{value} ({sources[field]})" for field, value in model.architecture.to_dict()["config"].items()})
    return model, device


def describe_checkpoint(path, overrides: dict, tokenizer_dir=None, val_path=None, n_docs: int = 1,
                        cache_dir=None) -> dict:
    """What the rule files must know about a user's checkpoint before any job runs: its layout and
    vocabulary, whether it fits the configured tokenizer, and, for a MiniMind2-layout file whose head
    count nobody stated, the head count measured on the validation text (kvlab.engine.architecture).

    Raises ValueError with one line when the tokenizer does not belong to the checkpoint or the head
    count can be neither read, stated nor measured. The answer is cached in `cache_dir` by the files'
    sizes and times, so a dry run does not load PyTorch again for the same files."""
    files = [Path(path)] + [Path(p) for p in (tokenizer_dir and Path(tokenizer_dir) / "tokenizer.json", val_path) if p]
    key = json.dumps([[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
                     + [overrides, n_docs], sort_keys=True)
    cache = Path(cache_dir) / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json" if cache_dir else None
    if cache is not None and cache.is_file():
        description = json.loads(cache.read_text(encoding="utf-8"))
    else:
        description = _describe(path, overrides, tokenizer_dir, val_path, n_docs)
        if cache is not None:
            from kvlab.io import write_json_atomic

            write_json_atomic(cache, description)
    if description.get("error"):
        raise ValueError(description["error"])
    return description


def _describe(path, overrides, tokenizer_dir, val_path, n_docs) -> dict:
    from kvlab.engine.architecture import (OVERRIDE_KEY, ArchitectureError, HeadCountUnknown, infer_architecture,
                                           measure_head_count)
    from kvlab.engine.checkpoint import read_state_dict
    from kvlab.engine.data import read_texts

    state_dict = read_state_dict(path)
    tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir else None
    description = {"head_count": None, "measured": {}, "error": None}
    try:
        architecture = infer_architecture(state_dict, overrides)
    except HeadCountUnknown as unknown:
        if tokenizer is None or val_path is None:
            description["error"] = (f"config key '{OVERRIDE_KEY}': {path}: {unknown}; or configure `tokenizer` "
                                    f"and `val_data` so that kvlab can measure it")
            return description
        windows = [([tokenizer.bos_id] + tokenizer.encode(text))[:HEAD_COUNT_WINDOW]
                   for text in read_texts(val_path, n_docs)]
        head_count = measure_head_count(state_dict, windows, overrides)
        head_count["losses"] = {str(heads): loss for heads, loss in head_count["losses"].items()}
        description["head_count"] = head_count
        if head_count["chosen"] is None:
            description["error"] = f"config key '{OVERRIDE_KEY}': {path}: {unknown}; measured: {head_count['reason']}"
            return description
        description["measured"] = {"num_attention_heads": head_count["chosen"]}
        architecture = infer_architecture(state_dict, overrides, description["measured"])
    except ArchitectureError as err:
        description["error"] = f"{path}: {err}"
        return description
    description["layout"] = architecture.layout
    description["vocab_size"] = architecture.config.vocab_size
    if tokenizer is not None:
        reason = vocab_mismatch(tokenizer.vocab_size, architecture.config.vocab_size)
        if reason:
            description["error"] = f"tokenizer {tokenizer_dir} and checkpoint {path} do not belong together: {reason}"
    return description
