"""A MiniMind as a transformers folder, and that folder checked in transformers.

MiniMind's layers are Qwen3's (RMSNorm, rotary embeddings on rotated halves, grouped-query attention with
per-head q/k RMSNorm, SwiGLU), or Llama's where q/k norms are off (MiniMind2): its state dict loads into
either with no key renamed. Transformers' own classes hold it; `save_pretrained` writes it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from kvlab.engine.model import MiniMindForCausalLM


def architecture(model: MiniMindForCausalLM) -> str:
    """The transformers architecture the model is: Qwen3ForCausalLM, or LlamaForCausalLM without q/k norms."""
    return "Qwen3ForCausalLM" if model.config.qk_norm else "LlamaForCausalLM"


def hf_config(model: MiniMindForCausalLM):
    import transformers

    c = model.config
    common = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                  num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                  num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, hidden_act="silu",
                  max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
                  rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings, attention_bias=False,
                  bos_token_id=c.bos_token_id, eos_token_id=c.eos_token_id, dtype="float32")
    if c.qk_norm:
        return transformers.Qwen3Config(**common)
    return transformers.LlamaConfig(**common, mlp_bias=False)


def write(model: MiniMindForCausalLM, tokenizer_dir: Path, out: Path) -> None:
    """`out` (a new folder) as transformers writes a model: config.json, model.safetensors, the tokenizer."""
    import transformers

    config = hf_config(model)
    hf_class = getattr(transformers, architecture(model))
    with torch.device("meta"):
        hf = hf_class(config)
    hf.load_state_dict(model.state_dict(), strict=True, assign=True)
    if config.tie_word_embeddings:
        hf.tie_weights()
    hf.save_pretrained(out, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    shutil.copyfile(tokenizer_dir / "tokenizer.json", out / "tokenizer.json")  # the one kvlab reads, as given


def greedy(hf, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy new tokens of a transformers model: its forward and its own cache, the argmax each step
    (no eos stops it, as the lab's greedy runs do not)."""
    ids, past, out = torch.tensor([prompt]), None, []
    with torch.inference_mode():
        for _ in range(new_tokens):
            step = hf(input_ids=ids, past_key_values=past, use_cache=True)
            past = step.past_key_values
            out.append(int(step.logits[0, -1].argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


def check(out: Path, model: MiniMindForCausalLM, prompt: list[int], expected: list[int], texts: list[str],
          encode) -> dict:
    """The folder loaded by `AutoModelForCausalLM` and `AutoTokenizer`: its logits on the prompt against
    kvlab's, its greedy tokens against `expected` (kvlab's generate), its tokenizer against kvlab's
    (`encode`) on `texts`."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        difference = float((hf(ids).logits.float() - model(ids).logits.float()).abs().max())
    tokens = greedy(hf, prompt, len(expected))
    encoded = [text for text in texts if tokenizer.encode(text, add_special_tokens=False) != encode(text)]
    return {"loaded_as": type(hf).__name__, "max_logit_difference": difference, "tokens": tokens,
            "tokenizer_texts": len(texts), "tokenizer_differs": len(encoded),
            "versions": {"transformers": transformers.__version__, "torch": torch.__version__}}
