"""Continuous batching against static batching and against one request at a time, on one seeded trace
of requests (kvlab.serving): what the trace rule measures.

The trace (kvlab.measure.serving_workloads) is served three ways, with the same requests:

  one at a time  each request alone through the fastest single-request path,
                 `kvlab.engine.fast.generate`: what a user without a server runs
                 (`compile` false in the settings: the same cache, eager, as the engine then runs)
  static         the serving engine admits a batch of up to `slots` requests together and runs it until
                 its longest row is done; only then the next (MiniMind's `generate` on a batch)
  continuous     the serving engine (its one compiled step): a request joins at the first step with a
                 free slot and free blocks, and leaves at once

Every request of every way is held against `generate` alone (its prompt, its knobs, after
torch.manual_seed(seed) when it has a seed): the requests whose tokens differ are counted, never
assumed away. Beside the main trace the engine serves it in a tight pool (preemption), a trace with
a shared prefix (the prefix cache) and one of n > 1 samples (parallel sampling).

What is exact (a function of the trace): forward steps, slot utilisation, blocks in use at every step,
preemptions, prefix-cache hits, blocks shared. What is timed: each run's output tokens a second on the
wall clock and on the timing thread's CPU clock (what the work cost, kvlab.facts.timing), its
requests' latencies, repeated with the ways alternating, each compiled step compiled before anything
is timed. The rate sweep is kvlab.measure.serving_rates.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np

from kvlab.engine.model import MiniMindForCausalLM
from kvlab.facts import timing
from kvlab.facts.budget import Budget
from kvlab.facts.serving import ServingSettings
from kvlab.measure import kv_waste
from kvlab.measure.serving_run import (LATENCIES, PERCENTILES, POLICIES, WAYS, Run, alone_timings, mismatches,
                                     one_at_a_time, ready_steps, references, request_records, run_timings, said,
                                     serve, timeline)
from kvlab.measure.serving_workloads import TraceRequest, check_block_size, check_fits, spaced, traces
from kvlab.serving import ServingConfig

log = logging.getLogger("kvlab")


def engine_config(settings: ServingSettings, policy: str, **changes) -> ServingConfig:
    """The engine's knobs from the trace settings (extras.serving)."""
    knobs = dict(num_blocks=settings.num_blocks, block_size=settings.block_size,
                 max_num_seqs=settings.slots, max_num_batched_tokens=settings.max_batched_tokens,
                 prefix_caching=False, policy=policy, compile=settings.compile)
    return ServingConfig(**{**knobs, **changes})


# --- what a run counted ------------------------------------------------------------------------------


def counts_row(run: Run, trace_name: str, trace: list[TraceRequest], checked: dict) -> dict:
    """One row of serve_counts.csv: the exact counts of a run."""
    stats = run.stats
    held = run.held
    prompt_tokens = sum(len(request.prompt) for request in trace)
    entries = sum(h["entries"] for h in held)
    return {
        "trace": trace_name,
        "run": run.name,
        "policy": run.config.policy,
        "requests": len(trace),
        "slots": run.config.max_num_seqs,
        "num_blocks": run.config.num_blocks,
        "prefix_caching": run.config.prefix_caching,
        "forward_steps": stats.forward_steps,
        "idle_steps": stats.idle_steps,
        "last_step": stats.steps[-1].step if stats.steps else 0,
        "prefill_tokens": stats.prefill_tokens,
        "decode_tokens": stats.decode_tokens,
        "useful_slot_steps": stats.useful_slot_steps,
        "slot_utilisation": stats.slot_utilisation,
        "peak_blocks": stats.peak_blocks_in_use,
        "mean_blocks": stats.mean_blocks_in_use,
        "peak_running": max((h["running"] for h in held), default=0),
        "mean_running": float(np.mean([h["running"] for h in held])) if held else 0.0,
        "preemptions": stats.preemptions,
        "recomputed_tokens": stats.recomputed_tokens,
        "prompt_tokens": prompt_tokens,
        "prefix_hit_blocks": stats.prefix_hit_blocks,
        "prefix_hit_tokens": stats.prefix_hit_tokens,
        "prefix_hit_rate": stats.prefix_hit_tokens / prompt_tokens,
        "blocks_saved_by_sharing": stats.blocks_saved_by_sharing,
        # the PagedAttention paper's measure (its Fig. 15): blocks saved by sharing over the blocks
        # without sharing, summed over the run's steps
        "memory_saved_share": (entries - sum(h["blocks"] for h in held)) / entries if entries else 0.0,
        "greedy_mismatches": checked["greedy_mismatches"],
        "seeded_mismatches": checked["seeded_mismatches"],
        "checked_requests": checked["checked"],
    }


def memory_rows(runs: list[Run], trace: list[TraceRequest], max_length: int, bytes_per_token: int,
                budget_blocks: int) -> list[dict]:
    """kv_waste's four reservation policies replayed on the trace's requests (kvlab.measure.kv_waste, each
    request's final length its prompt + max_tokens), beside the engine's cache as measured at every step
    of each of `runs`: the token-state, reservation and internal-fragmentation shares of the slots
    reserved, the slots a request holds on average (and, replayed, at its longest), and how many
    requests fit a pool of `budget_blocks` blocks (replayed: each held at its longest; measured: how
    many the engine ran at once, at most and on average, in a run whose pool is that size)."""
    size = runs[0].config.block_size
    requests = [kv_waste.request_split(len(r.prompt), len(r.prompt) + r.params.max_tokens, max_length, size)
                for r in trace]
    rows = []
    for policy in kv_waste.POLICIES:
        sums = {key: sum(split[policy][key] for split in requests) for key in ("reserved", *kv_waste.SPLIT)}
        peak = sum(split[policy]["peak"] for split in requests) / len(requests)
        rows.append({"source": "replayed", "policy": policy, "requests": len(requests),
                     **{f"{key}_share": sums[key] / sums["reserved"] for key in kv_waste.SPLIT},
                     "mean_slots": sums["reserved"] / len(requests), "peak_slots": peak,
                     "budget_blocks": budget_blocks, "fits_budget": math.floor(budget_blocks * size / peak),
                     "ran_at_once_peak": math.nan, "ran_at_once_mean": math.nan, "bytes_per_token": bytes_per_token})
    for run in runs:
        held = run.held
        slots = sum(h["entries"] for h in held) * size
        alive = sum(h["running"] for h in held)
        rows.append({"source": "measured", "policy": f"engine, {run.name}", "requests": len(trace),
                     **{f"{key}_share": sum(h[part] for h in held) / slots
                        for key, part in zip(kv_waste.SPLIT, ("positions", "later", "never"))},
                     # a request's slots, averaged over the steps it held blocks
                     "mean_slots": slots / alive, "peak_slots": math.nan, "budget_blocks": run.config.num_blocks,
                     "fits_budget": math.nan, "ran_at_once_peak": max(h["running"] for h in held),
                     "ran_at_once_mean": alive / len(held), "bytes_per_token": bytes_per_token})
    return rows


# --- what the runs timed -------------------------------------------------------------------------


def usage_of(runs: list[dict]) -> dict:
    """The runs' clocks as kvlab.facts.timing reads them (`usage`): its contention rule then says which
    runs waited for the CPU."""
    return {"wall_s": [run["wall_s"] for run in runs], "thread_cpu_s": [run["cpu_s"] for run in runs],
            "cpu_s": [run["cpu_s"] for run in runs], "switches": [run["involuntary_switches"] for run in runs],
            "load_1m": [math.nan for _ in runs]}


def compared(comparison: str, quantity: str, unit: str, names: tuple[str, str], samples: tuple[list, list],
             higher_is_better: bool = False, ratio_of: bool = True, usage: tuple[dict, dict] | None = None) -> dict:
    """One row of serve_timing.csv: a quantity's samples on a baseline and on a subject, each
    summarised (with its runs' `usage`, whether they waited for the CPU), and how many times the subject
    beats the baseline, with its interval (baseline time over subject time; for a rate, subject over
    baseline). `ratio_of` False (a share, a fit's coefficient): set side by side, no ratio."""
    usage = usage or (None, None)
    baseline, subject = (timing.summary(values, use) for values, use in zip(samples, usage))
    row = {"comparison": comparison, "quantity": quantity, "unit": unit}
    for side, name, summary in (("baseline", names[0], baseline), ("subject", names[1], subject)):
        row.update({side: name, f"{side}_median": summary["median_s"], f"{side}_q1": summary["q1_s"],
                    f"{side}_q3": summary["q3_s"], f"{side}_n": summary["n"],
                    f"{side}_iqr_share": summary["iqr_share"], f"{side}_contended": summary["contended"],
                    f"{side}_cpu_share": summary["cpu_share"]})
    if not ratio_of:
        ratio = {"ratio": math.nan, "low": math.nan, "high": math.nan}
    elif higher_is_better:
        ratio = timing.ratio_interval(subject, baseline)
    else:
        ratio = timing.ratio_interval(baseline, subject)
    row.update({"ratio": ratio["ratio"], "ratio_low": ratio["low"], "ratio_high": ratio["high"],
                "unstable": baseline["unstable"] or subject["unstable"],
                "contended": baseline["contended"] or subject["contended"]})
    return row


def timing_rows(times: dict[str, list[dict]], prefix_ttft: dict[str, list[float]]) -> list[dict]:
    """serve_timing.csv: continuous against static and against one request at a time on the trace
    (`times`: each way's run timings, one per repeat), output tokens a second on both clocks; the
    engine's latencies, step shares and step-cost line, static beside continuous; and the time to
    first token with the prefix cache against without."""
    column = lambda way, key: [t[key] for t in times[way]]  # noqa: E731
    usage = {way: usage_of(times[way]) for way in times}
    rows = []
    for baseline in ("static", "one_at_a_time"):
        names, versus = (baseline, "continuous"), f"continuous vs {baseline.replace('_', ' ')}"
        both = (usage[baseline], usage["continuous"])
        rows += [compared(versus, "throughput", "tokens/s", names,
                          (column(baseline, "tokens_per_s"), column("continuous", "tokens_per_s")),
                          higher_is_better=True, usage=both),
                 compared(versus, "wall", "s", names, (column(baseline, "wall_s"), column("continuous", "wall_s")),
                          usage=both),
                 # per second of the timing thread's CPU: what the work cost, steadier beside other work
                 compared(versus, "throughput_cpu", "tokens/CPU s", names,
                          (column(baseline, "tokens_per_cpu_s"), column("continuous", "tokens_per_cpu_s")),
                          higher_is_better=True, usage=both)]
    names, both = POLICIES, (usage["static"], usage["continuous"])
    for name in LATENCIES:
        for label, _ in PERCENTILES:
            key = f"{name.removesuffix('_s')}_{label}_s"
            rows.append(compared("continuous vs static", key.removesuffix("_s"), "s", names,
                                 (column("static", key), column("continuous", key)), usage=both))
    for key in ("scheduler_share", "forward_share", "cpu_share"):
        rows.append(compared("continuous vs static", key, "share", names,
                             (column("static", key), column("continuous", key)), ratio_of=False, usage=both))
    for key in ("step_fixed_s", "step_per_row_s"):
        rows.append(compared("continuous vs static", key.removesuffix("_s"), "s", names,
                             (column("static", key), column("continuous", key)), ratio_of=False, usage=both))
    rows.append(compared("prefix cache on vs off", "ttft_p50", "s", ("cache off", "cache on"),
                         (prefix_ttft["off"], prefix_ttft["on"])))
    return rows


# --- the whole measurement ---------------------------------------------------------------------------


class Progress:
    """Logs how far a measurement got: seconds and CPU seconds since it began."""

    def __init__(self):
        self.began, self.began_cpu = time.perf_counter(), time.process_time()

    def done(self, what: str) -> None:
        log.info("%s: done at %.2f s (CPU %.2f s)", what, time.perf_counter() - self.began,
                 time.process_time() - self.began_cpu)


def measure(model: MiniMindForCausalLM, prompts: list[list[int]], system_prompt: list[int],
            settings: ServingSettings,
            bytes_per_token: int) -> dict:
    """Everything the serve_trace rule writes (see the module's docstring): the counts, the memory
    comparison, the timings, every request's events and the timeline's data."""
    s = settings
    budget = Budget(s.budget_s)
    check_block_size(model, s.block_size)
    made = traces(prompts, system_prompt, s)
    roomy = {policy: engine_config(s, policy) for policy in POLICIES}
    tight = engine_config(s, "continuous", num_blocks=s.tight_blocks)
    for name, trace in made.items():
        check_fits(trace, roomy["continuous"], "extras.serving.num_blocks")
    check_fits(made["trace"], tight, "extras.serving.tight_blocks")
    progress = Progress()
    alone = {name: references(model, trace) for name, trace in made.items()}
    progress.done("generate alone, every request of the three traces")

    trace = made["trace"]
    ready = ready_steps(model, roomy["continuous"], trace, s.compile)
    progress.done(f"the engine's step and the single-request path ready ({said(ready)})")

    counts, events, times = [], [], {way: [] for way in WAYS}
    runs: dict[str, Run] = {}
    alone_checked = {"greedy_mismatches": 0, "seeded_mismatches": 0, "checked": 0}

    def checked(run: Run, trace_name: str, trace: list[TraceRequest], reference) -> None:
        found = mismatches(run.samples(), trace, reference)
        if run.name not in runs:
            runs[run.name] = run
            counts.append(counts_row(run, trace_name, trace, found))
            events.extend(request_records(run, trace, reference))
        elif len(run.steps) != len(runs[run.name].steps):
            raise RuntimeError(f"{run.name}: a repeat took another number of steps (the schedule should not vary)")
        warn_mismatches(run.name, found)

    repeats, repeat = s.repeats, 0
    while repeat < repeats:
        began = time.perf_counter()
        for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:  # alternating, so no way goes first always
            if way == "one_at_a_time":
                done = one_at_a_time(model, trace, s.compile)
                found = mismatches(done.samples, trace, alone["trace"])
                alone_checked = {key: max(alone_checked[key], found[key]) for key in alone_checked}
                warn_mismatches("one at a time", found)
                times[way].append(alone_timings(done))
            else:
                run = serve(model, trace, roomy[way], way)
                checked(run, "trace", trace, alone["trace"])
                times[way].append(run_timings(run))
            log.info("repeat %d, %s: %.3f s, %.0f tokens/s (%.0f per CPU second)", repeat, way,
                     times[way][-1]["wall_s"], times[way][-1]["tokens_per_s"], times[way][-1]["tokens_per_cpu_s"])
        if repeat == 0:  # the first repeat plans the rest within the budget (two at least: a spread)
            repeats = budget.runs_after_first(time.perf_counter() - began, s.repeats, min(2, s.repeats),
                                              "repeats of the three ways")
        repeat += 1
    progress.done(f"one at a time, static and continuous, {repeats} runs each")
    checked(serve(model, trace, tight, "continuous, tight pool"), "trace", trace, alone["trace"])
    for caching in (True, False):
        config = engine_config(s, "continuous", prefix_caching=caching)
        run = serve(model, made["prefix"], config, f"continuous, prefix cache {'on' if caching else 'off'}")
        checked(run, "prefix", made["prefix"], alone["prefix"])
    checked(serve(model, made["parallel"], roomy["continuous"], f"continuous, n = {s.parallel_n}"), "parallel",
            made["parallel"], alone["parallel"])

    progress.done(f"the tight pool, the shared prefix, n = {s.parallel_n}")
    # time to first token of a long shared prefix, each request alone, with the prefix cache and without
    one_token = spaced(made["prefix"], 1)
    first_tokens = [[row[:1] for row in rows] for rows in alone["prefix"]]
    prefix_ttft: dict[str, list[float]] = {"on": [], "off": []}
    for repeat in range(repeats):
        for caching in ((True, False) if repeat % 2 == 0 else (False, True)):
            config = engine_config(s, "continuous", prefix_caching=caching)
            run = serve(model, one_token, config, f"prefix alone, cache {'on' if caching else 'off'}")
            checked(run, "prefix alone", one_token, first_tokens)
            # the first request finds nothing cached either way
            prefix_ttft["on" if caching else "off"].append(float(np.median([o.ttft_s for o in run.outputs[1:]])))

    progress.done("the prefix cache's time to first token")
    max_length = s.prompt_cap + s.max_tokens_max
    memory = memory_rows([runs["continuous"], runs["continuous, tight pool"]], trace, max_length, bytes_per_token,
                         s.tight_blocks)
    detail = {"settings": s.as_dict(), "block_bytes": bytes_per_token * s.block_size,
              "traces": {name: [request.record(i) for i, request in enumerate(t)] for name, t in made.items()},
              "timelines": {name: timeline(runs[name]) for name in (*POLICIES, "continuous, tight pool")},
              "summaries": {name: run.stats.summary() for name, run in runs.items()},
              "timings": times, "prefix_ttft_s": prefix_ttft, "one_at_a_time": alone_checked, "ready_steps": ready,
              "way_counts": {way: way_counts(runs, trace, way) for way in WAYS}, "repeats": repeats,
              "budget": budget.record()}
    return {"counts": counts, "memory": memory, "timing": timing_rows(times, prefix_ttft), "events": events,
            "detail": detail}


def way_counts(runs: dict[str, Run], trace: list[TraceRequest], way: str) -> dict:
    """What each way took to answer the trace, exactly: forward steps (one at a time: every request's
    prefill and its decode steps, max_tokens calls a request) and its slots' use."""
    tokens = sum(request.params.max_tokens * request.params.n for request in trace)
    if way == "one_at_a_time":
        return {"forward_steps": tokens, "slots": 1, "slot_utilisation": 1.0, "tokens": tokens}
    stats = runs[way].stats
    return {"forward_steps": stats.forward_steps, "slots": stats.max_num_seqs,
            "slot_utilisation": stats.slot_utilisation, "tokens": tokens}


def warn_mismatches(name: str, found: dict) -> None:
    if found["greedy_mismatches"] or found["seeded_mismatches"]:
        log.warning("%s: %d greedy and %d seeded requests differ from generate alone", name,
                    found["greedy_mismatches"], found["seeded_mismatches"])
