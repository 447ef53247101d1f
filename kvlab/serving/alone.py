"""The contract every served token is held to: what MiniMind's `generate` gives a prompt alone.

The engine serves a request among others, in pieces, through a paged cache and a compiled step; a
user of `generate` runs it alone. `generate_alone` is that run, so that the engine's tests, the trace
rule (kvlab.measure.serving_trace) and tools/serve_demo.py compare the same thing.
"""

from __future__ import annotations

import torch

from kvlab.engine import fast
from kvlab.serving.request import SamplingParams


def generate_alone(model, prompt: list[int], params: SamplingParams, kv_cache: str = "cat",
                   compiled: bool = False, kv_dtype: str = "float32") -> list[list[int]]:
    """What MiniMind's `generate` gives `prompt` alone with the request's knobs (after
    `torch.manual_seed(seed)` when it has one): each row's new tokens, up to and with its first eos, as
    the engine returns them. `kv_cache` and `kv_dtype` are generate's (an engine whose pool stores
    `kv_dtype` is held against generate's cache in the same); `compiled` runs kvlab.engine.fast.generate,
    the fastest single-request path, which gives the same tokens."""
    if params.seed is not None:
        torch.manual_seed(params.seed)
    knobs = dict(max_new_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p,
                 top_k=params.top_k, eos_token_id=params.eos_token_id, num_return_sequences=params.n,
                 do_sample=params.do_sample, repetition_penalty=params.repetition_penalty)
    ids = torch.tensor([prompt], device=model.lm_head.weight.device)
    out = fast.generate(model, ids, **knobs) if compiled else model.generate(ids, kv_cache=kv_cache, kv_dtype=kv_dtype, **knobs)
    eos = params.eos_token_id
    return [row[: row.index(eos) + 1] if eos is not None and eos in row else row
            for row in out[:, len(prompt):].tolist()]
