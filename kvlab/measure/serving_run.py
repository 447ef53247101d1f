"""A trace served once, and what it cost: by the serving engine (continuous or static batches, its
every step's counts and seconds from the engine's own records), or one request at a time through the
fastest single-request path (`kvlab.engine.fast.generate`, a compiled step), as a user without a
server would run them. Every way's answers are held against `generate` alone (kvlab.serving.alone).
"""

from __future__ import annotations

import math
import resource
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from kvlab.engine import fast
from kvlab.engine.model import MiniMindForCausalLM
from kvlab.kernels import loader
from kvlab.measure.serving_workloads import TraceRequest
from kvlab.serving import RequestOutput, ServingConfig, ServingEngine, generate_alone
from kvlab.serving.stats import EngineStats, StepRecord

WAYS = ("one_at_a_time", "static", "continuous")  # the trace served three ways (POLICIES: the engine's two)
POLICIES = ("static", "continuous")


# --- generate alone --------------------------------------------------------------------------------


def references(model: MiniMindForCausalLM, trace: list[TraceRequest]) -> list[list[list[int]]]:
    """What `generate` gives each request alone (kvlab.serving.generate_alone)."""
    return [generate_alone(model, request.prompt, request.params) for request in trace]


def output_finished(output: RequestOutput) -> bool:
    return any(event.kind == "finish" for event in output.events)


def mismatches(outputs: list[list[list[int]] | None], trace: list[TraceRequest], alone: list[list[list[int]]]) -> dict:
    """The finished requests (`outputs`: each one's samples, None when it did not finish) whose samples
    differ from `generate` alone, greedy and seeded apart."""
    counts = {"greedy_mismatches": 0, "seeded_mismatches": 0, "checked": 0}
    for samples, request, tokens in zip(outputs, trace, alone):
        if samples is None:
            continue
        counts["checked"] += 1
        if samples != tokens:
            counts["seeded_mismatches" if request.params.seed is not None else "greedy_mismatches"] += 1
    return counts


# --- the engine, one run ----------------------------------------------------------------------------


@dataclass
class Run:
    """A trace served once by the engine: its outputs and counters, what was held at every forward step
    (`held`, see `watch`) and the steps' records (their counts and seconds, kvlab.serving.stats)."""

    name: str
    config: ServingConfig
    outputs: list[RequestOutput] = field(default_factory=list)
    stats: EngineStats | None = None
    held: list[dict] = field(default_factory=list)
    involuntary_switches: int = 0  # times the system took the CPU from the process during the run
    started: float = 0.0
    cut: bool = False  # stopped by the time bound with requests unfinished

    @property
    def steps(self) -> list[StepRecord]:
        return self.stats.steps

    @property
    def wall_s(self) -> float:
        """Seconds spent in forward steps (waiting for an arrival not counted)."""
        return sum(step.step_s for step in self.steps)

    @property
    def cpu_s(self) -> float:
        """The engine thread's CPU seconds in those steps: under their wall time, it waited for the CPU."""
        return sum(step.cpu_s for step in self.steps)

    def samples(self) -> list[list[list[int]] | None]:
        return [output.samples if output_finished(output) else None for output in self.outputs]


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
    """Serve the trace once, step by step; the engine records each step's seconds, `watch` what the
    cache holds (its time left out of the step's). `max_seconds` bounds the run (a cut run keeps what
    finished)."""
    run = Run(name, config)
    engine = ServingEngine(model, config, on_schedule=lambda engine, plan: run.held.append(watch(engine, plan)))
    for request in trace:
        engine.add_request(request.prompt, request.params, arrival_step=request.arrival_step)
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    run.started = time.perf_counter()
    while engine.has_unfinished():
        if max_seconds is not None and time.perf_counter() - run.started > max_seconds:
            run.cut = True
            break
        engine.step()
    run.involuntary_switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches
    run.stats = engine.stats
    engine.stats.wall_s = run.wall_s
    run.outputs = [request.output() for request in engine.requests]
    return run


def ready_steps(model: MiniMindForCausalLM, config: ServingConfig, trace: list[TraceRequest] | None = None,
                compile: bool = True) -> dict:
    """The compiled steps a serving measurement runs, made ready before anything is timed: the engine's
    (`config`'s) and the single-request path's (one untimed pass over `trace`, whose requests need them
    all; none without a trace), each compiled where no earlier process kept it, else loaded
    (kvlab.engine.aot). The engine's C++ operators (kvlab.kernels) are built meanwhile, in a thread of
    their own (the compiler's process runs beside the single-request path's compiling). Per step:
    `seconds`, `loaded` (from the cache, or compiled here) and the files it is kept in; the
    single-request path's seconds include its untimed pass."""
    kernels = threading.Thread(target=loader.prebuild, daemon=True) if compile else None
    if kernels is not None:
        kernels.start()
    steps = {}
    if trace is not None:
        began = time.perf_counter()
        one_at_a_time(model, trace, compile)
        programs = [decoder.program for decoder in fast.decoders_of(model).values() if decoder.program is not None]
        steps["one_at_a_time"] = kept(*programs) | {"seconds": time.perf_counter() - began}
    if kernels is not None:
        kernels.join()
    began = time.perf_counter()
    engine = ServingEngine(model, config)
    engine.warm_up()
    program = engine.runner.compiled.program if engine.compiled else None
    steps["engine"] = (kept(program) if program else kept()) | {"seconds": time.perf_counter() - began}
    return steps


def kept(*programs) -> dict:
    """Where compiled steps are kept, whether all were loaded, the seconds that took (none: eager)."""
    return {"seconds": sum(program.compile_s for program in programs),
            "loaded": bool(programs) and all(program.from_cache for program in programs),
            "files": sorted(program.path.name for program in programs)}


def said(steps: dict) -> str:
    """`ready_steps`' result in a line of the log."""
    return "; ".join(f"{name}: {'loaded' if step['loaded'] else 'compiled'} {', '.join(step['files']) or '(eager)'} "
                     f"in {step['seconds']:.1f} s" for name, step in steps.items())


# --- one request at a time ---------------------------------------------------------------------------


@dataclass
class Alone:
    """A trace served one request at a time, in arrival order, each through the fastest single-request
    path: every request's samples, and the wall and CPU seconds of the generations (waiting for an
    arrival not counted, as in an engine's run)."""

    samples: list[list[list[int]]]
    wall_s: float
    cpu_s: float
    involuntary_switches: int


def one_at_a_time(model: MiniMindForCausalLM, trace: list[TraceRequest], compile: bool = True) -> Alone:
    """Each request by `kvlab.engine.fast.generate` alone (after `torch.manual_seed` when it has a seed),
    one after another; `compile` False: `generate(kv_cache="static")`, the same cache eager (where the
    engine runs eager too). Its compiled steps are compiled by an untimed pass first (`one_at_a_time` twice: the
    first warms)."""
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
    samples, wall, cpu = [], 0.0, 0.0
    for request in trace:
        began, began_cpu = time.perf_counter(), time.thread_time()
        samples.append(generate_alone(model, request.prompt, request.params, kv_cache="static", compiled=compile))
        wall += time.perf_counter() - began
        cpu += time.thread_time() - began_cpu
    return Alone(samples, wall, cpu, resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches)


# --- what a run timed ----------------------------------------------------------------------------

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


def throughput(tokens: int, wall_s: float, cpu_s: float, switches: int) -> dict:
    """Output tokens a second on both clocks: the wall clock (what a user waited) and the timing
    thread's CPU clock (what the work cost), whose share of the wall says whether it waited."""
    return {"wall_s": wall_s, "tokens": tokens, "tokens_per_s": tokens / wall_s, "cpu_s": cpu_s,
            "tokens_per_cpu_s": tokens / cpu_s if cpu_s > 0 else math.nan,
            "cpu_share": cpu_s / wall_s if wall_s > 0 else math.nan, "involuntary_switches": switches}


def alone_timings(alone: Alone) -> dict:
    tokens = sum(len(sample) for samples in alone.samples for sample in samples)
    return throughput(tokens, alone.wall_s, alone.cpu_s, alone.involuntary_switches)


def run_timings(run: Run) -> dict:
    """An engine run's times: the answered tokens a second on both clocks, the latencies, its forward
    steps, each step's seconds split (in the scheduler, in the forward, the rest: drawing and
    bookkeeping), and the least-squares line of a step's seconds against the rows it ran
    (`step_fixed_s` + `step_per_row_s` x rows: what a step costs whatever it runs, and what each row
    adds)."""
    tokens = sum(len(sample) for output in run.outputs for sample in output.samples)
    wall = run.wall_s
    scheduler, forward = sum(s.schedule_s for s in run.steps), sum(s.forward_s for s in run.steps)
    rows = [held["rows"] for held in run.held]
    seconds = [s.step_s for s in run.steps]
    per_row, fixed = np.polyfit(rows, seconds, 1) if len(set(rows)) > 1 else (math.nan, float(np.mean(seconds)))
    return {**throughput(tokens, wall, run.cpu_s, run.involuntary_switches), "forward_steps": len(run.steps),
            "scheduler_s": scheduler, "forward_s": forward, "rest_s": wall - scheduler - forward,
            "scheduler_share": scheduler / wall, "forward_share": forward / wall, "step_fixed_s": float(fixed),
            "step_per_row_s": float(per_row), **latency_percentiles(run.outputs)}


# --- what a run did, request by request -----------------------------------------------------------------


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
    return {"requests": requests, "steps": [s.step for s in run.steps],
            "blocks_in_use": [s.blocks_in_use for s in run.steps], "num_blocks": run.config.num_blocks,
            "slots": run.config.max_num_seqs, "policy": run.config.policy}
