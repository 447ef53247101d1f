"""The cache in fewer bits, kvlab beside llama.cpp on the same weights (issue 50's yardstick): a
hand-run tool, not a rule.

    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON" pip install -e ".[export,llama]"  # builds llama.cpp (5-7 min)
    python tools/kv_dtype_llama_cpp.py [--checkpoint results/default/pretrain.pth] [--new-tokens 256]

The checkpoint goes to llama.cpp as an F32 GGUF file (kvlab.export.gguf_file, as `kvlab export` writes it). Each
system generates greedily on the lab's prompt (results/prompt.json) with its cache in float32 and in
fewer bits: llama.cpp's `type_k`/`type_v` f16, bf16 and q8_0 (blocks of 32 values with one scale; a
quantized V cache needs llama.cpp's flash attention, so its float32 baseline is run both ways),
kvlab's `kv_dtype` float16, bfloat16 and int8 (one scale per token and KV head). Each is held
against its own system's float32 cache: the same tokens, or the first new token that differs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from kvlab.engine.checkpoint import load_model
from kvlab.engine.kv_dtype import KV_DTYPES
from kvlab.engine.sampling import GREEDY
from kvlab.export.gguf_file import greedy, write as write_gguf
from kvlab.facts.tokens import first_difference

ROOT = Path(__file__).resolve().parent.parent

# llama.cpp's ggml types of a cache (ggml.h): f32, f16, q8_0
GGML = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}
# (name, type of K and V, flash attention)
LLAMA_CACHES = (("f32", "f32", False), ("f32, flash attention", "f32", True), ("f16", "f16", False),
                ("bf16", "bf16", False), ("q8_0", "q8_0", True))


def llama_tokens(path: Path, prompt: list[int], new_tokens: int, cache: str, flash: bool) -> list[int]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=len(prompt) + new_tokens + 8, n_batch=512, n_threads=1,
                n_threads_batch=1, flash_attn=flash, type_k=GGML[cache], type_v=GGML[cache], logits_all=False,
                verbose=False)
    return greedy(llm, prompt, new_tokens)


def said(ids: list[int], baseline: list[int]) -> str:
    at = first_difference(ids, baseline)
    return f"the same {len(ids)}" if at is None else f"new token {at + 1} differs"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "results/default/pretrain.pth")
    parser.add_argument("--tokenizer", type=Path, default=ROOT / "results/default/tokenizer/tokenizer.json")
    parser.add_argument("--prompt-json", type=Path, default=ROOT / "results/prompt.json")
    parser.add_argument("--new-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(args.checkpoint).eval()
    prompt = json.loads(args.prompt_json.read_text(encoding="utf-8"))["ids"]
    ids = torch.tensor([prompt])
    kvlab = {name: model.generate(ids, max_new_tokens=args.new_tokens, eos_token_id=None, kv_dtype=name,
                                  **GREEDY)[0, len(prompt):].tolist() for name in KV_DTYPES}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model-f32.gguf"
        write_gguf(model, args.tokenizer, path)
        llama = {name: llama_tokens(path, prompt, args.new_tokens, cache, flash) for name, cache, flash in LLAMA_CACHES}
    print(f"{len(prompt)}-token prompt, {args.new_tokens} greedy new tokens, each cache against its own system's "
          f"float32 one")
    for name, tokens in kvlab.items():
        print(f"kvlab     {name:22} {said(tokens, kvlab['float32'])}")
    for name, cache, flash in LLAMA_CACHES:
        baseline = llama["f32, flash attention" if flash else "f32"]
        print(f"llama.cpp {name:22} {said(llama[name], baseline)}")
    print(f"llama.cpp f32 against kvlab float32: {said(llama['f32'], kvlab['float32'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
