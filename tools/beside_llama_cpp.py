"""kvlab's fastest single-request path beside llama.cpp, on the same weights, in one process, rounds
alternating. A hand-run tool (issue 37's yardstick), not a rule:

    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON" pip install -e ".[export,llama]"  # builds llama.cpp (5-7 min)
    python tools/beside_llama_cpp.py [--checkpoint results/default/pretrain.pth] [--rounds 15]

The checkpoint's weights are written as a GGUF file of llama.cpp's `qwen3` architecture (kvlab.export, the same
layers as MiniMind: RMSNorm, RoPE on rotated halves, grouped-query attention with per-head q/k norm,
SwiGLU, tied embeddings), every tensor in float32, the tokenizer's vocabulary and merges beside them
(the prompt goes in as token ids, so no tokenizer runs). llama.cpp runs with one thread, its K/V cache
in float32, flash attention off, and chooses greedily from its logits in this process. kvlab runs
`kvlab.engine.fast.generate` (the default plan) with one torch thread. Each round times both on the
lab's prompt (results/prompt.json), the prefill and then the greedy tokens one at a time; it prints
each system's prefill and decode with quartiles, on the wall clock and the timing thread's CPU clock,
and how many of each one's tokens equal the model's own `generate` (MiniMind's semantics).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from kvlab.engine import fast
from kvlab.engine.checkpoint import load_model
from kvlab.engine.sampling import GREEDY
from kvlab.export.gguf_file import write as write_gguf
from kvlab.facts import timing
from kvlab.measure.fidelity import token_difference

ROOT = Path(__file__).resolve().parent.parent


def llama_run(llm, prompt: list[int], new_tokens: int):
    """(prefill s, decode s, prefill cpu s, decode cpu s, tokens): llama.cpp, greedy."""
    n_vocab = llm.n_vocab()

    def greedy(ids: list[int]) -> int:  # feed ids, choose from the last position's logits
        llm.eval(ids)
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    llm.reset()
    began = timing.clocks()
    out = [greedy(prompt)]
    prefill, prefill_cpu = timing.elapsed(began)
    began = timing.clocks()
    for _ in range(new_tokens - 1):
        out.append(greedy([out[-1]]))
    decode, decode_cpu = timing.elapsed(began)
    return prefill, decode, prefill_cpu, decode_cpu, out


def kvlab_run(model, prompt: torch.Tensor, new_tokens: int):
    """The same for kvlab's fast path: one token (the prefill and its choice), then all of them."""
    began = timing.clocks()
    fast.generate(model, prompt, max_new_tokens=1, eos_token_id=None, **GREEDY)
    prefill, prefill_cpu = timing.elapsed(began)
    began = timing.clocks()
    ids = fast.generate(model, prompt, max_new_tokens=new_tokens, eos_token_id=None, **GREEDY)
    whole, whole_cpu = timing.elapsed(began)
    return prefill, whole - prefill, prefill_cpu, whole_cpu - prefill_cpu, ids[0, prompt.shape[1]:].tolist()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "results/default/pretrain.pth")
    parser.add_argument("--tokenizer", type=Path, default=ROOT / "results/default/tokenizer/tokenizer.json")
    parser.add_argument("--prompt-json", type=Path, default=ROOT / "results/prompt.json")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    from llama_cpp import Llama

    torch.set_num_threads(1)
    model = load_model(args.checkpoint).eval()
    prompt = json.loads(args.prompt_json.read_text(encoding="utf-8"))["ids"]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model-f32.gguf"
        write_gguf(model, args.tokenizer, path)
        llm = Llama(model_path=str(path), n_ctx=len(prompt) + args.new_tokens + 8, n_batch=512, n_threads=1,
                    n_threads_batch=1, flash_attn=False, type_k=0, type_v=0, logits_all=False, verbose=False)
        prompt_t = torch.tensor([prompt])
        runs = {"kvlab": [], "llama.cpp": []}
        for _ in range(2):  # warm-up: kvlab loads (or compiles) its step, llama.cpp touches its pages
            kvlab_run(model, prompt_t, args.new_tokens)
            llama_run(llm, prompt, args.new_tokens)
        for index in range(args.rounds):
            pair = [("kvlab", lambda: kvlab_run(model, prompt_t, args.new_tokens)),
                    ("llama.cpp", lambda: llama_run(llm, prompt, args.new_tokens))]
            for name, run in (pair if index % 2 == 0 else pair[::-1]):
                runs[name].append(run())
    decode_steps = args.new_tokens - 1
    print(f"{len(prompt)}-token prompt, {args.new_tokens} greedy tokens, {args.rounds} alternating rounds, "
          f"one thread each (medians, quartiles)")
    decode = {}
    for name, done in runs.items():
        prefill = timing.summary([r[0] for r in done])
        decode[name] = timing.summary([r[1] / decode_steps for r in done])
        cpu = timing.summary([r[3] / decode_steps for r in done])
        print(f"{name:10} prefill {1e3 * prefill['median_s']:7.2f} ms ({1e3 * prefill['q1_s']:.2f}-"
              f"{1e3 * prefill['q3_s']:.2f}); decode {1e3 * decode[name]['median_s']:.4f} ms/token "
              f"({1e3 * decode[name]['q1_s']:.4f}-{1e3 * decode[name]['q3_s']:.4f}), CPU clock "
              f"{1e3 * cpu['median_s']:.4f} ({1e3 * cpu['q1_s']:.4f}-{1e3 * cpu['q3_s']:.4f}), CPU/wall "
              f"{sum(r[3] for r in done) / sum(r[1] for r in done):.2f}")
    ratio = timing.ratio_interval(decode["llama.cpp"], decode["kvlab"])
    print(f"decode, llama.cpp / kvlab: {ratio['ratio']:.2f}x ({ratio['low']:.2f}-{ratio['high']:.2f}x)")
    # MiniMind's semantics: the model's own generate (the torch.cat cache), greedy
    reference = model.generate(prompt_t, max_new_tokens=args.new_tokens, eos_token_id=None, **GREEDY)
    reference = reference[0, len(prompt):].tolist()
    for name, done in runs.items():
        difference = token_difference([done[0][4]], [reference])
        first = difference.get("first_difference")
        print(f"{name}: {'the same' if difference['identical'] else 'not the same'} {args.new_tokens} tokens as the "
              f"model's own generate" + ("" if first is None else f" (the first differs at {first['position']})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
