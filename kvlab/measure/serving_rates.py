"""Latency against the request rate, static and continuous, on the trace rule's requests (the rule
serve_rates; kvlab.measure.serving_trace serves the trace itself)."""

from __future__ import annotations

import logging
import math

import numpy as np

from kvlab.engine.model import MiniMindForCausalLM
from kvlab.facts.serving import ServingSettings
from kvlab.measure.serving_run import (PERCENTILES, POLICIES, Run, latency_percentiles, output_finished, ready_steps,
                                     request_records, said, serve)
from kvlab.measure.serving_trace import Progress, engine_config
from kvlab.measure.serving_workloads import check_block_size, check_fits, main_trace
from kvlab.serving import RequestOutput

log = logging.getLogger("kvlab")


def step_latencies(output: RequestOutput) -> dict:
    """A finished request's latencies in forward steps of the engine's clock, each counting the step it
    ends in: to its first token (its prefill included), and end to end."""
    steps = {}
    for event in output.events:
        steps.setdefault(event.kind, event.step)
    return {"ttft": steps["first_token"] - steps["arrival"] + 1, "latency": steps["finish"] - steps["arrival"] + 1}


def rate_row(run: Run, fraction: float, rate_per_step: float) -> dict:
    """One row of serve_rates.csv: a run of the trace arriving at `rate_per_step` requests a forward step.
    The PagedAttention paper's normalized latency (its Fig. 12: each request's end-to-end latency over its
    output tokens, averaged over the requests) in steps, exact (1.0: no request was ever kept waiting),
    and in seconds on this machine."""
    finished = [output for output in run.outputs if output_finished(output)]
    tokens = [sum(len(sample) for sample in output.samples) for output in finished]
    in_steps = [step_latencies(output) for output in finished]
    row = {"fraction": fraction, "rate_per_step": rate_per_step, "policy": run.config.policy,
           "requests": len(run.outputs), "finished": len(finished), "cut": run.cut,
           "forward_steps": run.stats.forward_steps, "last_step": run.stats.steps[-1].step if run.stats.steps else 0}
    row["normalized_latency_steps"] = (float(np.mean([s["latency"] / t for s, t in zip(in_steps, tokens)]))
                                       if finished else math.nan)
    for name in ("ttft", "latency"):
        values = [s[name] for s in in_steps]
        for label, q in PERCENTILES[:2]:
            row[f"{name}_{label}_steps"] = float(np.percentile(values, q)) if values else math.nan
    row["normalized_latency_s"] = (float(np.mean([o.latency_s / t for o, t in zip(finished, tokens)]))
                                   if finished else math.nan)
    row.update(latency_percentiles(run.outputs))
    row["tokens_per_s"] = sum(tokens) / run.wall_s if run.steps else math.nan
    # under 1: the engine thread waited for the CPU during its steps (other work shared it)
    row["cpu_share"] = run.cpu_s / run.wall_s if run.steps else math.nan
    return row


def rate_sweep(model: MiniMindForCausalLM, prompts: list[list[int]],
               settings: ServingSettings) -> tuple[list[dict], dict]:
    """Latency against the request rate, static and continuous, on the trace's requests. First each
    policy's saturation throughput: the requests all queued at step 0, served as fast as it can, in
    requests a forward step (exact; the seconds it took beside). Then the same requests arriving at
    Poisson steps at each fraction of continuous's saturation rate (one pattern of arrivals, scaled), each
    run bounded by the trace's count and by `rate_max_seconds`. On the step clock the latencies are the
    schedule's alone, the same on every machine; their seconds say what this machine made of them."""
    s = settings
    check_block_size(model, s.block_size)
    progress = Progress()
    queued = main_trace(prompts, s, None)
    roomy = {policy: engine_config(s, policy) for policy in POLICIES}
    check_fits(queued, roomy["continuous"], "extras.serving.num_blocks")
    progress.done(f"the engine's step ready ({said(ready_steps(model, roomy['continuous']))})")
    saturation = {}
    for policy in POLICIES:
        run = serve(model, queued, roomy[policy], f"{policy}, all at once")
        saturation[policy] = {"requests_per_step": len(queued) / run.stats.forward_steps,
                              "forward_steps": run.stats.forward_steps, "wall_s": run.wall_s,
                              "requests_per_s": len(queued) / run.wall_s, "cpu_share": run.cpu_s / run.wall_s}
        log.info("%s, all at once: %d forward steps (%.3f requests a step), %.3f s", policy, run.stats.forward_steps,
                 saturation[policy]["requests_per_step"], run.wall_s)
    base = saturation["continuous"]["requests_per_step"]
    static_saturates = saturation["static"]["requests_per_step"] / base
    rows, runs = [], []
    for index, fraction in enumerate(s.rate_fractions):
        rate = fraction * base
        arriving = main_trace(prompts, s, rate)
        for policy in POLICIES if index % 2 == 0 else POLICIES[::-1]:
            run = serve(model, arriving, roomy[policy], f"{policy} at {fraction:g} x saturation",
                        max_seconds=s.rate_max_seconds)
            rows.append(rate_row(run, fraction, rate) | {"saturation_fraction_static": static_saturates})
            runs.append({"run": run.name, "fraction": fraction, "rate_per_step": rate, "policy": policy,
                         "cut": run.cut, "requests": request_records(run, arriving, None)})
            log.info("%s: %d of %d finished, normalized latency %.2f steps (%.4f s) a token%s", run.name,
                     rows[-1]["finished"], len(queued), rows[-1]["normalized_latency_steps"],
                     rows[-1]["normalized_latency_s"], " (cut by rate_max_seconds)" if run.cut else "")
    rows.sort(key=lambda row: (POLICIES.index(row["policy"]), row["fraction"]))
    progress.done("the rate sweep")
    return rows, {"saturation": saturation, "rate_fractions": list(s.rate_fractions),
                  "rate_max_seconds": s.rate_max_seconds, "runs": runs}
