"""Train a byte-level BPE tokenizer the way MiniMind does, saved as a Hugging Face folder.

Special tokens come first, so their ids are MiniMind's:
<|endoftext|> = 0 (pad/unk), <|im_start|> = 1 (bos), <|im_end|> = 2 (eos).
The folder holds tokenizer.json and a tokenizer_config.json with a ChatML template.

The same text gives byte-identical files on every run (checked by the tests,
in separate processes). Training is also kept single-threaded
(TOKENIZERS_PARALLELISM / RAYON_NUM_THREADS) so that no thread scheduling can
ever reach the merge order, and tokenizer_config.json is written with sorted keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvlab.engine.tokenizer import CHATML_TEMPLATE
from kvlab.io import write_text_atomic

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The tokenizer writes the same ChatML template that kvlab.engine.tokenizer falls back to.
CHAT_TEMPLATE = CHATML_TEMPLATE


def _single_threaded() -> None:
    # Must happen before tokenizers' Rayon pool starts (at its first parallel work, not at import).
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def iter_texts(text_files):
    """The texts of MiniMind jsonl files: a pretrain line's "text", a chat line's
    "role\\ncontent" for every message (so role names like "assistant" get merged too)."""
    for path in text_files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                record = json.loads(line)
                if "text" in record:
                    yield record["text"]
                for message in record.get("conversations", []):
                    yield f"{message['role']}\n{message['content']}"


def tokenizer_config() -> dict:
    added = {
        str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, tok in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
        "bos_token": "<|im_start|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "legacy": True,
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "spaces_between_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<|endoftext|>",
    }


def train_tokenizer(text_files, vocab_size: int, out_dir) -> dict:
    """Train on the jsonl files, write out_dir/tokenizer.json and tokenizer_config.json.

    Returns a small summary (vocab size, merges). Each file is written atomically.
    """
    _single_threaded()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL_TOKENS,
    )
    tokenizer.train_from_iterator(iter_texts(text_files), trainer=trainer)
    tokenizer.decoder = decoders.ByteLevel()
    for i, tok in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(tok) != i:
            raise RuntimeError(f"special token {tok} got id {tokenizer.token_to_id(tok)}, expected {i}")

    out_dir = Path(out_dir)
    text = tokenizer.to_str(pretty=True)  # the library's own layout: vocab in id order, merges in rank order
    write_text_atomic(out_dir / "tokenizer.json", text)
    write_text_atomic(out_dir / "tokenizer_config.json",
                      json.dumps(tokenizer_config(), ensure_ascii=False, indent=2, sort_keys=True) + "\n")
    return {"vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
            "merges": len(json.loads(text)["model"]["merges"])}
