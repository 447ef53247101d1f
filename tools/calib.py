"""A machine's unit for build times: the seconds of a fixed PyTorch training workload on one thread.

    python tools/calib.py [--runs 3]

A build's seconds over this unit ("machine units") compare builds across machines and days, as far as
one CPU-bound PyTorch workload stands for the build: a small transformer (the width and depth of the
lab's embedded default, its own fixed layers, not kvlab's, so that the unit never moves with kvlab's
code) trained for a fixed number of steps on seeded random tokens. Prints each run's seconds and the
median; run it beside the build, on the same quiet machine (`tools/build_times.py --unit SECONDS`).
On this project's machine (2 cores, AMD EPYC) one run takes about 7.5 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

VOCAB, WIDTH, HEADS, LAYERS, FFN = 2048, 128, 4, 4, 512
BATCH, LENGTH, STEPS = 16, 128, 30


def workload() -> float:
    """Seconds of STEPS AdamW steps of the fixed model, one thread, seeded."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, FFN, dropout=0.0, batch_first=True, norm_first=True)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False),
                          nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, VOCAB, (BATCH, LENGTH + 1))
    mask = nn.Transformer.generate_square_subsequent_mask(LENGTH)
    began = time.perf_counter()
    for _ in range(STEPS):
        hidden = model[0](tokens[:, :-1])
        logits = model[2](model[1](hidden, mask=mask, is_causal=True))
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return time.perf_counter() - began


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    seconds = [workload() for _ in range(args.runs)]
    print("runs: " + ", ".join(f"{s:.2f}" for s in seconds) + " s")
    print(f"unit: {statistics.median(seconds):.2f} s (the median of {args.runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
