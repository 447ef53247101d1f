"""Serve one trace both ways, static and continuous, and hold every request against `generate` alone.

    python tools/serve_demo.py [--requests 32] [--rate 0.5] [--seed 0] [--threads 1]

A random MiniMind of the lab's default size (hidden 128, 4 layers, 4 heads, 2 KV heads, vocab 2048,
max_position_embeddings 2048) and a seeded Poisson trace: `--requests` requests arriving at `--rate`
per step, prompts of 20-200 tokens (half of them after one of two shared 64-token system prompts),
max_tokens 8-64, half greedy, half sampled with a seed of their own, a few with n = 2.

Each configuration serves the whole trace (compiled, the engine's default, unless it says eager); then
every request is generated alone by `generate`
(after torch.manual_seed(seed) when seeded) and compared: tokens (mismatches, counted), and each
draw's logits bit for bit (draws with other bits, the largest difference), beside the smallest gap
between a greedy draw's two best logits (what a difference would have to exceed to change a token).
Prints one block per configuration: the engine's counters and the wall time.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvlab.engine.config import MiniMindConfig
from kvlab.engine.model import MiniMindForCausalLM, random_weights
from kvlab.engine.sampling import GREEDY
from kvlab.facts.arrivals import poisson_arrivals
from kvlab.serving import SamplingParams, ServingConfig, ServingEngine, generate_alone

LAB_SIZE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=2048,
                max_position_embeddings=2048)


def random_model(seed: int) -> MiniMindForCausalLM:
    """Random weights, large enough that greedy output varies (as tests/helpers.py makes them)."""
    torch.manual_seed(seed)
    return random_weights(MiniMindForCausalLM(MiniMindConfig(**LAB_SIZE)), 0.08)


def poisson_trace(count: int, rate: float, seed: int) -> list[tuple[list[int], SamplingParams, int]]:
    """(prompt, params, arrival step) for `count` requests, exponential gaps at `rate` per step."""
    rng = torch.Generator().manual_seed(seed)
    vocab = LAB_SIZE["vocab_size"]
    systems = [torch.randint(3, vocab, (64,), generator=rng).tolist() for _ in range(2)]
    trace = []
    for index, clock in enumerate(poisson_arrivals(count, rate, seed)):
        length = int(torch.randint(20, 201, (1,), generator=rng))
        if index % 2:  # the shared-prefix variant: a system prompt, then the request's own tokens
            tail = torch.randint(3, vocab, (max(1, length - 64),), generator=rng).tolist()
            prompt = systems[index % 4 // 2] + tail
        else:
            prompt = torch.randint(3, vocab, (length,), generator=rng).tolist()
        max_tokens = int(torch.randint(8, 65, (1,), generator=rng))
        n = 2 if index % 8 == 3 else 1
        if index % 4 < 2:
            params = SamplingParams(max_tokens=max_tokens, n=n, **GREEDY)
        else:
            params = SamplingParams(max_tokens=max_tokens, n=n, temperature=(0.7, 1.0, 1.3)[index % 3],
                                    top_p=(0.9, 0.95, 1.0)[index % 3], top_k=(0, 50, 20)[index % 3], seed=1000 + index)
        trace.append((prompt, params, int(clock)))
    return trace


def alone_with_logits(model, prompt: list[int], params: SamplingParams):
    """`generate`'s tokens for the prompt alone (each row up to its first eos) and every step's logits."""
    logits, forward = [], model.forward

    def recording(*args, **kwargs):
        out = forward(*args, **kwargs)
        logits.append(out.logits[:, -1].clone())
        return out

    model.forward = recording
    try:
        rows = generate_alone(model, prompt, params)
    finally:
        del model.forward
    return rows, logits


def serve(model, trace, config: ServingConfig):
    drawn: dict[int, list[torch.Tensor]] = {}
    engine = ServingEngine(model, config, on_draw=lambda rid, logits: drawn.setdefault(rid, []).append(logits.clone()))
    for prompt, params, arrival in trace:
        engine.add_request(prompt, params, arrival_step=arrival)
    return engine.run(), drawn


def compare(result, drawn, trace, references) -> dict:
    """Token mismatches (greedy, seeded) and draws whose logits differ in any bit."""
    counts = {"greedy_mismatches": 0, "seeded_mismatches": 0, "draws": 0, "draws_with_other_bits": 0,
              "max_abs_diff": 0.0}
    for output, (_, params, _), (tokens, logits) in zip(result.outputs, trace, references):
        if output.samples != tokens:
            counts["seeded_mismatches" if params.seed is not None else "greedy_mismatches"] += 1
        for ours, theirs in zip(drawn[output.request_id], logits):
            counts["draws"] += 1
            if not torch.equal(ours, theirs):
                counts["draws_with_other_bits"] += 1
                counts["max_abs_diff"] = max(counts["max_abs_diff"], (ours - theirs).abs().max().item())
    return counts


def smallest_greedy_gap(trace, references) -> float:
    gaps = []
    for (_, params, _), (_, logits) in zip(trace, references):
        if params.seed is None:
            gaps += [float(top[:, 0].sub(top[:, 1]).min()) for top in (step.topk(2).values for step in logits)]
    return min(gaps)


def report(name: str, result, counts: dict, wall_s: float, cpu_s: float) -> None:
    s = result.stats
    ttft = statistics.median(o.ttft_steps for o in result.outputs)
    latency = statistics.median(o.events[-1].step - o.events[0].step for o in result.outputs)
    print(f"\n{name}")
    print(f"  forward steps {s.forward_steps} (+{s.idle_steps} idle), tokens fed: prefill {s.prefill_tokens}, "
          f"decode {s.decode_tokens}, most in one step {s.summary()['max_tokens_per_step']}")
    print(f"  slot utilisation {s.slot_utilisation:.3f} ({s.useful_slot_steps} useful slot-steps / "
          f"{s.max_num_seqs} slots x {s.forward_steps} steps)")
    print(f"  blocks: peak {s.peak_blocks_in_use}, mean {s.mean_blocks_in_use:.1f} of {s.num_blocks}; "
          f"preemptions {s.preemptions}, recomputed tokens {s.recomputed_tokens}")
    print(f"  prefix cache: {s.prefix_hit_blocks} blocks hit ({s.prefix_hit_tokens} tokens), "
          f"blocks saved by sharing {s.blocks_saved_by_sharing}")
    print(f"  median steps: to first token {ttft}, arrival to finish {latency}")
    print(f"  against generate alone: {counts['greedy_mismatches']} greedy and {counts['seeded_mismatches']} seeded "
          f"requests differ; {counts['draws_with_other_bits']} of {counts['draws']} draws had other logit bits "
          f"(largest difference {counts['max_abs_diff']:.2e})")
    print(f"  wall {wall_s:.2f} s, CPU {cpu_s:.2f} s (a shared machine: CPU time well under wall time x threads "
          f"means the process waited)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rate", type=float, default=0.5, help="arrivals per forward step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = random_model(args.seed)
    trace = poisson_trace(args.requests, args.rate, args.seed)
    print(f"{len(trace)} requests over {trace[-1][2]} steps; prompts {min(len(p) for p, _, _ in trace)}-"
          f"{max(len(p) for p, _, _ in trace)} tokens, max_tokens {min(q.max_tokens for _, q, _ in trace)}-"
          f"{max(q.max_tokens for _, q, _ in trace)}; {sum(q.seed is not None for _, q, _ in trace)} seeded, "
          f"{sum(q.n > 1 for _, q, _ in trace)} with n = 2; torch threads {torch.get_num_threads()}")
    began = time.perf_counter()
    references = [alone_with_logits(model, prompt, params) for prompt, params, _ in trace]
    print(f"generate alone, one request after another: {time.perf_counter() - began:.2f} s; smallest gap between a "
          f"greedy draw's two best logits {smallest_greedy_gap(trace, references):.2e}")
    slots, budget = 8, 512
    configs = {
        "static, batches of 8": ServingConfig(num_blocks=256, max_num_seqs=slots, max_num_batched_tokens=budget * 4,
                                              policy="static", prefix_caching=False),
        "continuous, 8 slots, 512-token budget": ServingConfig(num_blocks=256, max_num_seqs=slots,
                                                               max_num_batched_tokens=budget, prefix_caching=False),
        "continuous + prefix caching": ServingConfig(num_blocks=256, max_num_seqs=slots, max_num_batched_tokens=budget),
        "continuous + prefix caching, chunked prefill, 128-token budget": ServingConfig(
            num_blocks=256, max_num_seqs=slots, max_num_batched_tokens=128, chunked_prefill=True),
        "continuous + prefix caching, a tight pool of 40 blocks": ServingConfig(
            num_blocks=40, max_num_seqs=slots, max_num_batched_tokens=budget),
        "continuous + prefix caching, eager, per-request matmuls (generate's bits)": ServingConfig(
            num_blocks=256, max_num_seqs=slots, max_num_batched_tokens=budget, compile=False),
        "continuous + prefix caching, eager, fused matmuls": ServingConfig(
            num_blocks=256, max_num_seqs=slots, max_num_batched_tokens=budget, compile=False, matmuls="fused"),
    }
    for name, config in configs.items():
        began, began_cpu = time.perf_counter(), time.process_time()
        result, drawn = serve(model, trace, config)
        wall_s, cpu_s = time.perf_counter() - began, time.process_time() - began_cpu
        report(name, result, compare(result, drawn, trace, references), wall_s, cpu_s)


if __name__ == "__main__":
    main()
