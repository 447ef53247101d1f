"""Many requests at once, beyond the lab sheet: what a batch does to throughput, and what the way a
server reserves the cache does to how many requests fit.

  * batch_bench  llama.cpp's llama-batched-bench on the lab's model. For each batch size B, two
                 modes: one prompt shared by every row (MiniMind's `num_return_sequences`, which
                 copies the prompt into each row) and B different validation prompts, left-padded
                 with the attention mask. Each forward call of MiniMind's `generate` is timed (the
                 first is the prefill), the cache is weighed after the run, and every row's greedy
                 tokens are held against the same prompt generated alone.
  * kv_waste     real requests (validation documents continued by sampling until eos or a cap) and
                 four ways of reserving their caches, with the bytes split as the vLLM paper's
                 Figure 2 splits them (Kwon et al., SOSP 2023): token states, reservation (slots held
                 for tokens still to come) and internal fragmentation (slots never used).
"""

from __future__ import annotations

import logging
import math

import torch

from kvlab.engine.device import dtype_name, timing_context
from kvlab.engine.model import MiniMindForCausalLM, kv_cache_bytes, left_pad
from kvlab.engine.tokenizer import Tokenizer
from kvlab.lab import steps, timing
from kvlab.lab.formulas import fits_column

log = logging.getLogger("kvlab")

GIB = 1024**3
BATCH_MODES = ("shared", "distinct")
# llama-batched-bench's columns, its names and meanings (PP prompt tokens per row, TG generated tokens
# per row, B rows, N_KV cache cells held, T_* seconds, S_* tokens per second).
BENCH_COLUMNS = ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s")


# ---------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# batch: llama-batched-bench's table for the lab's model
# ---------------------------------------------------------------------------


def check_batch_memory(model: MiniMindForCausalLM, prompt_tokens: int, new_tokens: int, sizes, limit_gib: float) -> int:
    """Bytes of one cache cell (token) in the model's dtype; refuses, before any work, a B whose cache
    (B x (PP + TG) cells, by the lab's formula) would not fit in `limit_gib`."""
    per_token = model.config.kv_bytes_per_token(dtype_name(next(model.parameters()).dtype))
    for size in sizes:
        need = size * (prompt_tokens + new_tokens) * per_token
        if need > limit_gib * GIB:
            raise ValueError(
                f"config key 'extras.batch.sizes': B = {size} needs a cache of {need / 2**20:,.1f} MiB "
                f"({size} x ({prompt_tokens} + {new_tokens}) tokens x {per_token} bytes), more than "
                f"extras.batch.memory_limit_gib ({limit_gib} GiB)")
    return per_token


def _greedy_run(model, ids: torch.Tensor, mask, rows: int, new_tokens: int) -> dict:
    """One greedy generation of new_tokens + 1 tokens for `rows` rows (the prefill picks the first, then
    `new_tokens` decode steps each feed one token a row): each forward call's seconds, the new ids and
    the bytes of the cache the last call returned (PP + TG cells a row)."""
    with steps.recording_forward(model) as calls:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens + 1, num_return_sequences=rows,
                             use_cache=True, **steps.GREEDY)
    return {"prefill_s": calls.seconds[0], "decode_s": sum(calls.seconds[1:]), "new_ids": out[:, ids.shape[1]:],
            "cache_bytes": kv_cache_bytes(calls.last_output.past_key_values)}


def _alone(model, prompt: list[int], new_tokens: int, device) -> list[int]:
    """The greedy tokens `prompt` gives generated alone, unpadded (the lab's steps 1-3 generation)."""
    return steps.greedy_new_ids(model, torch.tensor([prompt], device=device), new_tokens + 1, use_cache=True)


def batch_bench(model: MiniMindForCausalLM, shared_prompt: list[int], distinct_prompts: list[list[int]],
                new_tokens: int, sizes, warmup: int, repeats: int, max_seconds: float, memory_limit_gib: float,
                device) -> tuple[list[dict], dict]:
    """llama-batched-bench's rows for every mode and B (see the module's docstring), and every run's
    samples. `distinct_prompts` holds at least max(sizes) prompts; B takes the first B."""
    sizes = sorted(set(sizes))
    widest = max([len(shared_prompt)] + [len(p) for p in distinct_prompts[: sizes[-1]]])
    model.check_room(widest, new_tokens + 1)
    per_token = check_batch_memory(model, widest, new_tokens, sizes, memory_limit_gib)
    alone = {"shared": [_alone(model, shared_prompt, new_tokens, device)] * sizes[-1],
             "distinct": [_alone(model, prompt, new_tokens, device) for prompt in distinct_prompts[: sizes[-1]]]}
    rows, runs = [], {}
    for mode in BATCH_MODES:
        first = None
        for size in sizes:
            if mode == "shared":
                ids, mask, copies = torch.tensor([shared_prompt], device=device), None, size
            else:
                ids, mask = left_pad(distinct_prompts[:size], device=device)
                copies = 1
            samples = {"prefill_s": [], "decode_s": [], "cache_bytes": None, "new_ids": None}

            def run(record=True):
                result = _greedy_run(model, ids, mask, copies, new_tokens)
                if record:
                    samples["prefill_s"].append(result["prefill_s"])
                    samples["decode_s"].append(result["decode_s"])
                samples["cache_bytes"], samples["new_ids"] = result["cache_bytes"], result["new_ids"]

            for _ in range(warmup):
                run(record=False)
            timing.repeat(run, repeats, max_seconds)
            new_ids = samples["new_ids"].tolist()
            differing = [row for row in range(size) if new_ids[row] != alone[mode][row]]
            row, detail = _bench_row(mode, size, ids.shape[1], new_tokens, mask, samples, per_token, differing)
            first = first or detail["per_token"]
            gain = timing.ratio_interval(first, detail["per_token"])
            row.update({"S_TG_gain": gain["ratio"], "S_TG_gain_low": gain["low"], "S_TG_gain_high": gain["high"]})
            rows.append(row)
            runs[f"{mode} {size}"] = detail
            log.info("%s B=%d: T_PP %.4f s, T_TG %.4f s (%.3f ms a step), S_TG %.0f t/s (%.2fx B=%d); "
                     "cache %d bytes (formula %d); same as alone: %s", mode, size, row["T_PP s"], row["T_TG s"],
                     row["ms_per_step"], row["S_TG t/s"], gain["ratio"], sizes[0], row["kv_bytes_measured"],
                     row["kv_bytes_formula"], row["same_as_single"])
    context = timing_context(device)
    return rows, {"by_mode_and_size": runs, "warmup": warmup, "repeats": repeats, "max_seconds": max_seconds,
                  "new_tokens": new_tokens, "shared_prompt": shared_prompt, **context}


def _bench_row(mode: str, size: int, width: int, new_tokens: int, mask, samples: dict, per_token: int,
               differing: list[int]) -> tuple[dict, dict]:
    """One row of batch.tsv from a (mode, B)'s samples, and its detail for batch_runs.json."""
    prefill = timing.summary(samples["prefill_s"])
    decode = timing.summary(samples["decode_s"])
    total = timing.summary([a + b for a, b in zip(samples["prefill_s"], samples["decode_s"])])
    # seconds per generated token: a decode step's time shared by its B rows
    per_token_time = timing.summary([s / (size * new_tokens) for s in samples["decode_s"]])
    n_kv = size * (width + new_tokens)
    generated = size * new_tokens
    row = {
        "mode": mode,
        "PP": width,
        "TG": new_tokens,
        "B": size,
        "N_KV": n_kv,
        "T_PP s": prefill["median_s"],
        "S_PP t/s": size * width / prefill["median_s"],
        "T_TG s": decode["median_s"],
        "S_TG t/s": generated / decode["median_s"],
        "T s": total["median_s"],
        "S t/s": n_kv / total["median_s"],
        "pad": int((mask == 0).sum()) if mask is not None else 0,
        "ms_per_step": decode["median_s"] / new_tokens * 1e3,
        "S_TG_low": generated / decode["q3_s"],
        "S_TG_high": generated / decode["q1_s"],
        "runs": decode["n"],
        "iqr_share": max(decode["iqr_share"], prefill["iqr_share"]),
        "unstable": decode["unstable"] or prefill["unstable"],
        "kv_bytes_measured": samples["cache_bytes"],
        "kv_bytes_formula": n_kv * per_token,
        "same_as_single": not differing,
    }
    detail = {"prefill_s": samples["prefill_s"], "decode_s": samples["decode_s"], "prefill": prefill,
              "decode": decode, "per_token": per_token_time, "rows_differing": differing}
    return row, detail


# ---------------------------------------------------------------------------
# kv_waste: four ways to reserve the caches of real requests
# ---------------------------------------------------------------------------


def reserved_slots(policy: str, held: int, final: int, max_length: int, block_tokens: int) -> int:
    """Cache slots a request holds under `policy` while it holds `held` tokens of its `final` length:
    max_length (reserved up front for the longest request allowed), power_of_two (grown by doubling),
    exact (reserved up front, knowing the final length), blocks (grown a block at a time, as paging does)."""
    if policy == "max_length":
        return max_length
    if policy == "power_of_two":
        return 1 << (held - 1).bit_length()
    if policy == "exact":
        return final
    if policy == "blocks":
        return -(-held // block_tokens) * block_tokens
    raise ValueError(f"unknown reservation policy {policy!r}")


POLICIES = ("max_length", "power_of_two", "exact", "blocks")
SPLIT = ("token", "reservation", "internal_fragmentation")


def request_split(prompt_len: int, final_len: int, max_length: int, block_tokens: int) -> dict:
    """For each policy, a request's slots averaged over its life (one moment per generated token, holding
    prompt_len + k tokens at the k-th), split as the vLLM paper does: `token` (slots holding a token's
    state), `reservation` (reserved for tokens still to come), `internal_fragmentation` (reserved and
    never used: beyond the final length). The three add up to `reserved`; `peak` is the most reserved."""
    moments = range(prompt_len + 1, final_len + 1)
    split = {}
    for policy in POLICIES:
        sums = dict.fromkeys(("reserved", *SPLIT), 0)
        peak = 0
        for held in moments:
            slots = reserved_slots(policy, held, final_len, max_length, block_tokens)
            used_later = min(slots, final_len)
            sums["reserved"] += slots
            sums["token"] += held
            sums["reservation"] += used_later - held
            sums["internal_fragmentation"] += slots - used_later
            peak = max(peak, slots)
        split[policy] = {key: value / len(moments) for key, value in sums.items()} | {"peak": peak}
    return split


def sample_requests(model: MiniMindForCausalLM, prompts: list[list[int]], answer_cap: int, temperature: float,
                    top_p: float, seed: int, eos_id: int, device) -> tuple[list[dict], float]:
    """Each prompt's answer: its length (and whether it ended at eos), sampled with MiniMind's `generate` (seeded, all prompts one left-padded
    batch) until eos, which counts, or `answer_cap` tokens. Also the bytes per cache cell, weighed from the
    real cache of that generation (its bytes over rows x cached positions)."""
    ids, mask = left_pad(prompts, device=device)
    model.check_room(ids.shape[1], answer_cap)
    torch.manual_seed(seed)
    with steps.recording_forward(model) as calls:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=answer_cap, temperature=temperature,
                             top_p=top_p, eos_token_id=eos_id, use_cache=True)
    answers = []
    for row in out[:, ids.shape[1]:].tolist():
        answers.append({"answer_len": row.index(eos_id) + 1 if eos_id in row else len(row), "eos": eos_id in row})
    cache = calls.last_output.past_key_values
    return answers, kv_cache_bytes(cache) / (cache[0][0].shape[0] * cache[0][0].shape[1])


def kv_waste(model: MiniMindForCausalLM, prompts: list[list[int]], prompt_cap: int, answer_cap: int,
             temperature: float, top_p: float, seed: int, eos_id: int, block_tokens: int, budgets_gib,
             device) -> tuple[list[dict], dict]:
    """One row per policy (kv_waste.csv) and every request's lengths and split (kv_waste_requests.json).
    The longest request allowed, what max_length reserves, is prompt_cap + answer_cap tokens."""
    answers, per_token = sample_requests(model, prompts, answer_cap, temperature, top_p, seed, eos_id, device)
    max_length = prompt_cap + answer_cap
    requests = []
    for index, (prompt, answer) in enumerate(zip(prompts, answers)):
        final = len(prompt) + answer["answer_len"]
        requests.append({"request": index, "prompt_len": len(prompt), **answer, "final_len": final,
                         "slots": request_split(len(prompt), final, max_length, block_tokens)})
    rows = []
    for policy in POLICIES:
        sums = {key: sum(r["slots"][policy][key] for r in requests) * per_token for key in ("reserved", *SPLIT)}
        peak = sum(r["slots"][policy]["peak"] for r in requests) * per_token
        row = {"policy": policy, "requests": len(requests), "reserved_bytes": sums["reserved"],
               "token_bytes": sums["token"], "reservation_bytes": sums["reservation"],
               "internal_fragmentation_bytes": sums["internal_fragmentation"]}
        row.update({f"{key}_share": sums[key] / sums["reserved"] for key in SPLIT})
        row["peak_reserved_bytes"] = peak
        for budget in budgets_gib:
            row[fits_column(budget)] = math.floor(budget * GIB / (peak / len(requests)))
        rows.append(row)
        log.info("%s: tokens %.1f%%, reservation %.1f%%, internal fragmentation %.1f%% of %.0f bytes", policy,
                 row["token_share"] * 100, row["reservation_share"] * 100,
                 row["internal_fragmentation_share"] * 100, row["reserved_bytes"])
    detail = {"requests": requests, "bytes_per_token": per_token, "max_length": max_length,
              "block_tokens": block_tokens, "answer_cap": answer_cap, "seed": seed, "temperature": temperature,
              "top_p": top_p, "budgets_gib": list(budgets_gib)}
    return rows, detail
