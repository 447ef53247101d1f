"""What the way a server reserves the cache does to how many requests fit, beyond the lab sheet.

Real requests (validation documents continued by sampling until eos or a cap) and four ways of
reserving their caches, with the bytes split as the vLLM paper's Figure 2 splits them (Kwon et al.,
SOSP 2023): token states, reservation (slots held for tokens still to come) and internal fragmentation
(slots never used).
"""

from __future__ import annotations

import logging
import math

import torch

from kvlab.engine.model import MiniMindForCausalLM, kv_cache_bytes, left_pad
from kvlab.facts.budget import KEPT_RUNGS, Budget
from kvlab.facts.formulas import GIB, fits_column
from kvlab.measure import steps

log = logging.getLogger("kvlab")


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


# The probe: its first requests, and the tokens it samples for each (kvlab.measure.kv_waste.requests_in_budget).
PROBE_REQUESTS, PROBE_TOKENS = 8, 4


def requests_in_budget(model: MiniMindForCausalLM, prompts: list[list[int]], answer_cap: int, device,
                       budget: Budget) -> int:
    """How many of `prompts` (the first ones) can be answered within `budget`. A probe (untimed work;
    the answers are sampled afresh from the seed) samples PROBE_TOKENS tokens for the first
    PROBE_REQUESTS prompts, its prefill and its steps timed apart; all the prompts are predicted to
    take the probe's prefill plus answer_cap of its steps, times their number over the probe's (a
    batched step's cost grows with its rows, in proportion where the arithmetic dominates: above it
    where the fixed cost does). Where that does not fit, the requests are cut in proportion;
    KEPT_RUNGS are always answered. The requests cut are recorded in `budget`."""
    if budget.seconds is None or len(prompts) <= KEPT_RUNGS:
        return len(prompts)
    probed = prompts[:PROBE_REQUESTS]
    ids, mask = left_pad(probed, device=device)
    with steps.recording_forward(model) as calls:
        model.generate(ids, attention_mask=mask, max_new_tokens=min(PROBE_TOKENS, answer_cap), eos_token_id=None,
                       use_cache=True)
    prefill_s, *step_s = calls.seconds
    per_step = sum(step_s) / len(step_s) if step_s else prefill_s
    predicted = (prefill_s + answer_cap * per_step) * len(prompts) / len(probed)
    left = max(0.0, budget.seconds - budget.spent())
    if predicted <= left:
        return len(prompts)
    kept = max(KEPT_RUNGS, int(len(prompts) * left / predicted))
    budget.cut.append({"rung": f"requests {kept + 1}-{len(prompts)}", "predicted_s": predicted, "left_s": left})
    log.info("all %d requests predicted to take %.0f s, over the budget's %.0f s left: the first %d answered",
             len(prompts), predicted, left, kept)
    return kept


def kv_waste(model: MiniMindForCausalLM, prompts: list[list[int]], prompt_cap: int, answer_cap: int,
             temperature: float, top_p: float, seed: int, eos_id: int, block_tokens: int, budgets_gib,
             device, budget: Budget | None = None) -> tuple[list[dict], dict]:
    """One row per policy (kv_waste.csv) and every request's lengths and split (kv_waste_requests.json).
    The longest request allowed, what max_length reserves, is prompt_cap + answer_cap tokens. Within
    `budget` (kvlab.facts.budget) only the first requests predicted to fit are answered
    (`requests_in_budget`); what was cut is recorded."""
    budget = budget or Budget(None)
    asked = len(prompts)
    prompts = prompts[:requests_in_budget(model, prompts, answer_cap, device, budget)]
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
        for gib in budgets_gib:
            row[fits_column(gib)] = math.floor(gib * GIB / (peak / len(requests)))
        rows.append(row)
        log.info("%s: tokens %.1f%%, reservation %.1f%%, internal fragmentation %.1f%% of %.0f bytes", policy,
                 row["token_share"] * 100, row["reservation_share"] * 100,
                 row["internal_fragmentation_share"] * 100, row["reserved_bytes"])
    detail = {"requests": requests, "bytes_per_token": per_token, "max_length": max_length,
              "block_tokens": block_tokens, "answer_cap": answer_cap, "seed": seed, "temperature": temperature,
              "top_p": top_p, "budgets_gib": list(budgets_gib), "requests_asked": asked,
              "budget": budget.record()}
    return rows, detail
