"""Prompts from validation text: the lab's (before step 1: texts joined, encoded and cut, bos in front),
and one a document for the serving measurements. Needs only the tokenizer, so the prompt job does not
import PyTorch."""

from __future__ import annotations

import math

from kvlab.engine.data import DataError
from kvlab.engine.tokenizer import Tokenizer


def make_prompt(tokenizer: Tokenizer, texts: list[str], cut_tokens: int) -> dict:
    """Join texts with single spaces, encode without special tokens, cut, put bos in front."""
    text = " ".join(texts)
    ids = tokenizer.encode(text)
    if len(ids) < cut_tokens:
        raise DataError(
            f"the first {len(texts)} validation documents give {len(ids)} tokens, fewer than cut_tokens={cut_tokens}"
        )
    prompt_ids = [tokenizer.bos_id] + ids[:cut_tokens]
    return {"ids": prompt_ids, "prompt_len": len(prompt_ids), "n_docs": len(texts), "cut_tokens": cut_tokens, "text": text}


def document_prompts(tokenizer: Tokenizer, texts: list[str], count: int, cap: int, share: float = 1.0,
                     source: str = "validation data", key: str = "the count") -> list[list[int]]:
    """[bos] + the first `share` of each document's tokens (at least one), at most `cap` tokens in all,
    for the first `count` documents that encode to any token. Refused, naming the file (`source`) and
    the config key that asked (`key`), when there are fewer."""
    prompts = []
    for text in texts:
        ids = tokenizer.encode(text)
        if ids:
            keep = max(1, math.ceil(len(ids) * share))
            prompts.append([tokenizer.bos_id] + ids[:keep][: cap - 1])
        if len(prompts) == count:
            return prompts
    raise ValueError(f"{source}: {len(prompts)} non-empty documents, config key '{key}' needs {count}")
