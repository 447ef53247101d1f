"""How many requests' KV caches fit in a memory budget: the lab's step 4 turned into serving capacity.

Bytes per token come from the lab's formula (MiniMindConfig.kv_bytes_per_token) and from a
cache actually measured (step 4's input, `weighed`) for each architecture and each dtype the cache may
store (kvlab.engine.kv_dtype; the model computes in its own).
The budget is memory for the cache alone; a server such as vLLM first takes the
weights and activations off the card's memory, and allocates the cache in blocks.
"""

from __future__ import annotations

import logging
import math

import torch

from kvlab.engine.config import KV_BYTES_PER_ELEMENT, KV_SCALE_BYTES, MiniMindConfig
from kvlab.engine.kv_dtype import cache_for
from kvlab.engine.model import MiniMindForCausalLM, kv_cache_bytes
from kvlab.facts.compare import architecture_config
from kvlab.facts.formulas import GIB
from kvlab.measure import steps

log = logging.getLogger("kvlab")

# Only the cache's shape matters here: a short position table keeps the throwaway models small.
MEASURE_POSITIONS = 256


def vllm_line(cache_tokens: int, context_tokens: int, concurrency: float) -> str:
    """vLLM's start-up log line (vllm/v1/core/kv_cache_utils.py), for a cache of `cache_tokens`."""
    return (f"KV cache size: {cache_tokens:,} tokens, "
            f"Maximum concurrency for {context_tokens:,} tokens per request: {concurrency:.2f}x")


def architecture_model(arch: dict, positions: int = MEASURE_POSITIONS) -> MiniMindForCausalLM:
    """A MiniMind of the given architecture with seeded random weights (PyTorch's default init, seed 0),
    for measurements that do not depend on the weights' values: the cache's size, the cost of a step."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return MiniMindForCausalLM(architecture_config(arch, max_position_embeddings=positions)).eval()


def weighed(model: MiniMindForCausalLM, kv_dtype: str, tokens: int, seed: int, device) -> int:
    """Bytes of `model`'s cache kept in `kv_dtype` (kvlab.engine.kv_dtype) after `tokens` seeded random ids
    (step 4's input, kvlab.measure.steps.kv_bytes_input)."""
    ids = steps.kv_bytes_input(model, tokens, seed, device)
    with torch.inference_mode():
        return kv_cache_bytes(model(ids, past_key_values=cache_for(model, kv_dtype), use_cache=True).past_key_values)


def bytes_per_token(model: MiniMindForCausalLM, dtype: str, tokens: int, seed: int, device) -> dict:
    """The bytes per token of `model`'s cache kept in `dtype` ("float32", "float16", "int8", ...; the
    model computes in its own): the formula, and a cache measured after feeding `tokens` random ids
    (divided by `tokens`)."""
    measured = weighed(model.to(device), dtype, tokens, seed, device)
    return {"formula": model.config.kv_bytes_per_token(dtype), "measured": measured / tokens}


def capacity_rows(name: str, config: MiniMindConfig, dtype: str, per_token: dict, contexts, budgets_gib) -> list[dict]:
    """One row per (context length, budget): requests whose whole cache fits, worded as vLLM does."""
    rows = []
    for budget_gib in budgets_gib:
        budget_bytes = int(budget_gib * GIB)
        cache_tokens = budget_bytes // per_token["formula"]
        for context in contexts:
            per_request = per_token["formula"] * context
            concurrency = budget_bytes / per_request
            rows.append({
                "model": name,
                "dtype": dtype,
                "layers": config.num_hidden_layers,
                "kv_heads": config.num_key_value_heads,
                "head_dim": config.head_dim,
                "bytes_per_element": KV_BYTES_PER_ELEMENT[dtype],
                "scale_bytes": KV_SCALE_BYTES.get(dtype, 0),
                "bytes_per_token_formula": per_token["formula"],
                "bytes_per_token_measured": per_token["measured"],
                "budget_gib": budget_gib,
                "context_tokens": context,
                "bytes_per_request": per_request,
                "max_requests": math.floor(concurrency),
                "max_concurrency": concurrency,
                "cache_tokens": cache_tokens,
                "vllm_line": vllm_line(cache_tokens, context, concurrency),
            })
    return rows


def kv_capacity(lab_model: MiniMindForCausalLM, architectures, dtypes, contexts, budgets_gib, tokens: int,
                seed: int, device) -> list[dict]:
    """Rows for the lab's model and every configured architecture, in every dtype."""
    models = [("lab pretrain", lab_model)] + [(arch["name"], architecture_model(arch)) for arch in architectures]
    rows = []
    for name, model in models:
        for dtype in dtypes:
            per_token = bytes_per_token(model, dtype, tokens, seed, device)
            log.info("%s %s: %s bytes per token by the formula, %s measured", name, dtype,
                     per_token["formula"], per_token["measured"])
            rows += capacity_rows(name, model.config, dtype, per_token, contexts, budgets_gib)
    return rows
