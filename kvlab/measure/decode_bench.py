"""Decoding, path against path: how many milliseconds a new token costs with MiniMind's torch.cat
cache, with a preallocated cache, with the compiled step (kvlab.engine.fast), and with MiniMind's
own `generate` when its module is given; and how far each is from what this core's arithmetic allows.

Every path generates the same greedy tokens after the same prompt (steps 1-3's setting), and each
path's tokens are compared with the torch.cat path's. A path's ms per token is a whole generation's
wall time (its prefill included) over its new tokens. The paths are timed in one process on one
torch thread, in rounds: each round runs every path once at every length, so a drift of the machine
(a neighbour on the core) reaches them all alike. Warm-up generations, and the compiled path's
compiling (its first generation of each length), are kept out of the timings and reported apart.

The **arithmetic limit**: the multiply-adds a generation needs (every matrix product of the model,
attention over the tokens each position sees; `generation_flops`) per new token, over the rate at
which this core multiplies matrices (a large float product timed in the same call on the thread's
CPU clock, `matmul_rate`). The **read floor**: the bytes a generation reads (every weight once a
step, the prompt's step included, and the cache each position attends over; `generation_bytes`) per
new token, over the rate at which this core reads a buffer as large as what one step reads
(`read_rate`: a sum over it, on the thread's CPU clock; it sits where the weights sit between steps,
in the caches for the lab's model). No path can beat either; a path's time as a multiple of each
says how much of a step is arithmetic, how much reading, and how much neither (operator calls, the
interpreter, waiting).
"""

from __future__ import annotations

import dataclasses
import resource
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from kvlab.engine import fast
from kvlab.engine.model import StaticCache
from kvlab.engine.device import timing_context
from kvlab.facts import timing
from kvlab.measure import steps
from kvlab.measure.fidelity import build_minimind, load_checkpoint_into
from kvlab.measure.minimind_src import load_source

PATHS = ("cat", "static", "compiled", "minimind")
# The square matrix product that measures the core's rate: large enough to run at full speed,
# small enough (3 MiB in float32) to time in milliseconds.
RATE_MATRIX = 512


# --- the arithmetic --------------------------------------------------------------------------------


def token_flops(config, context: int) -> int:
    """Floating-point operations (a multiply-add counts two) of one position that attends over
    `context` positions (itself included): every projection, the MLP, the LM head, and attention's
    two products over the context."""
    hidden, head_dim = config.hidden_size, config.head_dim
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    projections = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * config.intermediate_size
    attention = 2 * heads * head_dim * context  # q.k over the context, then the weights times V
    per_layer = 2 * (projections + attention)
    return config.num_hidden_layers * per_layer + 2 * hidden * config.vocab_size


def generation_flops(config, prompt_len: int, new_tokens: int) -> int:
    """What a cached generation of `new_tokens` after `prompt_len` computes: the prefill (every
    prompt position, each seeing those before it, each with its logits, as MiniMind computes them),
    then one position per further token, each seeing all before it."""
    prefill = sum(token_flops(config, position + 1) for position in range(prompt_len))
    decode = sum(token_flops(config, prompt_len + step + 1) for step in range(new_tokens - 1))
    return prefill + decode


def token_bytes(config, context: int, element_size: int) -> int:
    """Bytes one decode step reads: every weight once (the layers, the final norm, the LM head; of the
    embedding, its token's row unless it is the LM head too) and the K and V of the `context` positions
    it attends over."""
    hidden, head_dim, inner = config.hidden_size, config.head_dim, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inner + 2 * hidden
    if config.qk_norm:
        per_layer += 2 * head_dim
    weights = config.num_hidden_layers * per_layer + hidden + hidden * config.vocab_size
    if not config.tie_word_embeddings:
        weights += hidden
    cache = 2 * config.num_hidden_layers * context * kv_heads * head_dim
    return (weights + cache) * element_size


def generation_bytes(config, prompt_len: int, new_tokens: int, element_size: int) -> int:
    """What a cached generation of `new_tokens` after `prompt_len` reads: the prefill reads the weights
    once for all its positions and the prompt's K and V, then one step per further token."""
    prefill = token_bytes(config, prompt_len, element_size)
    decode = sum(token_bytes(config, prompt_len + step + 1, element_size) for step in range(new_tokens - 1))
    return prefill + decode


def read_rate(nbytes: int, dtype, device, repeats: int, max_seconds: float) -> dict:
    """This core's read rate over a buffer of `nbytes` (a step's reading: `token_bytes`): a sum over it
    timed like every timing here, on the thread's CPU clock on a CPU. Returns the timing's summary and
    the rate in GB/s at its median and quartiles."""
    buffer = torch.ones(max(1, nbytes // torch.empty((), dtype=dtype).element_size()), dtype=dtype, device=device)

    def read():
        buffer.sum()
        steps.sync(device)

    for _ in range(3):
        read()
    clock = time.thread_time if torch.device(device).type == "cpu" else time.perf_counter
    summary = timing.summary(timing.repeat(read, repeats, max_seconds, clock=clock))
    size = buffer.numel() * buffer.element_size()
    return {"bytes": size, "timing": summary, "gb_per_s": size / summary["median_s"] / 1e9,
            "gb_per_s_low": size / summary["q3_s"] / 1e9, "gb_per_s_high": size / summary["q1_s"] / 1e9}


def matmul_rate(dtype, device, repeats: int, max_seconds: float) -> dict:
    """This core's matrix-product rate: a RATE_MATRIX-square product of `dtype` timed like every
    timing here (kvlab.facts.timing.repeat), on this thread's CPU clock on a CPU (the time a neighbour
    holds the core is not the core's rate; a GPU's product is timed on the wall clock, synchronised).
    Returns the timing's summary and the rate in GFLOP/s at its median and at its quartiles (the
    slow quartile gives the low rate)."""
    a = torch.randn(RATE_MATRIX, RATE_MATRIX, device=device).to(dtype)
    b = torch.randn(RATE_MATRIX, RATE_MATRIX, device=device).to(dtype)
    flops = 2 * RATE_MATRIX**3

    def product():
        torch.mm(a, b)
        steps.sync(device)

    for _ in range(3):
        product()
    clock = time.thread_time if torch.device(device).type == "cpu" else time.perf_counter
    summary = timing.summary(timing.repeat(product, repeats, max_seconds, clock=clock))
    return {"matrix": RATE_MATRIX, "flops": flops, "timing": summary,
            "gflops": flops / summary["median_s"] / 1e9,
            "gflops_low": flops / summary["q3_s"] / 1e9, "gflops_high": flops / summary["q1_s"] / 1e9}


# --- the paths -------------------------------------------------------------------------------------


def path_generators(model, minimind_model, plan: fast.StepPlan, extra_plans: dict) -> dict:
    """Per path, a function (prompt, new_tokens) -> ids of a greedy generation. "compiled" is
    `kvlab.engine.fast.generate` with `plan` (the users' call when it is the default plan)."""
    def with_cache(kv_cache):
        return lambda prompt, n: model.generate(prompt, max_new_tokens=n, kv_cache=kv_cache, **steps.GREEDY_NO_EOS)

    def with_plan(step_plan):
        return lambda prompt, n: fast.generate(model, prompt, max_new_tokens=n, plan=step_plan, **steps.GREEDY_NO_EOS)

    paths = {"cat": with_cache("cat"), "static": with_cache("static"), "compiled": with_plan(plan)}
    if minimind_model is not None:
        paths["minimind"] = lambda prompt, n: minimind_model.generate(prompt, max_new_tokens=n, **steps.GREEDY_NO_EOS)
    for name, step_plan in extra_plans.items():
        paths[f"plan:{name}"] = with_plan(step_plan)
    return paths


def minimind_model_for(kvlab_model, checkpoint, source):
    """MiniMind's own model from the user's file at `source`, holding the checkpoint kvlab's model was
    loaded from (kvlab.engine.checkpoint.load_model, which records its architecture): built and
    loaded as the fidelity job builds it (kvlab.measure.fidelity), in float32, in eval mode."""
    config_class, model_class = load_source(source)
    minimind_model, _ = build_minimind(config_class, model_class, kvlab_model, {}, source)
    load_checkpoint_into(minimind_model, checkpoint, source)
    return minimind_model.to(device=kvlab_model.lm_head.weight.device, dtype=torch.float32).eval()


def _new_ids(ids: torch.Tensor, prompt: torch.Tensor) -> list[int]:
    return ids[0, prompt.shape[1]:].tolist()


def first_generations(model, generators: dict, prompt, lengths, plans: dict, device) -> dict:
    """Each path's first generation of each length, untimed but for its wall time: the tokens every
    later run must repeat, and for the compiled paths the compiling (the first compiled step's own
    time, `compile_s`, read off its Decoder)."""
    first = {}
    for name, generate in generators.items():
        for n in lengths:
            start = time.perf_counter()
            ids = generate(prompt, n)
            steps.sync(device)
            seconds = time.perf_counter() - start
            entry = {"new_ids": _new_ids(ids, prompt), "first_generation_s": seconds}
            if name in plans:
                needed = prompt.shape[1] + n - 1
                decoder = fast.decoder_for(model, prompt.shape[0], needed, plans[name])
                entry["compile_s"] = decoder.compile_s if plans[name].compile_mode else None
                entry["cache_length"] = decoder.cache.max_tokens
            first[(name, n)] = entry
    return first


def timed_rounds(generators: dict, prompt, lengths, warmup: int, runs: int, max_seconds: float, device):
    """Wall seconds of every (path, length) generation, in rounds: `warmup` untimed rounds, then rounds
    of one run of each, at least `runs` of them, more while any timing is unstable (IQR / median >=
    10%) and `max_seconds` of rounds have not passed. Returns (wall seconds, this thread's CPU
    seconds of the same runs), each {(path, length): [per run]}: a run that waited for the core
    shows less CPU than wall time."""
    def run_once(name, n):
        began = timing.clocks()
        generators[name](prompt, n)
        steps.sync(device)
        return timing.elapsed(began)

    pairs = [(name, n) for n in lengths for name in generators]
    for _ in range(warmup):
        for pair in pairs:
            run_once(*pair)
    samples = {pair: [] for pair in pairs}
    cpu = {pair: [] for pair in pairs}
    started = time.perf_counter()
    while True:
        for pair in pairs:
            wall_s, cpu_s = run_once(*pair)
            samples[pair].append(wall_s)
            cpu[pair].append(cpu_s)
        done = len(samples[pairs[0]])
        unstable = any(timing.summary(values)["unstable"] for values in samples.values())
        if done >= runs and (not unstable or time.perf_counter() - started >= max_seconds):
            return samples, cpu


def _row(name: str, n: int, seconds: list[float], cpu_seconds: list[float], first: dict, cat_ids: list[int],
         limit: dict) -> dict:
    per_token = timing.summary([s / n for s in seconds])
    ms = per_token["median_s"] * 1e3
    # kvlab.facts.timing's rule on the thread's own clock: the runs a neighbour took the core from
    waited = sum(timing.run_contended(wall, cpu) for wall, cpu in zip(seconds, cpu_seconds)) / len(seconds)
    return {"path": name, "new_tokens": n, "ms_per_token": ms, "q1_ms": per_token["q1_s"] * 1e3,
            "q3_ms": per_token["q3_s"] * 1e3, "iqr_share": per_token["iqr_share"], "unstable": per_token["unstable"],
            "n": per_token["n"], "cpu_ms_per_token": timing.summary(cpu_seconds)["median_s"] / n * 1e3,
            "contended_runs": waited, "contended": waited >= timing.CONTENDED_RUNS_SHARE,
            "same_tokens_as_cat": first["new_ids"] == cat_ids,
            "compile_s": first.get("compile_s"), "first_generation_s": first["first_generation_s"],
            "cache_length": first.get("cache_length"), "times_limit": ms / limit["limit_ms_per_token"],
            "times_floor": ms / limit["floor_ms_per_token"], "samples_s": seconds}


def decode_bench(model, prompt_ids: list[int], new_tokens=(64, 1024), runs: int = 3, warmup: int = 1,
                 max_seconds: float = 60.0, device="cpu", minimind_model=None, compile_mode: str | None = None,
                 extra_plans: dict | None = None, threads: int = 1) -> dict:
    """Every path's ms per new token at each length of `new_tokens`, side by side (module docstring).

    model: kvlab's MiniMindForCausalLM; minimind_model: MiniMind's own model holding the same weights
    (kvlab.measure.fidelity builds it from the user's file), timed as path "minimind" when given.
    compile_mode: the compiled path's torch.compile mode (None: kvlab.engine.fast.default_plan's,
    "reduce-overhead" with CUDA graphs on a GPU). extra_plans: {name: StepPlan}, further rows
    "plan:NAME" (the fusion ablation). Runs with `threads` torch threads, restored afterwards.

    Returns {"rows": one per path and length (ms_per_token with q1_ms, q3_ms, iqr_share, unstable,
    n; cpu_ms_per_token, the median CPU time of the same runs; same_tokens_as_cat; compile_s and
    cache_length for compiled paths; times_limit, times_floor: multiples of the arithmetic limit and of
    the read floor; samples_s),
    "limit": the arithmetic limit and the read floor per length, the matrix-product and read rates
    they rest on,
    "speedups": cat / compiled and minimind / compiled per length with their intervals,
    "splits": with 1 among the lengths, each path's prefill and decode ms per token at the others,
    "prompt_len", "new_tokens", "process" (CPU over wall time, involuntary context switches), and
    the timing context}."""
    lengths = _checked_lengths(new_tokens)
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    device = torch.device(device)
    plan = compiled_plan(device, compile_mode)
    plans = {"compiled": plan, **{f"plan:{name}": p for name, p in (extra_plans or {}).items()}}
    prompt = steps.prompt_tensor(model, prompt_ids, max(lengths), device)
    kept_threads = torch.get_num_threads()
    steps.use_threads(threads)
    usage_before, wall_before = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    try:
        generators = path_generators(model, minimind_model, plan, extra_plans or {})
        first = first_generations(model, generators, prompt, lengths, plans, device)
        weight = model.lm_head.weight
        rate = matmul_rate(weight.dtype, device, repeats=20, max_seconds=2.0)
        reading = read_rate(token_bytes(model.config, prompt.shape[1] + max(lengths), weight.element_size()),
                            weight.dtype, device, repeats=20, max_seconds=2.0)
        samples, cpu_samples = timed_rounds(generators, prompt, lengths, warmup, runs, max_seconds, device)
        context = timing_context(device)
    finally:
        steps.use_threads(kept_threads)
    usage_after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall_before
    limit = {n: _limit(model.config, prompt.shape[1], n, rate, reading, weight.element_size()) for n in lengths}
    rows = [_row(name, n, samples[(name, n)], cpu_samples[(name, n)], first[(name, n)], first[("cat", n)]["new_ids"],
                 limit[n]) for n in lengths for name in generators]
    cpu = (usage_after.ru_utime + usage_after.ru_stime) - (usage_before.ru_utime + usage_before.ru_stime)
    return {"rows": rows, "paths": list(generators), "prompt_len": prompt.shape[1], "new_tokens": lengths,
            "limit": {"matmul": rate, "read": reading, "per_length": [limit[n] for n in lengths]},
            "speedups": _speedups(rows, lengths), "splits": _splits(rows, lengths), "plan": _plan_dict(plan),
            "extra_plans": {name: _plan_dict(p) for name, p in (extra_plans or {}).items()},
            "process": {"wall_s": wall, "cpu_s": cpu, "cpu_over_wall": cpu / wall,
                        "involuntary_switches": usage_after.ru_nivcsw - usage_before.ru_nivcsw},
            "warmup": warmup, "runs": runs, "max_seconds": max_seconds, **context}


# --- operator calls ----------------------------------------------------------------------------------


def operator_calls(model, prompt_ids: list[int], plans: dict, device="cpu") -> dict:
    """Operator calls of one cached decode step after the prompt (the operators the step calls
    itself, not those they call inside), counted by torch.profiler: with MiniMind's cache ("cat"),
    a StaticCache ("static"), and each eager StepPlan of `plans` ({name: plan}, compile_mode None;
    a compiled step runs inductor's kernels, not operators)."""
    prompt = steps.prompt_tensor(model, prompt_ids, 2, device)
    counts = {}
    with torch.inference_mode():
        for kv_cache in ("cat", "static"):
            counts[kv_cache] = _calls_in(_eager_step(model, prompt, kv_cache, device))
        for name, plan in plans.items():
            if plan.compile_mode is not None:
                raise ValueError(f"operator_calls: plan {name!r} is compiled; count eager plans only")
            fast.generate(model, prompt, max_new_tokens=2, plan=plan, **steps.GREEDY_NO_EOS)  # fills its Decoder's cache
            decoder = fast.decoder_for(model, 1, prompt.shape[1] + 1, plan)
            counts[name] = _calls_in(decoder.run_step)
    return counts


def _eager_step(model, prompt, kv_cache: str, device):
    """The model's own decode step after `prompt`, its cache holding all but the last token."""
    knobs = {knob: value for knob, value in steps.GREEDY_NO_EOS.items() if knob != "eos_token_id"}
    knobs |= {"temperature": 1.0, "repetition_penalty": 1.0}
    held = prompt.shape[1] - 1
    if kv_cache == "cat":
        cache = model(prompt[:, :held], use_cache=True).past_key_values
    else:
        cache = StaticCache(model.config, 1, prompt.shape[1], model.lm_head.weight.dtype, device)
        model(prompt[:, :held], past_key_values=cache, use_cache=True)
    return lambda: model.decode_step(prompt, None, cache, True, **knobs)


def _calls_in(step) -> int:
    """Operator events directly inside one labelled call of `step` (no warm-up needed: eager)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("kvlab::counted_step"):
            step()
    events = prof.events()
    scope = next(event for event in events if event.name == "kvlab::counted_step")
    return sum(1 for event in events if event.cpu_parent is scope)


def compiled_plan(device, compile_mode: str | None) -> fast.StepPlan:
    """`kvlab.engine.fast.generate`'s plan on `device` (its default_plan), with another
    torch.compile mode when one is given (the C++ wrapper is mode "default"'s only)."""
    plan = fast.default_plan(device)
    if compile_mode is None:
        return plan
    default = compile_mode == "default"
    return dataclasses.replace(plan, compile_mode=compile_mode, cpp_wrapper=plan.cpp_wrapper and default,
                               aot=plan.aot and default)


def _checked_lengths(new_tokens) -> list[int]:
    lengths = sorted({int(n) for n in new_tokens})
    if not lengths or lengths[0] < 1:
        raise ValueError(f"new_tokens must be positive token counts, got {list(new_tokens)}")
    return lengths


def _limit(config, prompt_len: int, n: int, rate: dict, reading: dict, element_size: int) -> dict:
    """Per new token at length `n`: the arithmetic limit and the read floor, in ms."""
    flops = generation_flops(config, prompt_len, n) / n
    nbytes = generation_bytes(config, prompt_len, n, element_size) / n
    return {"new_tokens": n, "flops_per_token": flops, "limit_ms_per_token": flops / (rate["gflops"] * 1e9) * 1e3,
            "bytes_per_token": nbytes, "floor_ms_per_token": nbytes / (reading["gb_per_s"] * 1e9) * 1e3}


def _speedups(rows: list[dict], lengths) -> list[dict]:
    """How many times faster the compiled path is than the torch.cat path and than MiniMind's own,
    per length: the ratio of medians and its interval from the quartiles (kvlab.facts.timing)."""
    by = {(row["path"], row["new_tokens"]): row for row in rows}
    out = []
    for n in lengths:
        fast_row = _as_summary(by[("compiled", n)])
        for slow in ("cat", "minimind"):
            if (slow, n) in by:
                out.append({"new_tokens": n, "slow": slow, "fast": "compiled",
                            **timing.ratio_interval(_as_summary(by[(slow, n)]), fast_row)})
    return out


def _splits(rows: list[dict], lengths) -> list[dict]:
    """With 1 among the lengths, each path's prefill (a one-token generation, its median) and its
    decode: ms per further token, from the medians of a longer generation and the one-token one."""
    if 1 not in lengths:
        return []
    by = {(row["path"], row["new_tokens"]): row for row in rows}
    out = []
    for (path, n), row in by.items():
        if n > 1:
            prefill = by[(path, 1)]["ms_per_token"]
            out.append({"path": path, "new_tokens": n, "prefill_ms": prefill,
                        "decode_ms_per_token": (row["ms_per_token"] * n - prefill) / (n - 1)})
    return out


def _as_summary(row: dict) -> dict:
    return {"median_s": row["ms_per_token"], "q1_s": row["q1_ms"], "q3_s": row["q3_ms"]}


def _plan_dict(plan: fast.StepPlan) -> dict:
    return {name: getattr(plan, name) for name in plan.__dataclass_fields__}
