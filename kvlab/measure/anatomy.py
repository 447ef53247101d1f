"""Where a generation step's time goes, and what a preallocated cache changes (beyond the sheet).

The sheet explains why the cache feeds 56x fewer tokens yet saves only about 4x the time by "the
fixed cost per step (Python and kernel calls)". `step_anatomy` measures that fixed cost and opens
the rest, two independent ways that must agree:

- **Unprofiled.** A shrunk copy of the model (`shrunk_copy`: every layer, head, norm and operator
  call of the model, each on a few numbers) has almost nothing to compute: its step costs what a
  step costs before any arithmetic (Python, dispatch, each operator's own setup). Each call of the
  model's step is followed by one of the copy's; the median of their differences is what the
  model's widths cost, and the model's median step less it is the **fixed cost**.
- **Profiled.** Under torch.profiler the two run in turn again, their parts labelled
  (`labelled_parts`). The operators' self time of the model's step less the copy's is the
  **computation**, by part; the profiler's own cost per operator call is the same in both (the same
  calls), so it drops out of the difference.

Fixed cost plus computation, set beside the model's step timed without the profiler, is the check
(`adds_up` within 10%): it holds when the profiler's computation matches the unprofiled cost of the
widths, and nothing is fitted to make them meet. `cache_curve` times one decode step at growing
context lengths with MiniMind's cache (grown by torch.cat, so each step copies all of it) and with a
StaticCache (allocated once, written in place), optionally compiled, and checks that both caches
give the same tokens.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import time
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from kvlab.engine import model as engine_model
from kvlab.engine import sampling
from kvlab.engine.device import timing_context
from kvlab.engine.model import KV_CACHES, Attention, MiniMindForCausalLM, RMSNorm, StaticCache
from kvlab.measure import steps
from kvlab.facts import timing
from kvlab.facts.budget import Budget

# What a step's time is spent on: the fixed cost, then the arithmetic of the operators by what they do.
COMPUTE_PARTS = ("matmul", "attention", "norm", "rope", "cache", "sampling", "other_operators")
PARTS = ("fixed", *COMPUTE_PARTS)
STEPS = ("with_cache_cat", "with_cache_static", "without_cache")
# The shrunken copy's widths: every layer, head, projection, norm and operator call is still there, on
# a few numbers each (head_dim stays even for RoPE's halves). The heads stay: with one KV head,
# repeat_kv's reshape is a view instead of a copy, and the copy would call other operators.
SHRUNK_SIZES = {"hidden_size": 8, "head_dim": 2, "intermediate_size": 8}
SCOPE = "kvlab::"
# generate's knobs as steps 1-3 set them (kvlab.measure.steps.GREEDY_NO_EOS), generate's own defaults for the rest
_GENERATE = inspect.signature(MiniMindForCausalLM.generate).parameters
GREEDY_KNOBS = {knob: steps.GREEDY_NO_EOS.get(knob, _GENERATE[knob].default)
                for knob in ("temperature", "top_k", "top_p", "repetition_penalty", "do_sample")}
# The anatomy's rounds run whatever its budget: its quartiles need a few profiled pairs a step.
ROUNDS_KEPT = 3
# The parts' sum may differ from the step timed without the profiler by this share and still "add up".
ADDS_UP_WITHIN = 0.10


def shrunk_copy(model: MiniMindForCausalLM) -> MiniMindForCausalLM:
    """The model's architecture (layers, heads, KV heads, vocabulary, norms, tied head) at the widths
    of SHRUNK_SIZES, with fixed random weights, on the model's device and dtype: a step of it
    calls the same operators as the model's, with almost nothing to compute."""
    config = dataclasses.replace(model.config, **SHRUNK_SIZES)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        shrunk = MiniMindForCausalLM(config)
    weight = model.lm_head.weight
    return shrunk.to(device=weight.device, dtype=weight.dtype).eval()


@contextmanager
def labelled_parts(*models: MiniMindForCausalLM):
    """Open a profiler scope named for its part around each: every nn.Linear (matrix products), RMSNorm
    (norms), Attention (attention: what is left in it once its projections, norms, RoPE and cache are
    taken out) of each model, RoPE, the cache's append (MiniMind's torch.cat, or a StaticCache's
    write) and the next-token choice (sampling). All undone on exit; the innermost scope names an
    operator's part."""
    with ExitStack() as undo:
        def scoped(function, part):
            def wrapped(*args, **kwargs):
                with record_function(SCOPE + part):
                    return function(*args, **kwargs)
            return wrapped

        for model in models:
            for module in model.modules():
                part = {nn.Linear: "matmul", RMSNorm: "norm", Attention: "attention"}.get(type(module))
                if part:
                    module.forward = scoped(module.forward, part)
                    undo.callback(delattr, module, "forward")
        for owner, name, part in ((engine_model, "apply_rope", "rope"), (engine_model, "extend_cache", "cache"),
                                  (StaticCache, "write", "cache"), (sampling, "pick", "sampling")):
            original = getattr(owner, name)
            setattr(owner, name, scoped(original, part))
            undo.callback(setattr, owner, name, original)
        yield


@dataclasses.dataclass
class Run:
    """What the profiler saw of one labelled run: operators' self time by part (ns), every operator
    event's name, and the calls made from outside any operator."""

    self_ns: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(COMPUTE_PARTS, 0))
    names: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    calls: int = 0


def runs_of(raw_events) -> dict[str, Run]:
    """The profiler's raw events (start, end, name) sorted into runs: each operator event belongs to
    the outermost kvlab scope that is not a part (the run's name) and to the innermost part scope
    around it ("other_operators" with none); its self time is its duration less its operator
    children's. Events outside every run are left out."""
    rows = sorted((start, -end, name) for start, end, name in raw_events)
    runs: dict[str, Run] = {}
    stack: list[list] = []  # [end, is_operator, duration, children_ns, run, part, name]

    def close(frame):
        end, is_operator, duration, children, run, part, name = frame
        if is_operator and run is not None:
            runs[run].self_ns[part] += duration - children
            runs[run].names[name] += 1

    for start, negative_end, name in rows:
        end = -negative_end
        while stack and stack[-1][0] <= start:
            close(stack.pop())
        parent = stack[-1] if stack else None
        run, part = (parent[4], parent[5]) if parent else (None, "other_operators")
        is_operator = not name.startswith(SCOPE)
        if not is_operator:
            label = name[len(SCOPE):]
            if label in COMPUTE_PARTS:
                part = label
            elif run is None:
                run = label
                runs.setdefault(run, Run())
        elif parent is not None:
            if parent[1]:
                parent[3] += end - start
            elif run is not None:
                runs[run].calls += 1
        stack.append([end, is_operator, end - start, 0, run, part, name])
    while stack:
        close(stack.pop())
    return runs


def _raw_events(prof) -> list[tuple[int, int, str]]:
    """(start ns, end ns, name) of every CPU event the profiler recorded on this thread: its raw
    (Kineto) events, which take milliseconds to read where its FunctionEvent tree takes seconds."""
    events = prof.profiler.kineto_results.events()
    kinds = {"cpu_op", "user_annotation"}
    rows = [(e.start_ns(), e.end_ns(), e.name(), e.start_thread_id()) for e in events
            if str(e.activity_type()).rsplit(".", 1)[-1] in kinds]
    threads = collections.Counter(row[3] for row in rows if row[2].startswith(SCOPE))
    main = threads.most_common(1)[0][0] if threads else None
    return [(start, end, name) for start, end, name, thread in rows if thread == main]


def step_anatomy(model, prompt_ids: list[int], new_tokens: int, warmup: int, repeats: int, rounds: int,
                 profile_repeats: int, device, budget: Budget | None = None) -> dict:
    """The lab's last step, three ways (`_steps_to_open`), on the model and on its shrunk copy.

    In each of `rounds` rounds, for each step: `repeats` / `rounds` calls (rounded up) of the model's
    step and the copy's in turn, without the profiler; then one profiler session of
    `profile_repeats` labelled calls of each, in turn. Each call of the model is paired with the
    copy's right after it, so a drift of the machine reaches both. Per step:
    - `step`: the model's step unprofiled (median, quartiles, spread, contention; kvlab.facts.timing),
      and `fixed` the copy's the same way (each call's clocks in `step_usage` and `fixed_usage`);
    - `width_ms`: the median of the unprofiled pairs' differences, what the model's widths cost;
      `ms["fixed"]` is the step's median less it: the copy's step, set on the model's clock;
    - `compute_ms`: the median over the profiled pairs of the model's operator self time less the
      copy's, the same cost seen by the profiler; split into COMPUTE_PARTS by the parts' differences
      pooled over the pairs (a part that came out below zero, noise around nothing, counts zero);
    - `sum_ms` = fixed + computation and its `shares` (they add up to 1); `sum_of_parts_off` against
      the unprofiled median, which is the profiled computation against the unprofiled widths' cost;
      `adds_up` when within ADDS_UP_WITHIN and both models made the same operator calls
      (`same_operators`).
    Within `budget` (kvlab.facts.budget) the rounds stop where the next one, predicted to take the mean
    of those run, would not fit (three always run); `rounds` is then the rounds run, and what was cut is
    recorded under `budget`."""
    budget = budget or Budget(None)
    shrunk = shrunk_copy(model)
    ids, context_tokens = _last_step_ids(model, prompt_ids, new_tokens, device)
    opened = {"model": _steps_to_open(model, ids, device), "shrunk": _steps_to_open(shrunk, ids, device)}
    for run_step in (*opened["model"].values(), *opened["shrunk"].values()):
        for _ in range(warmup):
            run_step()
    with profile(activities=[ProfilerActivity.CPU]):
        pass  # the profiler's first session sets it up (seconds on a CPU): none that counts
    per_round = -(-repeats // rounds)
    samples = {which: {name: [] for name in STEPS} for which in opened}
    usage = {which: {name: timing.empty_usage() for name in STEPS} for which in opened}
    pairs = {name: [] for name in STEPS}
    pooled = {name: dict.fromkeys(COMPUTE_PARTS, 0) for name in STEPS}
    names = {which: {name: collections.Counter() for name in STEPS} for which in opened}
    calls = {name: [] for name in STEPS}

    def one_round(_) -> tuple[None, float]:
        began = time.perf_counter()
        for name in STEPS:
            for _ in range(per_round):
                for which in opened:
                    samples[which][name] += timing.repeat(opened[which][name], 1, 0, usage=usage[which][name])
            with labelled_parts(model, shrunk), profile(activities=[ProfilerActivity.CPU]) as prof:
                for i in range(profile_repeats):
                    for which in opened:
                        with record_function(f"{SCOPE}{which}|{i}"):
                            opened[which][name]()
            runs = runs_of(_raw_events(prof))
            for i in range(profile_repeats):
                mine, theirs = runs[f"model|{i}"], runs[f"shrunk|{i}"]
                pairs[name].append((sum(mine.self_ns.values()) - sum(theirs.self_ns.values())) / 1e6)
                for part in COMPUTE_PARTS:
                    pooled[name][part] += mine.self_ns[part] - theirs.self_ns[part]
                names["model"][name] += mine.names
                names["shrunk"][name] += theirs.names
                calls[name].append(mine.calls)
        return None, time.perf_counter() - began

    rounds = len(budget.take(list(range(rounds)), one_round, lambda _, done: sum(s for *_, s in done) / len(done),
                             name=lambda index: f"round {index + 1}", keep=ROUNDS_KEPT))
    result = {"prompt_len": len(prompt_ids), "new_tokens": new_tokens, "context_tokens": context_tokens,
              "steps": list(STEPS), "parts": list(PARTS), "compute_parts": list(COMPUTE_PARTS),
              "shrunk_sizes": SHRUNK_SIZES, "rounds": rounds, "profiled_pairs": rounds * profile_repeats,
              "budget": budget.record(), **timing_context(device)}
    judged = timing.judged_on(device)
    for name in STEPS:
        step = timing.summary(samples["model"][name], usage["model"][name], judged)
        fixed = timing.summary(samples["shrunk"][name], usage["shrunk"][name], judged)
        width_ms = float(np.median(np.subtract(samples["model"][name], samples["shrunk"][name]))) * 1e3
        compute_ms = float(np.median(pairs[name]))
        positive = {part: max(pooled[name][part], 0) for part in COMPUTE_PARTS}
        total = sum(positive.values())
        spent = max(compute_ms, 0.0)  # below zero only when the model computes nothing the copy does not
        ms = {"fixed": step["median_s"] * 1e3 - width_ms,
              **{part: spent * positive[part] / total if total > 0 else 0.0 for part in COMPUTE_PARTS}}
        sum_ms = sum(ms.values())
        q1, q3 = np.percentile(pairs[name], [25, 75])
        same = names["model"][name] == names["shrunk"][name]
        off = sum_ms / (step["median_s"] * 1e3) - 1
        result[name] = {
            "step": step, "step_samples_s": samples["model"][name], "step_usage": usage["model"][name],
            "step_ms": step["median_s"] * 1e3, "fixed": fixed, "fixed_samples_s": samples["shrunk"][name],
            "fixed_usage": usage["shrunk"][name], "width_ms": width_ms,
            "compute_ms": compute_ms, "compute_q1_ms": float(q1), "compute_q3_ms": float(q3),
            "compute_pairs_ms": pairs[name], "ms": ms, "sum_ms": sum_ms,
            "shares": {part: ms[part] / sum_ms for part in PARTS},
            "operator_calls": float(np.median(calls[name])),
            "operator_events": sum(names["model"][name].values()) / len(pairs[name]),
            "same_operators": same, "sum_of_parts_off": off, "adds_up": same and abs(off) <= ADDS_UP_WITHIN}
    return result


def _last_step_ids(model, prompt_ids: list[int], new_tokens: int, device) -> tuple[torch.Tensor, int]:
    """Step 3's prompt and the first new_tokens - 1 greedy tokens after it: what the lab's last
    generation step attends over. Returns (the (1, S) ids, S)."""
    prompt = steps.prompt_tensor(model, prompt_ids, new_tokens, device)
    ids = model.generate(prompt, max_new_tokens=new_tokens - 1, use_cache=True, **steps.GREEDY_NO_EOS)
    return ids, ids.shape[1]


def _steps_to_open(model, ids: torch.Tensor, device) -> dict:
    """The step after `ids` three ways: with MiniMind's cache, with a StaticCache holding the same
    (`_decode_step_at`), and without a cache (every token fed again). Each a function of no
    argument that returns once the step is done (a GPU synchronised)."""

    def uncached():
        with torch.inference_mode():
            model.decode_step(ids, None, None, False, **GREEDY_KNOBS)
        steps.sync(device)

    held = _prefilled(model, ids)
    return {"with_cache_cat": _decode_step_at(model, ids, "cat", device, held),
            "with_cache_static": _decode_step_at(model, ids, "static", device, held),
            "without_cache": uncached}


def _decode_step_at(model, ids: torch.Tensor, kv_cache: str, device, held=None):
    """A function of no argument that takes one cached decode step after `ids` (all but the last are
    in the cache), with MiniMind's cache (a fresh torch.cat of all of it) or a StaticCache (the last
    position written again, in place). It returns decode_step's (outputs, next token). The cache is
    filled here without compiling: `held`, MiniMind's cache of all but the last of `ids` when the
    caller has it (`_prefilled`), is used as it is, or copied into the StaticCache, instead of
    prefilling again (the same K and V: a long context's prefill is most of the curve's time)."""
    held_tokens = ids.shape[1] - 1
    if held is None:
        held = _prefilled(model, ids)
    if kv_cache == "cat":
        cache = held
    else:
        cache = StaticCache(model.config, 1, ids.shape[1], model.lm_head.weight.dtype, device)
        for index, (k, v) in enumerate(held):
            cache.keys[index][:, :held_tokens] = k
            cache.values[index][:, :held_tokens] = v

    def step():
        if kv_cache == "static":
            cache.length = held_tokens
        with torch.inference_mode():
            taken = model.decode_step(ids, None, cache, True, **GREEDY_KNOBS)
        steps.sync(device)
        return taken

    return step


def _prefilled(model, ids: torch.Tensor):
    """MiniMind's cache (per layer K and V) of all but the last of `ids`, filled by one forward."""
    with torch.inference_mode():
        return model(ids[:, :-1], use_cache=True).past_key_values


@contextmanager
def compiled_forward(model: MiniMindForCausalLM, mode: str):
    """The model's forward compiled by torch.compile (`mode` is its mode: "default", or
    "reduce-overhead", which adds CUDA graphs on a GPU) for what runs inside, from a clean slate.
    The next-token choice stays eager: torch 2.13's inductor fails on argmax(logits / temperature)
    in its Gumbel-max pass. Undone on exit."""
    torch.compiler.reset()
    model.forward = torch.compile(model.forward, mode=mode)
    try:
        yield
    finally:
        delattr(model, "forward")
        torch.compiler.reset()


def _timed_step(step, repeats: int, max_seconds: float, device) -> tuple[dict, dict]:
    """`step` timed by kvlab.facts.timing.repeat: its summary (contention judged), and its runs' clocks."""
    usage = timing.empty_usage()
    samples = timing.repeat(step, repeats, max_seconds, usage=usage)
    return timing.summary(samples, usage, timing.judged_on(device)), usage


def _summarised(rows: list[dict], contexts, usage: list[dict] | None = None) -> dict:
    """Per-context timing summaries as the curve keeps them: medians and quartiles in ms, and their
    least-squares growth with the context; each context's runs' clocks in `usage`."""
    medians = [row["median_s"] for row in rows]
    slope, intercept = np.polyfit(contexts, medians, 1) if len(contexts) > 1 else (0.0, medians[0])
    return {"steps": rows, "usage": usage or [], "step_ms": [m * 1e3 for m in medians],
            "q1_ms": [row["q1_s"] * 1e3 for row in rows], "q3_ms": [row["q3_s"] * 1e3 for row in rows],
            "ms_per_1000_context": float(slope) * 1e6, "intercept_ms": float(intercept) * 1e3}


def cache_curve(model, prompt_ids: list[int], contexts, warmup: int, repeats: int, max_seconds: float,
                new_tokens: int, samples: int, seed: int, device, compile_mode: str | None = None) -> dict:
    """One cached decode step at each context length of `contexts` (the lab's prompt repeated to that
    length), timed with each cache: its runs' median, quartiles and spread; their least-squares growth
    with the context; at the longest context the ratio cat / static with its interval. And whether
    both caches give identical tokens: `new_tokens` greedy after the lab's prompt, and `samples`
    seeded sampled rows (generate's sampling defaults, after torch.manual_seed(seed)).

    With a `compile_mode`, also the preallocated step with the forward compiled (`compiled_forward`,
    compiled afresh at each context): its first call (which compiles) timed apart, then timed like
    the others; its next token and logits against the eager step's at each context."""
    limit = model.config.max_position_embeddings
    if max(contexts) > limit:
        raise ValueError(f"extras.step_anatomy.contexts: {max(contexts)} tokens, more than the model's "
                         f"max_position_embeddings ({limit})")
    prompt = steps.prompt_tensor(model, prompt_ids, new_tokens, device)
    at_context = [prompt.repeat(1, -(-context // prompt.shape[1]))[:, :context] for context in contexts]
    result: dict = {"prompt_len": len(prompt_ids), "contexts": list(contexts), **timing_context(device)}
    held = [_prefilled(model, ids) for ids in at_context]  # one prefill a context, for both caches
    for kv_cache in KV_CACHES:
        rows, usage = [], []
        for ids, held_here in zip(at_context, held):
            step = _decode_step_at(model, ids, kv_cache, device, held_here)
            for _ in range(warmup):
                step()
            row, clocks = _timed_step(step, repeats, max_seconds, device)
            rows.append(row)
            usage.append(clocks)
        result[kv_cache] = _summarised(rows, contexts, usage)
    result["cat_over_static"] = timing.ratio_interval(result["cat"]["steps"][-1], result["static"]["steps"][-1])
    result["kinds"] = list(KV_CACHES)
    if compile_mode:
        result["kinds"].append("compiled")
        result["compiled"] = _compiled_curve(model, at_context, warmup, repeats, max_seconds, compile_mode, device)
        result["static_over_compiled"] = timing.ratio_interval(result["static"]["steps"][-1],
                                                               result["compiled"]["steps"][-1])
    greedy = {kv: model.generate(prompt, max_new_tokens=new_tokens, kv_cache=kv, **steps.GREEDY_NO_EOS).tolist()
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


def _compiled_curve(model, at_context: list[torch.Tensor], warmup: int, repeats: int, max_seconds: float,
                    mode: str, device) -> dict:
    """The preallocated step with a compiled forward at each context: cache_curve's summary, plus
    `first_call_s` (compiling and the first run), `mode`, and per context whether its next token is
    the eager step's and the largest difference of their logits."""
    rows, usage, first, same, differences = [], [], [], [], []
    for ids in at_context:
        step = _decode_step_at(model, ids, "static", device)
        eager_outputs, eager_token = step()
        with compiled_forward(model, mode):
            first += timing.repeat(step, 1, 0)
            for _ in range(warmup):
                step()
            row, clocks = _timed_step(step, repeats, max_seconds, device)
            rows.append(row)
            usage.append(clocks)
            outputs, token = step()
        same.append(bool(torch.equal(token, eager_token)))
        differences.append(float((outputs.logits.float() - eager_outputs.logits.float()).abs().max()))
    return {**_summarised(rows, [ids.shape[1] for ids in at_context], usage), "mode": mode, "first_call_s": first,
            "same_next_token": same, "max_logit_difference": differences}
