"""The lab's prompt (before step 1): validation texts joined, encoded and cut, bos in front.
Needs only the tokenizer, so the prompt job does not import PyTorch."""

from __future__ import annotations

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
