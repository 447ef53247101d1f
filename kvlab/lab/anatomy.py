"""Where a generation step's time goes, and what a preallocated cache changes (beyond the sheet).

The sheet explains why the cache feeds 56x fewer tokens yet saves only about 4x the time by "the
fixed cost per step (Python and kernel calls)". `step_anatomy` opens single steps with
torch.profiler: the time inside operators, by what they do, and the rest (Python, and dispatch
outside the operators), as shares of their sum (the profiled step less the profiler's own cost) that add up to 1, beside the same step timed
without the profiler. `cache_curve` times one decode step at growing context lengths with MiniMind's
cache (grown by torch.cat, so each step copies all of it) and with a StaticCache (allocated once,
written in place), and checks that both give the same tokens.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from kvlab.engine import model as engine_model
from kvlab.engine import sampling
from kvlab.engine.device import timing_context
from kvlab.engine.model import KV_CACHES, Attention, MiniMindForCausalLM, RMSNorm, StaticCache
from kvlab.lab import steps, timing

# What the time of a step is spent on: operators by what they do, then everything outside them.
OPERATOR_PARTS = ("matmul", "attention", "norm", "rope", "cache", "sampling", "other_operators")
PARTS = (*OPERATOR_PARTS, "python_dispatch")
SCOPE = "kvlab::"
# generate's greedy choice, as steps 1-3 make it (its default temperature, divided by and then argmax'd)
GREEDY_KNOBS = dict(temperature=0.85, top_k=0, top_p=1.0, repetition_penalty=1.0, do_sample=False)
# The profiled step's time may differ from the unprofiled one by this share and still "add up".
ADDS_UP_WITHIN = 0.10


@contextmanager
def labelled_parts(model: MiniMindForCausalLM):
    """Open a profiler scope named for its part around each: every nn.Linear (matrix products), RMSNorm
    (norms), Attention (attention: what is left in it once its projections, norms, RoPE and cache are
    taken out), RoPE, the cache's append (MiniMind's torch.cat, or a StaticCache's write) and the
    next-token choice (sampling). All undone on exit; the innermost scope names an operator's part."""
    with ExitStack() as undo:
        def scoped(function, part):
            def wrapped(*args, **kwargs):
                with record_function(SCOPE + part):
                    return function(*args, **kwargs)
            return wrapped

        for module in model.modules():
            part = {nn.Linear: "matmul", RMSNorm: "norm", Attention: "attention"}.get(type(module))
            if part:
                module.forward = scoped(module.forward, part)
                undo.callback(delattr, module, "forward")
        for owner, name, part in ((engine_model, "apply_rope", "rope"), (engine_model, "extend_cache", "cache"),
                                  (StaticCache, "write", "cache"), (sampling, "next_token", "sampling")):
            original = getattr(owner, name)
            setattr(owner, name, scoped(original, part))
            undo.callback(setattr, owner, name, original)
        yield


CALIBRATION_CALLS = 1000
PROFILED_WARMUP = 2


def _scopes(event) -> tuple[str, str | None]:
    """(part, root) of an operator event: the innermost kvlab part scope around it (other_operators
    with none), and the outermost kvlab scope (which run it belongs to)."""
    part, root, parent = None, None, event.cpu_parent
    while parent is not None:
        if parent.name.startswith(SCOPE):
            name = parent.name[len(SCOPE):]
            if name in OPERATOR_PARTS:
                part = part or name
            else:
                root = name
        parent = parent.cpu_parent
    return part or "other_operators", root


def profiled_parts(model, opened: dict, repeats: int) -> dict:
    """Split each opened step's time into parts, one short profiler session a step.

    In its session a step runs `repeats` times plain (the profiler's only scope is the run): its wall
    time, its operators' self time (a nested operator counted once) and its events. Then `repeats`
    times more with the model's parts labelled (`labelled_parts`; their Python wrappers slow the step,
    so these runs give only how the operators' time divides among the parts). The profiler costs about
    the same for every event it records, a cost that drifts as a session fills: it is measured right
    before and right after the plain runs, on CALIBRATION_CALLS calls of a trivial operator (timed
    with and without the profiler), and its mean taken off the plain wall time (from the rest), so the
    parts add up to the step as it runs unprofiled, within what the calibration misses."""
    a, b = torch.ones(1), torch.ones(1)

    def calibrate():
        for _ in range(CALIBRATION_CALLS):
            torch.add(a, b)

    calibrate()
    unprofiled_us = min(timing.repeat(calibrate, 3, 0)) / CALIBRATION_CALLS * 1e6
    result = {}
    for name, run_step in opened.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            calibrate()  # the profiler's first events cost more: a warm-up, not counted
            for _ in range(PROFILED_WARMUP):
                run_step()
            with record_function(SCOPE + "calibration"):
                calibrate()
            for _ in range(repeats):
                with record_function(SCOPE + "plain"):
                    run_step()
            with record_function(SCOPE + "calibration"):
                calibrate()
            with labelled_parts(model):
                run_step()
                for _ in range(repeats):
                    with record_function(SCOPE + "labelled"):
                        run_step()
        wall, events, calls = {}, {}, 0
        inside = {root: dict.fromkeys(OPERATOR_PARTS, 0.0) for root in ("plain", "labelled", "calibration")}
        for event in prof.events():
            if event.name.startswith(SCOPE):
                if event.cpu_parent is None:
                    wall[event.name[len(SCOPE):]] = wall.get(event.name[len(SCOPE):], 0.0) + event.cpu_time_total
                continue
            part, root = _scopes(event)
            if root is None:
                continue
            inside[root][part] += event.self_cpu_time_total
            events[root] = events.get(root, 0) + 1
            calls += root == "plain" and event.cpu_parent is not None and event.cpu_parent.name == SCOPE + "plain"
        per_event_us = wall["calibration"] / events["calibration"] - unprofiled_us
        operators_ms = sum(inside["plain"].values()) / repeats / 1e3
        profiled_ms = wall["plain"] / repeats / 1e3
        corrected_ms = profiled_ms - per_event_us * events["plain"] / repeats / 1e3
        labelled_total = sum(inside["labelled"].values())
        ms = {part: operators_ms * inside["labelled"][part] / labelled_total for part in OPERATOR_PARTS}
        ms["python_dispatch"] = corrected_ms - operators_ms
        result[name] = {"profiled_step_ms": profiled_ms, "corrected_step_ms": corrected_ms, "ms": ms,
                        "shares": {part: ms[part] / corrected_ms for part in PARTS},
                        "operator_calls": calls / repeats, "events": events["plain"] / repeats,
                        "profiler_us_per_event": per_event_us, "calibration_calls": CALIBRATION_CALLS,
                        "labelled_step_ms": wall["labelled"] / repeats / 1e3, "profiled_repeats": repeats}
    return result


def _steps_to_open(model, prompt_ids: list[int], new_tokens: int, device) -> dict:
    """The lab's last step (step 3's prompt, after new_tokens - 1 greedy tokens), three ways: with
    MiniMind's cache, with a StaticCache holding the same (`_decode_step_at`), and without a cache
    (every token fed again). Each a function of no argument."""
    prompt = steps.prompt_tensor(model, prompt_ids, new_tokens, device)
    ids = model.generate(prompt, max_new_tokens=new_tokens - 1, use_cache=True, **steps.GREEDY)

    def uncached():
        with torch.inference_mode():
            model.decode_step(ids, None, None, False, **GREEDY_KNOBS)

    return {"context_tokens": ids.shape[1], "steps": {"with_cache_cat": _decode_step_at(model, ids, "cat", device),
                                                       "with_cache_static": _decode_step_at(model, ids, "static", device),
                                                       "without_cache": uncached}}


def step_anatomy(model, prompt_ids: list[int], new_tokens: int, warmup: int, repeats: int, max_seconds: float,
                 profile_repeats: int, device) -> dict:
    """Each of the three ways of taking the lab's last step, timed without the profiler (its runs and
    spread, kvlab.lab.timing), then split into parts (`profiled_parts`). `adds_up` when the parts'
    sum (the profiled step less the profiler's own cost) is within ADDS_UP_WITHIN of the unprofiled
    median."""
    opened = _steps_to_open(model, prompt_ids, new_tokens, device)
    result = {"prompt_len": len(prompt_ids), "new_tokens": new_tokens, "context_tokens": opened["context_tokens"],
              **timing_context(device)}
    timed = {}
    for name, run_step in opened["steps"].items():
        for _ in range(warmup):
            run_step()
        timed[name] = timing.repeat(run_step, repeats, max_seconds)
    parts = profiled_parts(model, opened["steps"], profile_repeats)
    for name, samples in timed.items():
        summary = timing.summary(samples)
        step_ms = summary["median_s"] * 1e3
        off = parts[name]["corrected_step_ms"] / step_ms - 1
        result[name] = {"step": summary, "step_samples_s": samples, "step_ms": step_ms, **parts[name],
                        "sum_of_parts_off": off, "adds_up": abs(off) <= ADDS_UP_WITHIN}
    return result


def _decode_step_at(model, ids: torch.Tensor, kv_cache: str, device):
    """A function of no argument that takes one cached decode step after `ids` (all but the last are
    in the cache), with MiniMind's cache (a fresh torch.cat of all of it) or a StaticCache (the
    last position written again, in place)."""
    held = ids.shape[1] - 1
    with torch.inference_mode():
        if kv_cache == "cat":
            cache = model(ids[:, :held], use_cache=True).past_key_values
        else:
            cache = StaticCache(model.config, 1, ids.shape[1], model.lm_head.weight.dtype, device)
            model(ids[:, :held], past_key_values=cache, use_cache=True)

    def step():
        if kv_cache == "static":
            cache.length = held
        with torch.inference_mode():
            model.decode_step(ids, None, cache, True, **GREEDY_KNOBS)

    return step


def cache_curve(model, prompt_ids: list[int], contexts, warmup: int, repeats: int, max_seconds: float,
                new_tokens: int, samples: int, seed: int, device) -> dict:
    """One cached decode step at each context length of `contexts` (the lab's prompt repeated to that
    length), timed with each cache: its runs' median, quartiles and spread; their least-squares growth
    with the context; at the longest context the ratio cat / static with its interval. And whether
    both caches give identical tokens: `new_tokens` greedy after the lab's prompt, and `samples`
    seeded sampled rows (generate's sampling defaults, after torch.manual_seed(seed))."""
    limit = model.config.max_position_embeddings
    if max(contexts) > limit:
        raise ValueError(f"extras.step_anatomy.contexts: {max(contexts)} tokens, more than the model's "
                         f"max_position_embeddings ({limit})")
    prompt = steps.prompt_tensor(model, prompt_ids, new_tokens, device)
    result: dict = {"prompt_len": len(prompt_ids), "contexts": list(contexts), **timing_context(device)}
    for kv_cache in KV_CACHES:
        rows = []
        for context in contexts:
            ids = prompt.repeat(1, -(-context // prompt.shape[1]))[:, :context]
            step = _decode_step_at(model, ids, kv_cache, device)
            for _ in range(warmup):
                step()
            rows.append(timing.summary(timing.repeat(step, repeats, max_seconds)))
        medians = [row["median_s"] for row in rows]
        slope, intercept = np.polyfit(contexts, medians, 1) if len(contexts) > 1 else (0.0, medians[0])
        result[kv_cache] = {"steps": rows, "step_ms": [m * 1e3 for m in medians],
                            "q1_ms": [row["q1_s"] * 1e3 for row in rows], "q3_ms": [row["q3_s"] * 1e3 for row in rows],
                            "ms_per_1000_context": float(slope) * 1e6, "intercept_ms": float(intercept) * 1e3}
    result["cat_over_static"] = timing.ratio_interval(result["cat"]["steps"][-1], result["static"]["steps"][-1])
    greedy = {kv: model.generate(prompt, max_new_tokens=new_tokens, kv_cache=kv, **steps.GREEDY).tolist()
              for kv in KV_CACHES}
    sampled = {}
    for kv_cache in KV_CACHES:
        torch.manual_seed(seed)
        sampled[kv_cache] = model.generate(prompt, max_new_tokens=new_tokens, num_return_sequences=samples,
                                           eos_token_id=None, kv_cache=kv_cache).tolist()
    result["identical_tokens"] = {"greedy": greedy["cat"] == greedy["static"], "sampled": sampled["cat"] == sampled["static"],
                                  "new_tokens": new_tokens, "sampled_rows": samples}
    result["identical_tokens"]["all"] = result["identical_tokens"]["greedy"] and result["identical_tokens"]["sampled"]
    result["static_reserved_bytes"] = StaticCache(model.config, 1, max(contexts), model.lm_head.weight.dtype,
                                                  "meta").nbytes()
    return result
