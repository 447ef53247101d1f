"""How the contention rule (kvlab.facts.timing) sees a run alone on its core and one that shares it.

    python tools/contention_probe.py [--work loop|minimind] [--runs 10] [--core 0] [--threads 1]

Pins this process to one core and times the same work three ways: alone on it, beside a burner
pinned to the same core (`while True: pass`), and beside bursts of such work (0.1-0.4 s on, 0.1-0.4 s
off: tests/bursts.py, which tests/test_timing.py runs too). The work is a pure-Python loop of about
0.1 s, or step 3's generation in both modes (P = 200 prompt tokens, N = 64 new ones) on a MiniMind of the default
model's architecture (config.yaml's default_model.model) with random weights. Each way prints the median time, the median CPU share of the
timing thread, the share of runs the rule calls contended, the process's involuntary context
switches per second and the 1-minute load average; the numbers in docs/results.md come from it.
Linux only (sched_setaffinity).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from kvlab.facts import timing

# config.yaml's default_model.model, with its tokenizer's vocabulary (about 1.9k of the 2,048 asked for)
LAB_MODEL = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=1884,
                 max_position_embeddings=2048)
# What runs beside the work, as the Python interpreter's arguments: a burner, or tests/bursts.py
# (0.1-0.4 s on, 0.1-0.4 s off).
BURN = ["-c", "while True: pass"]
BURSTS = [str(Path(__file__).resolve().parents[1] / "tests" / "bursts.py")]


def loop_work():
    def run():
        total = 0
        for i in range(1_500_000):
            total += i
        return total

    return {"loop": run}


def minimind_work(threads: int):
    import torch

    from kvlab.engine.config import MiniMindConfig
    from kvlab.engine.model import MiniMindForCausalLM
    from kvlab.measure import steps

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(**LAB_MODEL)).eval()
    prompt = torch.randint(3, model.config.vocab_size, (1, 200))

    def generation(use_cache):
        def run():
            model.generate(prompt, max_new_tokens=64, use_cache=use_cache, **steps.GREEDY_NO_EOS)
        return run

    return {"with_cache": generation(True), "without_cache": generation(False)}


def pinned(core: int, python_args: list[str]) -> subprocess.Popen:
    """A Python process on one core, started with `python_args`."""
    return subprocess.Popen([sys.executable, *python_args], preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def measure(works: dict, runs: int) -> dict:
    found = {}
    for name, run in works.items():
        run()  # warm-up
        usage = timing.empty_usage()
        samples = timing.repeat(run, runs, 0, usage=usage)
        found[name] = timing.summary(samples, usage)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", choices=("loop", "minimind"), default="loop")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (minimind)")
    args = parser.parse_args()
    cores = {args.core} if args.threads == 1 else set(range(args.core, args.core + args.threads))
    os.sched_setaffinity(0, cores)
    works = loop_work() if args.work == "loop" else minimind_work(args.threads)
    print(f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; pinned to {sorted(cores)}; {args.work}, "
          f"{args.runs} runs a way")
    print(f"{'way':<8} {'work':<14} {'median s':>9} {'IQR %':>6} {'CPU share':>9} {'process':>8} "
          f"{'contended':>9} {'switches/s':>10} {'load':>5}  flag")
    for way, beside in (("alone", None), ("burner", BURN), ("bursts", BURSTS)):
        burner = pinned(args.core, beside) if beside else None
        try:
            if burner:
                time.sleep(0.3)
            found = measure(works, args.runs)
        finally:
            if burner:
                burner.kill()
                burner.wait()
        for name, s in found.items():
            flag = "contended" if s["contended"] else ("unstable" if s["unstable"] else "")
            print(f"{way:<8} {name:<14} {s['median_s']:>9.4f} {100 * s['iqr_share']:>6.1f} {s['cpu_share']:>9.3f} "
                  f"{s['process_cpu_share']:>8.3f} {100 * s['contended_runs']:>8.0f}% {s['switches_per_s']:>10.1f} "
                  f"{s['load_1m']:>5.2f}  {flag}")


if __name__ == "__main__":
    main()
