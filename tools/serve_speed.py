"""Many requests at once, served four ways on one machine: the benchmark of issue 36. A hand-run tool:

    python tools/serve_speed.py [--checkpoint results/default/pretrain.pth] [--requests 64] [--rounds 5]

The workload: `--requests` requests all arriving at once, each a prompt of 16 to 200 tokens (bos, then
a seeded stretch of the validation text joined) and 16 to 128 new tokens (seeded; eos ignored, so
every request runs to its count), greedy, one torch thread. Served:

  one_at_a_time  each request alone through the fastest single-request path,
                 kvlab.engine.fast.generate (a compiled step), one after another
  continuous     the serving engine as a user starts it: ServingEngine(model, ServingConfig(num_blocks=...,
                 max_num_seqs=...)), every other knob its default (one compiled step, continuous batching)
  static         the same engine, policy="static" (a batch runs until its longest request is done)
  eager          the engine before its compiled step: compile=False, matmuls="fused"

Every way is warmed first (its compiling kept apart and printed), then timed in `--rounds` rounds, the
ways' order alternating; each round's output tokens a second on the wall clock and on the timing
thread's CPU clock (what the work cost: steadier when other work shares the machine). Every request of
every way is held against `generate` alone (the default torch.cat path): mismatches are counted.
Prints the table and the ratios with their intervals (kvlab.facts.timing); --json writes everything.

--budget then says where the time goes, `--rounds` more rounds alternating: one request at a time in
all and its prompts alone (each request's first token only), and the engine's run split by its step
records (kvlab.serving.stats.StepRecord): the forward passes of the steps that fed prompt positions,
those of the decode-only steps, and the rest (the scheduler, the draws and each request's
bookkeeping); medians, wall seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from kvlab.engine.checkpoint import load_model
from kvlab.engine.data import read_texts
from kvlab.engine.sampling import GREEDY
from kvlab.engine.tokenizer import load_tokenizer
from kvlab.facts import timing
from kvlab.serving import SamplingParams, ServingConfig, ServingEngine, generate_alone

WAYS = ("one_at_a_time", "continuous", "static", "eager")
COUNTS = ("  steps", "  of them decode-only")  # the budget's counts (the rest are seconds)
ENGINE_KNOBS = {"continuous": {}, "static": {"policy": "static"}, "eager": {"compile": False, "matmuls": "fused"}}


def workload(tokenizer, texts: list[str], count: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    """`count` requests: prompts of 16-200 tokens cut from the joined validation text at seeded offsets,
    16-128 greedy new tokens each."""
    ids = tokenizer.encode(" ".join(texts))
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        length = rng.randint(16, 200)
        start = rng.randrange(0, len(ids) - length)
        prompt = [tokenizer.bos_id] + ids[start:start + length - 1]
        params = SamplingParams(max_tokens=rng.randint(16, 128), eos_token_id=None, **GREEDY)
        requests.append((prompt, params))
    return requests


def loaded_engine(way: str, model, requests, num_blocks: int, max_num_seqs: int, **knobs) -> ServingEngine:
    """The engine of one way as a user starts it, every request added."""
    engine = ServingEngine(model, ServingConfig(num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                                                **{**ENGINE_KNOBS[way], **knobs}))
    for prompt, params in requests:
        engine.add_request(prompt, params)
    return engine


def serve_way(way: str, model, requests, num_blocks: int, max_num_seqs: int, **knobs) -> tuple[list, float, float]:
    """Serve every request one way; (each request's samples, wall seconds, timing thread's CPU seconds)."""
    began = timing.clocks()
    if way == "one_at_a_time":
        samples = [generate_alone(model, prompt, params, compiled=True) for prompt, params in requests]
    else:
        engine = loaded_engine(way, model, requests, num_blocks, max_num_seqs, **knobs)
        samples = [output.samples for output in engine.run().outputs]
    return samples, *timing.elapsed(began)


def budget(model, requests, num_blocks: int, max_num_seqs: int, rounds: int) -> dict[str, float]:
    """Where the time goes (see the module's docstring): medians over `rounds` alternating rounds."""
    first_tokens = [(prompt, dataclasses.replace(params, max_tokens=1)) for prompt, params in requests]
    seen: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, asked in (("one at a time", requests), ("  its prompts alone", first_tokens)):
            seen.setdefault(name, []).append(serve_way("one_at_a_time", model, asked, num_blocks, max_num_seqs)[1])
        engine = loaded_engine("continuous", model, requests, num_blocks, max_num_seqs)
        began = time.perf_counter()
        steps = engine.run().stats.steps
        parts = {"engine run": time.perf_counter() - began,
                 "  forward, steps feeding prompts": sum(s.forward_s for s in steps if s.prefill_tokens),
                 "  forward, decode-only steps": sum(s.forward_s for s in steps if not s.prefill_tokens)}
        parts["  the rest (scheduler, draws, bookkeeping)"] = (
            parts["engine run"] - parts["  forward, steps feeding prompts"] - parts["  forward, decode-only steps"])
        parts[COUNTS[0]] = len(steps)
        parts[COUNTS[1]] = sum(not s.prefill_tokens for s in steps)
        for name, value in parts.items():
            seen.setdefault(name, []).append(value)
    return {name: statistics.median(values) for name, values in seen.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("results/default/pretrain.pth"))
    parser.add_argument("--tokenizer", type=Path, default=Path("results/default/tokenizer"))
    parser.add_argument("--val-data", type=Path, default=Path("results/default/corpus/pretrain_val.jsonl"))
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--knobs", type=json.loads, default={},
                        help='other ServingConfig knobs for the engine\'s ways, as JSON (e.g. \'{"block_size": 32}\')')
    parser.add_argument("--ways", nargs="+", default=list(WAYS), choices=WAYS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--budget", action="store_true", help="then where the time goes (see above)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(args.checkpoint)
    requests = workload(load_tokenizer(args.tokenizer), read_texts(args.val_data), args.requests, args.seed)
    tokens = sum(params.max_tokens for _, params in requests)
    print(f"{len(requests)} requests at once, prompts {min(len(p) for p, _ in requests)}-"
          f"{max(len(p) for p, _ in requests)} tokens, {tokens} new tokens in all, greedy, 1 thread")
    alone = [generate_alone(model, prompt, params) for prompt, params in requests]
    result = {"requests": len(requests), "tokens": tokens, "ways": {}, "machine": platform.processor() or platform.machine(),
              "cpu_count": os.cpu_count(), "torch": torch.__version__}
    for way in args.ways:  # warm-up: compiling, then one untimed pass, its tokens checked
        samples, wall, _ = serve_way(way, model, requests, args.num_blocks, args.max_num_seqs, **args.knobs)
        differing = sum(got != expected for got, expected in zip(samples, alone))
        result["ways"][way] = {"warm_up_s": wall, "differing_requests": differing, "wall_s": [], "cpu_s": []}
        print(f"warm-up {way}: {wall:.1f} s (compiling included); {differing} of {len(requests)} requests differ "
              f"from generate alone")
    for round_ in range(args.rounds):
        for way in args.ways if round_ % 2 == 0 else args.ways[::-1]:
            _, wall, cpu = serve_way(way, model, requests, args.num_blocks, args.max_num_seqs, **args.knobs)
            result["ways"][way]["wall_s"].append(wall)
            result["ways"][way]["cpu_s"].append(cpu)
    summaries = {}
    print(f"\n{'way':14} {'tokens/s':>9} {'q1':>7} {'q3':>7} {'per CPU s':>9} {'CPU/wall':>8} {'differ':>6}")
    for way in args.ways:
        found = result["ways"][way]
        usage = {"wall_s": found["wall_s"], "thread_cpu_s": found["cpu_s"], "cpu_s": found["cpu_s"],
                 "switches": [0] * len(found["wall_s"]), "load_1m": [float("nan")] * len(found["wall_s"])}
        wall, cpu = timing.summary(found["wall_s"], usage), timing.summary(found["cpu_s"])
        summaries[way] = (wall, cpu)
        found.update(tokens_per_s=tokens / wall["median_s"], tokens_per_cpu_s=tokens / cpu["median_s"],
                     contended=wall["contended"])
        print(f"{way:14} {tokens / wall['median_s']:9.0f} {tokens / wall['q3_s']:7.0f} {tokens / wall['q1_s']:7.0f} "
              f"{tokens / cpu['median_s']:9.0f} {wall['cpu_share']:8.2f} {found['differing_requests']:6d}"
              f"{'  contended' if wall['contended'] else ''}")
    result["ratios"] = {}
    for slow in ("one_at_a_time", "eager", "static"):
        if slow in summaries and "continuous" in summaries:
            for clock, index in (("wall", 0), ("cpu", 1)):
                ratio = timing.ratio_interval(summaries[slow][index], summaries["continuous"][index])
                result["ratios"][f"continuous over {slow}, {clock}"] = ratio
                print(f"continuous over {slow} ({clock} clock): {ratio['ratio']:.2f}x "
                      f"[{ratio['low']:.2f}, {ratio['high']:.2f}]")
    if args.budget:
        result["budget"] = budget(model, requests, args.num_blocks, args.max_num_seqs, args.rounds)
        print("\nwhere the time goes (medians, wall seconds):")
        for name, value in result["budget"].items():
            print(f"{name:44} {value:.0f}" if name in COUNTS else f"{name:44} {value:.3f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
