"""Time decoding on this machine, path against path (kvlab.measure.decode_bench), on a model of the lab's
default size with random weights. A hand-run tool (not a rule):

    python tools/decode_speed.py [--new-tokens 64 1024] [--runs 3] [--ablation] [--minimind-src PATH]

The model is config.yaml's default_model.model (hidden 128, 4 layers, 4 heads, 2 KV heads, 2048
positions) with the tokenizer's vocab_size (2048), its weights drawn at random (the arithmetic and
the operator calls are a trained model's; only the tokens differ); the prompt is 201 random ids, as
long as the lab's. Prints a table: ms per new token of each path (median, quartiles, unstable
flags), its tokens against the torch.cat path's, the compile seconds, and the arithmetic limit.

--ablation adds the fusion ablation (kvlab.engine.fast.StepPlan, at the first --new-tokens length):
the static-shape step eager without any fusion, with each fusion alone and with all of them, and
compiled without and with them; and each eager step's operator calls.
--minimind-src times MiniMind's own `generate` too, from your model_minimind.py (its model built
and loaded as kvlab.measure.fidelity does, from a checkpoint of the random weights).
--checkpoint PATH times a MiniMind .pth instead of random weights (e.g. results/default/sft.pth),
--prompt-json PATH its prompt (results/prompt.json's "ids") instead of random ids.
--json PATH writes the whole result.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from kvlab.engine import fast
from kvlab.engine.checkpoint import load_model, save_checkpoint
from kvlab.engine.config import MiniMindConfig
from kvlab.engine.model import MiniMindForCausalLM, random_weights
from kvlab.measure import decode_bench

ROOT = Path(__file__).resolve().parent.parent
PROMPT_LEN = 201
WEIGHT_STD = 0.08  # large enough that greedy tokens vary, so "same tokens" means something

# The fusion ablation: each plan's name says what it changes from MiniMind's arithmetic.
ABLATION = {
    "eager, no fusion": fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="repeat_kv", compile_mode=None),
    "eager, fused qkv": fast.StepPlan(fused_qkv=True, fused_gate_up=False, attention="repeat_kv", compile_mode=None),
    "eager, fused gate/up": fast.StepPlan(fused_qkv=False, fused_gate_up=True, attention="repeat_kv", compile_mode=None),
    "eager, grouped heads": fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="grouped", compile_mode=None),
    "eager, sdpa gqa": fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="sdpa", compile_mode=None),
    "eager, all fused": fast.StepPlan(attention="grouped", compile_mode=None),
    "compiled, no fusion": fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="repeat_kv"),
    "compiled, all fused": fast.StepPlan(attention="grouped"),
    "compiled, all fused, rowwise": fast.StepPlan(attention="grouped", rowwise_matmul=True),
    "compiled, all fused, rowwise, C++ wrapper": fast.StepPlan(attention="grouped", rowwise_matmul=True,
                                                               cpp_wrapper=True),
    "ahead of time, library GEMV": fast.StepPlan(attention="grouped", aot=True),
    "ahead of time, rowwise (the default)": fast.StepPlan(attention="grouped", rowwise_matmul=True, aot=True),
}


def lab_sized_model(seed: int) -> MiniMindForCausalLM:
    """config.yaml's default_model.model with the tokenizer's vocab_size, random weights."""
    defaults = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))["default_model"]
    config = MiniMindConfig(**defaults["model"], vocab_size=defaults["tokenizer"]["vocab_size"])
    torch.manual_seed(seed)
    return random_weights(MiniMindForCausalLM(config), WEIGHT_STD)


def minimind_twin(model: MiniMindForCausalLM, source: Path, folder: Path):
    """MiniMind's own model from the file at `source`, holding `model`'s weights: through a checkpoint,
    loaded back by kvlab (which infers the architecture) and into MiniMind's class as the fidelity job
    does (kvlab.measure.decode_bench.minimind_model_for)."""
    checkpoint = folder / "random.pth"
    save_checkpoint(model, checkpoint)
    return decode_bench.minimind_model_for(load_model(checkpoint), checkpoint, source)


def table(result: dict) -> str:
    """The rows as a fixed-width table, then the limit and the speedups."""
    lines = [f"{'path':44} {'tokens':>6} {'ms/token':>9} {'q1':>8} {'q3':>8} {'iqr%':>5} {'n':>3} {'cpu ms':>7} "
             f"{'same':>5} {'compile s':>9} {'x limit':>8} {'x floor':>8}"]
    for row in result["rows"]:
        compile_s = "" if row["compile_s"] is None else f"{row['compile_s']:.1f}"
        flag = " unstable" if row["unstable"] else ""
        lines.append(f"{row['path']:44} {row['new_tokens']:>6} {row['ms_per_token']:>9.3f} {row['q1_ms']:>8.3f} "
                     f"{row['q3_ms']:>8.3f} {100 * row['iqr_share']:>5.1f} {row['n']:>3} {row['cpu_ms_per_token']:>7.3f} "
                     f"{str(row['same_tokens_as_cat']):>5} {compile_s:>9} {row['times_limit']:>8.1f} "
                     f"{row['times_floor']:>8.2f}{flag}")
    rate = result["limit"]["matmul"]
    lines.append(f"matrix product {rate['matrix']}^2: {rate['gflops']:.1f} GFLOP/s "
                 f"[{rate['gflops_low']:.1f}, {rate['gflops_high']:.1f}]")
    read = result["limit"]["read"]
    lines.append(f"reading {read['bytes'] / 1e6:.2f} MB: {read['gb_per_s']:.1f} GB/s "
                 f"[{read['gb_per_s_low']:.1f}, {read['gb_per_s_high']:.1f}]")
    for limit in result["limit"]["per_length"]:
        lines.append(f"limit at {limit['new_tokens']} new tokens: {limit['flops_per_token'] / 1e6:.2f} MFLOP/token, "
                     f"{limit['limit_ms_per_token']:.4f} ms/token; floor {limit['bytes_per_token'] / 1e6:.2f} "
                     f"MB/token, {limit['floor_ms_per_token']:.4f} ms/token")
    for split in result.get("splits", []):
        lines.append(f"{split['path']} at {split['new_tokens']}: prefill {split['prefill_ms']:.2f} ms, decode "
                     f"{split['decode_ms_per_token']:.4f} ms/token")
    for speedup in result["speedups"]:
        lines.append(f"{speedup['slow']} / {speedup['fast']} at {speedup['new_tokens']}: {speedup['ratio']:.2f}x "
                     f"[{speedup['low']:.2f}, {speedup['high']:.2f}]")
    process = result["process"]
    lines.append(f"process: {process['wall_s']:.0f} s wall, CPU/wall {process['cpu_over_wall']:.2f}, "
                 f"{process['involuntary_switches']} involuntary context switches; {result['processor']}, "
                 f"{result['torch_threads']} torch thread(s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--runs", type=int, default=3, help="timed rounds at least (more while a timing is unstable)")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="time for further rounds while unstable")
    parser.add_argument("--ablation", action="store_true", help="also time each fusion (at the first length)")
    parser.add_argument("--minimind-src", type=Path, help="your MiniMind's model/model_minimind.py")
    parser.add_argument("--checkpoint", type=Path, help="a MiniMind .pth to time instead of random weights")
    parser.add_argument("--prompt-json", type=Path, help='a JSON file whose "ids" are the prompt (results/prompt.json)')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the whole result here")
    args = parser.parse_args(argv)
    model = load_model(args.checkpoint) if args.checkpoint else lab_sized_model(args.seed)
    if args.prompt_json:
        prompt_ids = json.loads(args.prompt_json.read_text(encoding="utf-8"))["ids"]
    else:
        prompt_ids = torch.randint(3, model.config.vocab_size, (PROMPT_LEN,),
                                   generator=torch.Generator().manual_seed(args.seed)).tolist()
    output = {}
    with tempfile.TemporaryDirectory() as folder:
        twin = None
        if args.minimind_src and args.checkpoint:
            twin = decode_bench.minimind_model_for(model, args.checkpoint, args.minimind_src)
        elif args.minimind_src:
            twin = minimind_twin(model, args.minimind_src, Path(folder))
        output["paths"] = decode_bench.decode_bench(model, prompt_ids, args.new_tokens, runs=args.runs,
                                                    max_seconds=args.max_seconds, minimind_model=twin)
    print(table(output["paths"]))
    if args.ablation:
        eager = {name: plan for name, plan in ABLATION.items() if plan.compile_mode is None}
        torch.set_num_threads(1)
        output["operator_calls"] = decode_bench.operator_calls(model, prompt_ids, eager)
        output["ablation"] = decode_bench.decode_bench(model, prompt_ids, args.new_tokens[:1], runs=args.runs,
                                                       max_seconds=args.max_seconds, extra_plans=ABLATION)
        print("\nfusion ablation")
        print(table(output["ablation"]))
        print("\noperator calls per decode step: "
              + ", ".join(f"{name} {calls}" for name, calls in output["operator_calls"].items()))
    if args.json:
        args.json.write_text(json.dumps(output, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
