"""Many requests at once, beyond the lab sheet: llama.cpp's llama-batched-bench on the lab's model.

For each batch size B, two modes: one prompt shared by every row (MiniMind's `num_return_sequences`,
which copies the prompt into each row) and B different validation prompts, left-padded with the
attention mask. Each forward call of MiniMind's `generate` is timed (the first is the prefill), the
cache is weighed after the run, and every row's greedy tokens are held against the same prompt
generated alone.
"""

from __future__ import annotations

import logging
import time

import torch

from kvlab.engine.device import dtype_name, timing_context
from kvlab.engine.model import MiniMindForCausalLM, kv_cache_bytes, left_pad
from kvlab.facts import timing
from kvlab.facts.budget import Budget, scaled
from kvlab.facts.formulas import BATCH_MODES, GIB
from kvlab.measure import steps

log = logging.getLogger("kvlab")

# llama-batched-bench's columns, its names and meanings (PP prompt tokens per row, TG generated tokens
# per row, B rows, N_KV cache cells held, T_* seconds, S_* tokens per second).
BENCH_COLUMNS = ("PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s")


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
                             use_cache=True, **steps.GREEDY_NO_EOS)
    return {"prefill_s": calls.seconds[0], "decode_s": sum(calls.seconds[1:]), "new_ids": out[:, ids.shape[1]:],
            "cache_bytes": kv_cache_bytes(calls.last_output.past_key_values)}


def _alone(model, prompt: list[int], new_tokens: int, device) -> list[int]:
    """The greedy tokens `prompt` gives generated alone, unpadded (the lab's steps 1-3 generation)."""
    return steps.greedy_new_ids(model, torch.tensor([prompt], device=device), new_tokens + 1, use_cache=True)


def batch_bench(model: MiniMindForCausalLM, shared_prompt: list[int], distinct_prompts: list[list[int]],
                new_tokens: int, sizes, warmup: int, repeats: int, max_seconds: float, memory_limit_gib: float,
                device, budget: Budget | None = None) -> tuple[list[dict], dict]:
    """llama-batched-bench's rows for every mode and B (see the module's docstring), and every run's
    samples. `distinct_prompts` holds at least max(sizes) prompts; B takes the first B. The Bs are taken
    from the smallest up, both modes at each, within `budget` (kvlab.facts.budget): each next B
    predicted from the last one measured, scaled by the rows; a B that would not fit, and every larger
    one, is cut (from both modes). The rows come mode by mode."""
    budget = budget or Budget(None)
    sizes = sorted(set(sizes))
    widest = max([len(shared_prompt)] + [len(p) for p in distinct_prompts[: sizes[-1]]])
    model.check_room(widest, new_tokens + 1)
    per_token = check_batch_memory(model, widest, new_tokens, sizes, memory_limit_gib)
    alone = {"shared": [_alone(model, shared_prompt, new_tokens, device)], "distinct": []}
    runs, first = {}, {}

    def measure(size: int) -> tuple[list[dict], float]:
        began = time.perf_counter()
        measured = [measure_mode(mode, size) for mode in BATCH_MODES]
        return measured, time.perf_counter() - began

    def measure_mode(mode: str, size: int) -> dict:
        if mode == "shared":
            ids, mask, copies = torch.tensor([shared_prompt], device=device), None, size
            references = alone["shared"] * size
        else:
            ids, mask = left_pad(distinct_prompts[:size], device=device)
            copies = 1
            alone["distinct"] += [_alone(model, prompt, new_tokens, device)
                                  for prompt in distinct_prompts[len(alone["distinct"]):size]]
            references = alone["distinct"]
        samples = {"prefill_s": [], "decode_s": [], "cache_bytes": None, "new_ids": None}

        def run(record=True):
            result = _greedy_run(model, ids, mask, copies, new_tokens)
            if record:
                samples["prefill_s"].append(result["prefill_s"])
                samples["decode_s"].append(result["decode_s"])
            samples["cache_bytes"], samples["new_ids"] = result["cache_bytes"], result["new_ids"]

        for _ in range(warmup):
            run(record=False)
        samples["usage"] = timing.empty_usage()
        timing.repeat(run, repeats, max_seconds, usage=samples["usage"])
        new_ids = samples["new_ids"].tolist()
        differing = [row for row in range(size) if new_ids[row] != references[row]]
        row, detail = _bench_row(mode, size, ids.shape[1], new_tokens, mask, samples, per_token, differing,
                                 timing.judged_on(device))
        first.setdefault(mode, detail["per_token"])
        gain = timing.ratio_interval(first[mode], detail["per_token"])
        row.update({"S_TG_gain": gain["ratio"], "S_TG_gain_low": gain["low"], "S_TG_gain_high": gain["high"]})
        runs[f"{mode} {size}"] = detail
        log.info("%s B=%d: T_PP %.4f s, T_TG %.4f s (%.3f ms a step), S_TG %.0f t/s (%.2fx B=%d); "
                 "cache %d bytes (formula %d); same as alone: %s", mode, size, row["T_PP s"], row["T_TG s"],
                 row["ms_per_step"], row["S_TG t/s"], gain["ratio"], sizes[0], row["kv_bytes_measured"],
                 row["kv_bytes_formula"], row["same_as_single"])
        return row

    def predict(size: int, done: list) -> float:
        last, _, seconds = done[-1]
        return scaled(seconds, last, size)

    measured = [row for by_mode in budget.take(sizes, measure, predict, name=lambda size: f"B={size}")
                for row in by_mode]
    rows = sorted(measured, key=lambda row: (BATCH_MODES.index(row["mode"]), row["B"]))
    context = timing_context(device)
    return rows, {"by_mode_and_size": runs, "warmup": warmup, "repeats": repeats, "max_seconds": max_seconds,
                  "new_tokens": new_tokens, "shared_prompt": shared_prompt, "budget": budget.record(), **context}


def _bench_row(mode: str, size: int, width: int, new_tokens: int, mask, samples: dict, per_token: int,
               differing: list[int], judged: bool = True) -> tuple[dict, dict]:
    """One row of batch.tsv from a (mode, B)'s samples, and its detail for batch_runs.json. The
    prefill and decode times are parts of the same runs: the runs' clocks (`usage`) judge both."""
    usage = samples.get("usage")
    prefill = timing.summary(samples["prefill_s"], usage, judged)
    decode = timing.summary(samples["decode_s"], usage, judged)
    total = timing.summary([a + b for a, b in zip(samples["prefill_s"], samples["decode_s"])], usage, judged)
    # seconds per generated token: a decode step's time shared by its B rows
    per_token_time = timing.summary([s / (size * new_tokens) for s in samples["decode_s"]], usage, judged)
    n_kv = size * (width + new_tokens)
    generated = size * new_tokens
    bench = (width, new_tokens, size, n_kv, prefill["median_s"], size * width / prefill["median_s"],
             decode["median_s"], generated / decode["median_s"], total["median_s"], n_kv / total["median_s"])
    row = {
        "mode": mode,
        **dict(zip(BENCH_COLUMNS, bench)),
        "pad": int((mask == 0).sum()) if mask is not None else 0,
        "ms_per_step": decode["median_s"] / new_tokens * 1e3,
        "S_TG_low": generated / decode["q3_s"],
        "S_TG_high": generated / decode["q1_s"],
        "runs": decode["n"],
        "iqr_share": max(decode["iqr_share"], prefill["iqr_share"]),
        "unstable": decode["unstable"] or prefill["unstable"],
        "cpu_share": decode["cpu_share"],
        "contended": decode["contended"],
        "contention": decode["contention"],
        "kv_bytes_measured": samples["cache_bytes"],
        "kv_bytes_formula": n_kv * per_token,
        "same_as_single": not differing,
    }
    detail = {"prefill_s": samples["prefill_s"], "decode_s": samples["decode_s"], "usage": usage, "prefill": prefill,
              "decode": decode, "per_token": per_token_time, "rows_differing": differing}
    return row, detail
