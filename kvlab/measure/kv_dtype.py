"""The cache in fewer bits, measured (rule kv_dtype, results/kv_dtype.csv): for each dtype the cache may
store (kvlab.engine.kv_dtype), what it saves and what it changes, on the lab's pretrained model.

  bytes           the cache after the lab's step-4 tokens, weighed, against the formula (scales counted)
  requests        how many requests' caches fit a memory budget: the lab's model at the sheet's length
                  (prompt + step 3's N), MiniMind's own size at `minimind_context` (formula)
  tokens          greedy, the lab's prompt, N new tokens: the same as float32's cache gives, or the first
                  new token that differs, at each N
  logits          float32's greedy sequence fed once with the cache in the dtype and once in float32: the
                  largest logit difference and the KL divergence (float32's against the dtype's) over
                  the positions that pick the new tokens
  top-p           step 6's survivors at the sheet's p values after its two prefixes, the logits read
                  from what the cache stores
  serving         one seeded trace, every request arriving at once, served by the engine the eager
                  way from a pool of the bytes of `pool_tokens` float32 tokens (a budget sized to the
                  model): the blocks that budget buys at the dtype, the most requests running at
                  once, output tokens a second (median and quartiles of `repeats` rounds, the dtypes
                  in turn each round), and every request held against `generate` alone with its
                  cache in the same dtype

Float32 is the lab's cache itself: its row is the baseline, every lab result unchanged.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn.functional as F

from kvlab.engine.config import MiniMindConfig
from kvlab.engine.kv_dtype import KV_DTYPES, cache_for
from kvlab.engine.model import MiniMindForCausalLM
from kvlab.facts.formulas import GIB
from kvlab.facts.timing import summary
from kvlab.facts.tokens import first_difference
from kvlab.measure import steps
from kvlab.measure.capacity import weighed
from kvlab.measure.serving_run import serve
from kvlab.measure.serving_workloads import TraceRequest, check_fits
from kvlab.serving import ServingConfig, generate_alone

log = logging.getLogger("kvlab")


def greedy_ids(model: MiniMindForCausalLM, prompt: list[int], new_tokens: int, kv_dtype: str, device) -> list[int]:
    ids = torch.tensor([prompt], device=device)
    out = model.generate(ids, max_new_tokens=new_tokens, kv_dtype=kv_dtype, **steps.GREEDY_NO_EOS)
    return out[0, len(prompt):].tolist()


def logit_drift(model: MiniMindForCausalLM, sequence: list[int], prompt_len: int, kv_dtype: str, device) -> dict:
    """`sequence` fed once with a float32 cache and once with one in `kv_dtype`: over the positions that
    pick the new tokens, the largest |logit difference| and the KL divergence KL(float32 || dtype) in
    nats, its largest and its mean."""
    ids = torch.tensor([sequence], device=device)
    with torch.inference_mode():
        reference = model(ids, use_cache=True).logits[0, prompt_len - 1:-1].float()
        stored = model(ids, past_key_values=cache_for(model, kv_dtype), use_cache=True).logits[0, prompt_len - 1:-1].float()
    kl = F.kl_div(F.log_softmax(stored, -1), F.log_softmax(reference, -1), log_target=True, reduction="none").sum(-1)
    return {"max_logit_diff": float((stored - reference).abs().max()), "max_kl": float(kl.max()),
            "mean_kl": float(kl.mean())}


def survivors(model: MiniMindForCausalLM, prefixes: list[list[int]], ps, kv_dtype: str, device) -> dict:
    """Step 6 with the cache in `kv_dtype`: the top-p survivors after each prefix ([bos] + its ids), by
    column `survivors_{prefix number}_{p}`."""
    found = {}
    for number, prefix in enumerate(prefixes, start=1):
        ids = torch.tensor([prefix], device=device)
        with torch.inference_mode():
            logits = model(ids, past_key_values=cache_for(model, kv_dtype), use_cache=True).logits[:, -1, :].float()
        found |= {f"survivors_{number}_{p}": kept for p, kept in steps.top_p_survivors(logits, ps).items()}
    return found


def pool_config(model: MiniMindForCausalLM, kv_dtype: str, pool_tokens: int, block_size: int, max_batched_tokens: int,
                requests: int) -> ServingConfig:
    """The eager engine whose pool is what the bytes of `pool_tokens` tokens of float32 cache buy at `kv_dtype`
    (a budget sized to the model); as many slots as requests, so that only the pool limits how many run at once."""
    budget = pool_tokens * model.config.kv_bytes_per_token("float32")
    num_blocks = budget // (block_size * model.config.kv_bytes_per_token(kv_dtype))
    return ServingConfig(num_blocks=max(num_blocks, 1), block_size=block_size, max_num_seqs=requests,
                         max_num_batched_tokens=max_batched_tokens, compile=False, matmuls="fused", kv_dtype=kv_dtype)


def served(model: MiniMindForCausalLM, trace: list[TraceRequest], dtypes, pool_tokens: int, block_size: int,
           max_batched_tokens: int, repeats: int) -> dict[str, dict]:
    """The trace served at each dtype, `repeats` rounds, the dtypes in turn within each round."""
    configs = {d: pool_config(model, d, pool_tokens, block_size, max_batched_tokens, len(trace)) for d in dtypes}
    for kv_dtype, config in configs.items():
        check_fits(trace, config, "extras.kv_dtype.pool_tokens")
    runs: dict[str, list] = {d: [] for d in dtypes}
    for kv_dtype in dtypes:  # a round untimed: the first calls of each shape
        serve(model, trace, configs[kv_dtype], kv_dtype)
    for _ in range(repeats):
        for kv_dtype in dtypes:
            runs[kv_dtype].append(serve(model, trace, configs[kv_dtype], kv_dtype))
    found = {}
    for kv_dtype, done in runs.items():
        alone = [generate_alone(model, request.prompt, request.params, kv_dtype=kv_dtype) for request in trace]
        first = done[0]
        tokens = sum(len(row) for output in first.outputs for row in output.samples)
        seconds = summary([run.wall_s for run in done])
        found[kv_dtype] = {
            "pool_blocks": first.config.num_blocks, "pool_bytes": first.config.num_blocks * block_size
            * model.config.kv_bytes_per_token(kv_dtype),
            "peak_running": max(held["running"] for held in first.held), "preemptions": first.stats.preemptions,
            "steps": len(first.steps), "output_tokens": tokens,
            "tokens_per_s": tokens / seconds["median_s"], "tokens_per_s_low": tokens / seconds["q3_s"],
            "tokens_per_s_high": tokens / seconds["q1_s"], "runs": seconds["n"], "iqr_share": seconds["iqr_share"],
            "unstable": seconds["unstable"],
            "mismatches": sum(output.samples != tokens_alone for output, tokens_alone in zip(first.outputs, alone)),
            "checked": len(trace)}
        log.info("%s: a pool of %d blocks ran at most %d requests at once, %.0f tokens/s (%.0f-%.0f), %d of %d "
                 "requests differ from generate alone", kv_dtype, found[kv_dtype]["pool_blocks"],
                 found[kv_dtype]["peak_running"], found[kv_dtype]["tokens_per_s"], found[kv_dtype]["tokens_per_s_low"],
                 found[kv_dtype]["tokens_per_s_high"], found[kv_dtype]["mismatches"], len(trace))
    return found


def measure(model: MiniMindForCausalLM, prompt: list[int], prefixes: list[list[int]], ps, settings: dict,
            trace: list[TraceRequest], minimind: MiniMindConfig, device) -> list[dict]:
    """One row per dtype (kvlab.engine.kv_dtype.KV_DTYPES, float32 first): see the module. `settings` is
    the config's extras.kv_dtype with the lab's numbers: tokens (step 4's), new_tokens (the N compared,
    step 3's among them), lab_new_tokens (step 3's), budget_gib, minimind_name and minimind_context (the
    architecture `minimind`'s), seed, pool_tokens, block_size, max_batched_tokens, repeats."""
    s = settings
    longest = max(s["new_tokens"])
    baseline = greedy_ids(model, prompt, longest, "float32", device)
    lab_context = len(prompt) + s["lab_new_tokens"]
    budget = s["budget_gib"] * GIB
    serving = served(model, trace, KV_DTYPES, s["pool_tokens"], s["block_size"], s["max_batched_tokens"], s["repeats"])
    rows = []
    for kv_dtype in KV_DTYPES:
        per_token = model.config.kv_bytes_per_token(kv_dtype)
        ids = baseline if kv_dtype == "float32" else greedy_ids(model, prompt, longest, kv_dtype, device)
        row = {"kv_dtype": kv_dtype, "bytes_per_token": per_token, "tokens": s["tokens"],
               "bytes_formula": s["tokens"] * per_token,
               "bytes_measured": weighed(model, kv_dtype, s["tokens"], s["seed"], device),
               "budget_gib": s["budget_gib"], "lab_context": lab_context,
               "fits_lab": math.floor(budget / (per_token * lab_context)),
               "minimind": s.get("minimind_name", "MiniMind"), "minimind_bytes_per_token": minimind.kv_bytes_per_token(kv_dtype),
               "minimind_context": s["minimind_context"],
               "fits_minimind": math.floor(budget / (minimind.kv_bytes_per_token(kv_dtype) * s["minimind_context"]))}
        for n in s["new_tokens"]:
            differs = first_difference(ids[:n], baseline[:n])
            row[f"same_{n}"] = differs is None
            row[f"first_diff_{n}"] = differs
        row |= logit_drift(model, prompt + baseline, len(prompt), kv_dtype, device)
        row |= survivors(model, prefixes, ps, kv_dtype, device)
        row |= serving[kv_dtype]
        log.info("%s: %d bytes a token, %d requests of %d tokens in %s GiB; greedy %s", kv_dtype, per_token,
                 row["fits_lab"], lab_context, s["budget_gib"],
                 ", ".join(f"N = {n}: " + ("same" if row[f"same_{n}"] else f"differs from new token {row[f'first_diff_{n}']}")
                           for n in s["new_tokens"]))
        rows.append(row)
    return rows
