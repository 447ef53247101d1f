"""Continuous batching against static batching, on one seeded trace of requests (kvlab.serving).

A trace is a list of requests, each a validation document's prompt (cut to a seeded length), a seeded
`max_tokens`, greedy or sampled with a seed of its own, and an arrival: a step of the engine's clock
(Poisson gaps). Every request runs to its `max_tokens` (no eos), so how long it runs is the trace's
alone: the counts below are the same on every machine.

Served both ways by the same engine, with the same slots, blocks and token budget:

  static      today's way: a batch of up to `slots` requests is admitted together and runs until its
              longest row is done; only then is the next batch admitted (MiniMind's `generate` on a batch)
  continuous  a request joins at the first step with a free slot and free blocks, and leaves at once

Every request is held against `generate` alone (its prompt, its knobs, after torch.manual_seed(seed)
when it has a seed): the requests whose tokens differ are counted, never assumed away.

What is exact (a function of the trace): forward steps, slot utilisation, blocks in use at every step,
preemptions, prefix-cache hits, blocks shared, and the rate sweep's latencies in steps. What is timed:
each run's wall and CPU time and its requests' latencies in seconds, repeated with static and
continuous alternating, as kvlab.facts.timing summarises them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import resource
import time
from dataclasses import dataclass, field

import numpy as np

from kvlab.engine.model import MiniMindForCausalLM
from kvlab.facts import timing
from kvlab.facts.formulas import request_blocks
from kvlab.measure import kv_waste
from kvlab.serving import RequestOutput, SamplingParams, ServingConfig, ServingEngine, generate_alone

log = logging.getLogger("kvlab")

GREEDY = dict(do_sample=False, top_k=0, top_p=1.0)
POLICIES = ("static", "continuous")


# --- traces --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: what `ServingEngine.add_request` takes."""

    prompt: list[int]
    params: SamplingParams
    arrival_step: int = 0

    def record(self, index: int) -> dict:
        """What the trace's files say of it."""
        return {"request": index, "prompt_len": len(self.prompt), "max_tokens": self.params.max_tokens,
                "n": self.params.n, "seed": self.params.seed, "greedy": not self.params.do_sample,
                "arrival_step": self.arrival_step}


def poisson_arrivals(count: int, rate: float, rng: random.Random) -> list[float]:
    """`count` arrival times of a Poisson process of `rate` per unit (exponential gaps), the first at 0."""
    clock, arrivals = 0.0, []
    for index in range(count):
        if index:
            clock += rng.expovariate(rate)
        arrivals.append(clock)
    return arrivals


def request_params(index: int, max_tokens: int, sampling: dict, seed: int, n: int = 1) -> SamplingParams:
    """Every other request greedy; the others, and every request of n > 1 samples (parallel sampling),
    sampled with `sampling`'s knobs and a seed of their own."""
    if index % 2 == 0 and n == 1:
        return SamplingParams(max_tokens=max_tokens, n=n, eos_token_id=None, **GREEDY)
    return SamplingParams(max_tokens=max_tokens, n=n, eos_token_id=None, seed=seed * 1000 + index, **sampling)


def make_trace(prompts: list[list[int]], rate: float | None, max_tokens: tuple[int, int], prompt_min: int,
               sampling: dict, seed: int, n: int = 1, prefix: list[int] | None = None) -> list[TraceRequest]:
    """One request per prompt, in order: cut to a seeded length from `prompt_min` tokens to its own
    (bos kept), `max_tokens` drawn from the range, arriving at Poisson steps of `rate` per forward step
    (None: all at step 0). With `prefix`, each prompt (without its bos) follows it: a system prompt
    shared by every request. The lengths and the arrivals are drawn apart: the same seed gives the same
    requests at any rate, and one pattern of arrivals, scaled."""
    rng = random.Random(seed)
    arrivals = poisson_arrivals(len(prompts), rate, random.Random(f"arrivals {seed}")) if rate else [0] * len(prompts)
    trace = []
    for index, (prompt, arrival) in enumerate(zip(prompts, arrivals)):
        length = rng.randint(min(prompt_min, len(prompt)), len(prompt))
        ids = prompt[:length] if prefix is None else list(prefix) + prompt[1:length]
        params = request_params(index, rng.randint(*max_tokens), sampling, seed, n)
        trace.append(TraceRequest(ids, params, arrival_step=int(arrival)))
    return trace


def spaced(trace: list[TraceRequest], max_tokens: int) -> list[TraceRequest]:
    """The same prompts, each with `max_tokens`, arriving one after another's end: every request is
    served alone (what a time to first token without queueing needs)."""
    return [TraceRequest(request.prompt, dataclasses.replace(request.params, max_tokens=max_tokens),
                         arrival_step=index * (max_tokens + 1))
            for index, request in enumerate(trace)]


# --- generate alone --------------------------------------------------------------------------------


def references(model: MiniMindForCausalLM, trace: list[TraceRequest]) -> list[list[list[int]]]:
    """What `generate` gives each request alone (kvlab.serving.generate_alone)."""
    return [generate_alone(model, request.prompt, request.params) for request in trace]


def mismatches(outputs: list[RequestOutput], trace: list[TraceRequest], alone: list[list[list[int]]]) -> dict:
    """The finished requests whose samples differ from `generate` alone, greedy and seeded apart."""
    counts = {"greedy_mismatches": 0, "seeded_mismatches": 0, "checked": 0}
    for output, request, tokens in zip(outputs, trace, alone):
        if not output_finished(output):
            continue
        counts["checked"] += 1
        if output.samples != tokens:
            counts["seeded_mismatches" if request.params.seed is not None else "greedy_mismatches"] += 1
    return counts


def output_finished(output: RequestOutput) -> bool:
    return any(event.kind == "finish" for event in output.events)


# --- serving one trace, watched ------------------------------------------------------------------


@dataclass
class Run:
    """A trace served once: the engine's outputs and counters, what was held at every forward step
    (`held`, see `watch`), and each step's seconds split into the scheduler's, the forward's and the rest."""

    name: str
    config: ServingConfig
    outputs: list[RequestOutput]
    stats: object
    held: list[dict] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    schedule_s: list[float] = field(default_factory=list)
    forward_s: list[float] = field(default_factory=list)
    watch_s: float = 0.0  # spent in `watch`, inside the steps: taken off their seconds
    cpu_s: float = 0.0  # the process's CPU seconds in the forward steps: under their wall time, it waited
    involuntary_switches: int = 0  # times the system took the CPU from the process during the run
    started: float = 0.0
    cut: bool = False  # stopped by the time bound with requests unfinished

    @property
    def wall_s(self) -> float:
        """Seconds spent in forward steps (waiting for an arrival not counted)."""
        return sum(self.step_s)


def watch(engine: ServingEngine, plan) -> dict:
    """What the cache holds once a step is scheduled (before its forward): blocks held (each once),
    block-table entries (a shared block once per table: the blocks without sharing), and the slots of
    those entries split as the vLLM paper splits them: holding a position's K and V once the step is
    done, to be filled later by the request, never filled (past its last position)."""
    size = engine.config.block_size
    ends = {id(piece.request): piece.end for piece in plan.pieces}
    entries = positions = later = 0
    running = engine.scheduler.running
    for request in running:
        end = ends.get(id(request), request.num_computed)
        for index, row in enumerate(request.rows):
            slots = len(row.block_table) * size
            held = end if (request.forked or index == 0) else 0
            held = min(held, slots)
            filled = min(slots, request.most_positions)
            entries += len(row.block_table)
            positions += held
            later += max(0, filled - held)
    return {"blocks": engine.pool.num_used, "entries": entries, "positions": positions, "later": later,
            "never": entries * size - positions - later, "running": len(running),
            "rows": sum(request.n for request in running)}


def serve(model: MiniMindForCausalLM, trace: list[TraceRequest], config: ServingConfig, name: str,
          max_seconds: float | None = None) -> Run:
    """Serve the trace once, step by step, timing each step and its scheduler and forward apart;
    `max_seconds` bounds the run (a cut run keeps what finished)."""
    engine = ServingEngine(model, config)
    for request in trace:
        engine.add_request(request.prompt, request.params, arrival_step=request.arrival_step)
    run = Run(name, config, [], engine.stats)
    schedule, forward = engine.scheduler.schedule, engine.runner.forward

    def timed_schedule():
        begun = time.perf_counter()
        plan = schedule()
        run.schedule_s.append(time.perf_counter() - begun)
        if plan.pieces:
            begun = time.perf_counter()
            run.held.append(watch(engine, plan))
            run.watch_s += time.perf_counter() - begun
        return plan

    def timed_forward(chunks):
        begun = time.perf_counter()
        out = forward(chunks)
        run.forward_s.append(time.perf_counter() - begun)
        return out

    engine.scheduler.schedule, engine.runner.forward = timed_schedule, timed_forward
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    run.started = time.perf_counter()
    while engine.has_unfinished():
        if max_seconds is not None and time.perf_counter() - run.started > max_seconds:
            run.cut = True
            break
        steps, watched = len(engine.stats.steps), run.watch_s
        begun, begun_cpu = time.perf_counter(), time.process_time()
        engine.step()
        seconds = time.perf_counter() - begun - (run.watch_s - watched)
        if len(engine.stats.steps) > steps:  # a forward step, not a wait for an arrival
            run.step_s.append(seconds)
            run.cpu_s += time.process_time() - begun_cpu
        else:
            run.schedule_s.pop()  # the scheduler found nothing to run: a wait, not a step
    engine.stats.wall_s = run.wall_s
    run.involuntary_switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches
    run.outputs = [request.output() for request in engine.requests]
    return run


def engine_config(settings: dict, policy: str, **changes) -> ServingConfig:
    """The engine's knobs from the trace settings (extras.serving)."""
    knobs = dict(num_blocks=settings["num_blocks"], block_size=settings["block_size"],
                 max_num_seqs=settings["slots"], max_num_batched_tokens=settings["max_batched_tokens"],
                 prefix_caching=False, policy=policy, matmuls=settings["matmuls"])
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


# --- what a run timed ------------------------------------------------------------------------------

LATENCIES = ("ttft_s", "tpot_s", "latency_s")
PERCENTILES = (("p50", 50), ("p90", 90), ("max", 100))


def latency_percentiles(outputs: list[RequestOutput]) -> dict:
    """p50, p90 and max of every finished request's TTFT, TPOT and end-to-end latency, in seconds."""
    found = {}
    finished = [output for output in outputs if output_finished(output)]
    for name in LATENCIES:
        values = [getattr(output, name) for output in finished]
        values = [value for value in values if value is not None]
        for label, q in PERCENTILES:
            found[f"{name.removesuffix('_s')}_{label}_s"] = float(np.percentile(values, q)) if values else math.nan
    return found


def run_timings(run: Run) -> dict:
    """A run's times: its forward steps' wall time, the answered tokens a second, the latencies, each
    step's seconds split (in the scheduler, in the forward, the rest: drawing and bookkeeping), and the
    least-squares line of a step's seconds against the rows it ran (`step_fixed_s` + `step_per_row_s` x
    rows: what a step costs whatever it runs, and what each row adds); and the process's CPU seconds in
    the steps, whose share of their wall time says whether it waited for the CPU (pyperf's warning)."""
    tokens = sum(len(sample) for output in run.outputs for sample in output.samples)
    wall = run.wall_s
    scheduler, forward = sum(run.schedule_s), sum(run.forward_s)
    rows = [held["rows"] for held in run.held]
    per_row, fixed = np.polyfit(rows, run.step_s, 1) if len(set(rows)) > 1 else (math.nan, float(np.mean(run.step_s)))
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "forward_steps": len(run.step_s),
            "cpu_s": run.cpu_s, "tokens_per_cpu_s": tokens / run.cpu_s, "cpu_share": run.cpu_s / wall,
            "involuntary_switches": run.involuntary_switches,
            "scheduler_s": scheduler, "forward_s": forward, "rest_s": wall - scheduler - forward,
            "scheduler_share": scheduler / wall, "forward_share": forward / wall, "step_fixed_s": float(fixed),
            "step_per_row_s": float(per_row), **latency_percentiles(run.outputs)}


def compared(comparison: str, quantity: str, unit: str, names: tuple[str, str], samples: tuple[list, list],
             higher_is_better: bool = False, ratio_of: bool = True) -> dict:
    """One row of serve_timing.csv: a quantity's samples on a baseline and on a subject, each
    summarised, and how many times the subject beats the baseline, with its interval (baseline time
    over subject time; for a rate, subject over baseline). `ratio_of` False (a share, a fit's
    coefficient): set side by side, no ratio."""
    baseline, subject = (timing.summary(values) for values in samples)
    row = {"comparison": comparison, "quantity": quantity, "unit": unit}
    for side, name, summary in (("baseline", names[0], baseline), ("subject", names[1], subject)):
        row.update({side: name, f"{side}_median": summary["median_s"], f"{side}_q1": summary["q1_s"],
                    f"{side}_q3": summary["q3_s"], f"{side}_n": summary["n"],
                    f"{side}_iqr_share": summary["iqr_share"]})
    if not ratio_of:
        ratio = {"ratio": math.nan, "low": math.nan, "high": math.nan}
    elif higher_is_better:
        ratio = timing.ratio_interval(subject, baseline)
    else:
        ratio = timing.ratio_interval(baseline, subject)
    row.update({"ratio": ratio["ratio"], "ratio_low": ratio["low"], "ratio_high": ratio["high"],
                "unstable": baseline["unstable"] or subject["unstable"]})
    return row


def timing_rows(times: dict[str, list[dict]], prefix_ttft: dict[str, list[float]]) -> list[dict]:
    """serve_timing.csv: continuous against static on the trace (`times`: each policy's run timings,
    one per repeat), and the time to first token with the prefix cache against without."""
    names = POLICIES
    column = lambda policy, key: [t[key] for t in times[policy]]  # noqa: E731
    rows = [compared("continuous vs static", "throughput", "tokens/s", names,
                     (column("static", "tokens_per_s"), column("continuous", "tokens_per_s")), higher_is_better=True),
            compared("continuous vs static", "wall", "s", names, (column("static", "wall_s"),
                                                                  column("continuous", "wall_s"))),
            # the same from the CPU seconds the process ran: steadier when other work shares the CPU
            compared("continuous vs static", "throughput_cpu", "tokens/CPU s", names,
                     (column("static", "tokens_per_cpu_s"), column("continuous", "tokens_per_cpu_s")),
                     higher_is_better=True)]
    for name in LATENCIES:
        for label, _ in PERCENTILES:
            key = f"{name.removesuffix('_s')}_{label}_s"
            rows.append(compared("continuous vs static", key.removesuffix("_s"), "s", names,
                                 (column("static", key), column("continuous", key))))
    for key in ("scheduler_share", "forward_share", "cpu_share"):
        rows.append(compared("continuous vs static", key, "share", names,
                             (column("static", key), column("continuous", key)), ratio_of=False))
    for key in ("step_fixed_s", "step_per_row_s"):
        rows.append(compared("continuous vs static", key.removesuffix("_s"), "s", names,
                             (column("static", key), column("continuous", key)), ratio_of=False))
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


def check_fits(trace: list[TraceRequest], config: ServingConfig, key: str) -> None:
    """Refuse, in one line naming the config key, a trace with a request the pool could never hold."""
    size = config.block_size
    for index, request in enumerate(trace):
        needed = request_blocks(len(request.prompt), request.params.max_tokens, request.params.n, size)
        if needed > config.num_blocks:
            raise ValueError(f"config key '{key}': {config.num_blocks} blocks of {size} tokens cannot hold request "
                             f"{index} ({len(request.prompt)}-token prompt + max_tokens {request.params.max_tokens}, "
                             f"n={request.params.n}: {needed} blocks)")


def request_records(run: Run, trace: list[TraceRequest], alone: list[list[list[int]]] | None) -> list[dict]:
    """One line of serve_events.jsonl per request: the trace's request, what serving it cost, its events
    (kind, step, seconds from the run's start, the tokens drawn), and whether it matched `generate` alone."""
    records = []
    for index, (output, request) in enumerate(zip(run.outputs, trace)):
        events = [{"kind": event.kind, "step": event.step, "t_s": event.time - run.started,
                   **({"tokens": list(event.tokens)} if event.tokens is not None else {})}
                  for event in output.events]
        records.append({"run": run.name, **request.record(index), "preemptions": output.preemptions,
                        "recomputed_tokens": output.recomputed_tokens, "cached_tokens": output.cached_tokens,
                        "finished": output_finished(output),
                        "same_as_alone": None if alone is None else output.samples == alone[index],
                        "events": events})
    return records


def timeline(run: Run) -> dict:
    """What the timeline figure draws of a run: each request's steps of arrival, admission, first token
    and finish (and its preemptions), and each forward step's blocks in use."""
    requests = []
    for output in run.outputs:
        steps = {}
        for event in output.events:
            steps.setdefault(event.kind, []).append(event.step)
        requests.append({"arrival": steps["arrival"][0], "admissions": steps.get("admission", []),
                         "first_token": steps.get("first_token", [None])[0], "finish": steps.get("finish", [None])[0],
                         "preemptions": steps.get("preemption", [])})
    return {"requests": requests, "steps": [s.step for s in run.stats.steps],
            "blocks_in_use": [s.blocks_in_use for s in run.stats.steps], "num_blocks": run.config.num_blocks,
            "slots": run.config.max_num_seqs, "policy": run.config.policy}


def main_trace(prompts: list[list[int]], settings: dict, rate: float | None) -> list[TraceRequest]:
    """The trace both policies serve: the first `requests` validation prompts, at `rate` per step."""
    s = settings
    return make_trace(prompts[: s["requests"]], rate, (s["max_tokens_min"], s["max_tokens_max"]), s["prompt_min"],
                      sampling_knobs(s), s["seed"])


def sampling_knobs(settings: dict) -> dict:
    return dict(temperature=settings["temperature"], top_p=settings["top_p"])


def traces(prompts: list[list[int]], system_prompt: list[int], settings: dict) -> dict[str, list[TraceRequest]]:
    """The three traces, each from the first validation prompts: `trace` (distinct prompts), `prefix`
    (the lab's prompt as a system prompt before each document's first question_tokens tokens) and
    `parallel` (parallel_n samples of each prompt, every request sampled)."""
    s = settings
    span = (s["max_tokens_min"], s["max_tokens_max"])
    questions = [prompt[: s["question_tokens"] + 1] for prompt in prompts[: s["prefix_requests"]]]
    return {"trace": main_trace(prompts, s, s["rate"]),
            "prefix": make_trace(questions, s["rate"], span, s["question_tokens"] + 1, sampling_knobs(s), s["seed"] + 1,
                                 prefix=system_prompt),
            "parallel": make_trace(prompts[: s["parallel_requests"]], s["rate"], span, s["prompt_min"],
                                   sampling_knobs(s), s["seed"] + 2, n=s["parallel_n"])}


def check_block_size(model: MiniMindForCausalLM, block_size: int) -> None:
    """A block size must divide the model's positions (the engine's rule), named by its config key."""
    most = model.config.max_position_embeddings
    if most % block_size:
        raise ValueError(f"config key 'extras.serving.block_size': {block_size} does not divide the model's "
                         f"max_position_embeddings ({most}), so whole blocks cannot cover every position")


def measure(model: MiniMindForCausalLM, prompts: list[list[int]], system_prompt: list[int], settings: dict,
            bytes_per_token: int) -> dict:
    """Everything the serve_trace rule writes (see the module's docstring): the counts, the memory
    comparison, the timings, every request's events and the timeline's data."""
    s = settings
    check_block_size(model, s["block_size"])
    made = traces(prompts, system_prompt, s)
    roomy = {policy: engine_config(s, policy) for policy in POLICIES}
    tight = engine_config(s, "continuous", num_blocks=s["tight_blocks"])
    for name, trace in made.items():
        check_fits(trace, roomy["continuous"], "extras.serving.num_blocks")
    check_fits(made["trace"], tight, "extras.serving.tight_blocks")
    progress = Progress()
    alone = {name: references(model, trace) for name, trace in made.items()}
    progress.done("generate alone, every request of the three traces")

    counts, events, times = [], [], {policy: [] for policy in POLICIES}
    runs: dict[str, Run] = {}

    def checked(run: Run, trace_name: str, trace: list[TraceRequest], reference) -> None:
        found = mismatches(run.outputs, trace, reference)
        if run.name not in runs:
            runs[run.name] = run
            counts.append(counts_row(run, trace_name, trace, found))
            events.extend(request_records(run, trace, reference))
        elif run.stats.forward_steps != runs[run.name].stats.forward_steps:
            raise RuntimeError(f"{run.name}: a repeat took another number of steps (the schedule should not vary)")
        if found["greedy_mismatches"] or found["seeded_mismatches"]:
            log.warning("%s: %d greedy and %d seeded requests differ from generate alone", run.name,
                        found["greedy_mismatches"], found["seeded_mismatches"])

    trace = made["trace"]
    for repeat in range(s["repeats"]):
        for policy in POLICIES if repeat % 2 == 0 else POLICIES[::-1]:  # alternating, so neither goes first always
            run = serve(model, trace, roomy[policy], policy)
            checked(run, "trace", trace, alone["trace"])
            times[policy].append(run_timings(run))
            log.info("repeat %d, %s: %d steps, %.3f s, %.0f tokens/s", repeat, policy, run.stats.forward_steps,
                     run.wall_s, times[policy][-1]["tokens_per_s"])
    progress.done(f"static and continuous, {s['repeats']} runs each")
    checked(serve(model, trace, tight, "continuous, tight pool"), "trace", trace, alone["trace"])
    for caching in (True, False):
        config = engine_config(s, "continuous", prefix_caching=caching)
        run = serve(model, made["prefix"], config, f"continuous, prefix cache {'on' if caching else 'off'}")
        checked(run, "prefix", made["prefix"], alone["prefix"])
    checked(serve(model, made["parallel"], roomy["continuous"], f"continuous, n = {s['parallel_n']}"), "parallel",
            made["parallel"], alone["parallel"])

    progress.done(f"the tight pool, the shared prefix, n = {s['parallel_n']}")
    # time to first token of a long shared prefix, each request alone, with the prefix cache and without
    one_token = spaced(made["prefix"], 1)
    first_tokens = [[row[:1] for row in rows] for rows in alone["prefix"]]
    prefix_ttft: dict[str, list[float]] = {"on": [], "off": []}
    for repeat in range(s["repeats"]):
        for caching in ((True, False) if repeat % 2 == 0 else (False, True)):
            config = engine_config(s, "continuous", prefix_caching=caching)
            run = serve(model, one_token, config, f"prefix alone, cache {'on' if caching else 'off'}")
            checked(run, "prefix alone", one_token, first_tokens)
            # the first request finds nothing cached either way
            prefix_ttft["on" if caching else "off"].append(float(np.median([o.ttft_s for o in run.outputs[1:]])))

    progress.done("the prefix cache's time to first token")
    max_length = s["prompt_cap"] + s["max_tokens_max"]
    memory = memory_rows([runs["continuous"], runs["continuous, tight pool"]], trace, max_length, bytes_per_token,
                         s["tight_blocks"])
    detail = {"settings": s, "block_bytes": bytes_per_token * s["block_size"],
              "traces": {name: [request.record(i) for i, request in enumerate(t)] for name, t in made.items()},
              "timelines": {name: timeline(runs[name]) for name in (*POLICIES, "continuous, tight pool")},
              "summaries": {name: run.stats.summary() for name, run in runs.items()},
              "timings": times, "prefix_ttft_s": prefix_ttft}
    return {"counts": counts, "memory": memory, "timing": timing_rows(times, prefix_ttft), "events": events,
            "detail": detail}


# --- latency against the request rate ---------------------------------------------------------------


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
    row["tokens_per_s"] = sum(tokens) / run.wall_s if run.step_s else math.nan
    # under 1: the process waited for the CPU during its steps (other work shared it)
    row["cpu_share"] = run.cpu_s / run.wall_s if run.step_s else math.nan
    return row


def rate_sweep(model: MiniMindForCausalLM, prompts: list[list[int]], settings: dict) -> tuple[list[dict], dict]:
    """Latency against the request rate, static and continuous, on the trace's requests. First each
    policy's saturation throughput: the requests all queued at step 0, served as fast as it can, in
    requests a forward step (exact; the seconds it took beside). Then the same requests arriving at
    Poisson steps at each fraction of continuous's saturation rate (one pattern of arrivals, scaled), each
    run bounded by the trace's count and by `rate_max_seconds`. On the step clock the latencies are the
    schedule's alone, the same on every machine; their seconds say what this machine made of them."""
    s = settings
    check_block_size(model, s["block_size"])
    progress = Progress()
    queued = main_trace(prompts, s, None)
    roomy = {policy: engine_config(s, policy) for policy in POLICIES}
    check_fits(queued, roomy["continuous"], "extras.serving.num_blocks")
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
    for index, fraction in enumerate(s["rate_fractions"]):
        rate = fraction * base
        arriving = main_trace(prompts, s, rate)
        for policy in POLICIES if index % 2 == 0 else POLICIES[::-1]:
            run = serve(model, arriving, roomy[policy], f"{policy} at {fraction:g} x saturation",
                        max_seconds=s["rate_max_seconds"])
            rows.append(rate_row(run, fraction, rate) | {"saturation_fraction_static": static_saturates})
            runs.append({"run": run.name, "fraction": fraction, "rate_per_step": rate, "policy": policy,
                         "cut": run.cut, "requests": request_records(run, arriving, None)})
            log.info("%s: %d of %d finished, normalized latency %.2f steps (%.4f s) a token%s", run.name,
                     rows[-1]["finished"], len(queued), rows[-1]["normalized_latency_steps"],
                     rows[-1]["normalized_latency_s"], " (cut by rate_max_seconds)" if run.cut else "")
    rows.sort(key=lambda row: (POLICIES.index(row["policy"]), row["fraction"]))
    progress.done("the rate sweep")
    return rows, {"saturation": saturation, "rate_fractions": list(s["rate_fractions"]),
                  "rate_max_seconds": s["rate_max_seconds"], "runs": runs}
