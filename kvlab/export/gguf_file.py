"""A MiniMind as a GGUF file of llama.cpp's qwen3 or llama architecture, written with the `gguf` package,
and that file checked in llama.cpp (llama-cpp-python).

qwen3 is MiniMind's layers (RMSNorm, rotary embeddings on rotated halves, grouped-query attention with
per-head q/k norms, SwiGLU), the embeddings tied or a head of its own. Without q/k norms (MiniMind2's
files) the layers are llama's, whose rotary embeddings turn adjacent pairs: each head's rows of q_proj and
k_proj are reordered so that the pair (i, i + head_dim/2) MiniMind rotates lands on (2i, 2i + 1), as
llama.cpp's own converter reorders a transformers Llama's. Weights in F32, F16 or BF16; the
norms stay F32, as llama.cpp's converter keeps them. The vocabulary and merges are the tokenizer's,
byte-level BPE with GPT-2's split (llama.cpp's pre-tokenizer "gpt-2").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from kvlab.engine.model import MiniMindForCausalLM

FILE_TYPES = ("f32", "f16", "bf16")
# llama.cpp's names of MiniMind's modules in a block
BLOCK_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
               "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def architecture(model: MiniMindForCausalLM) -> str:
    """llama.cpp's architecture of the model's layers: qwen3 with per-head q/k norms, llama without."""
    return "qwen3" if model.config.qk_norm else "llama"


def rotated_pairs_adjacent(weight: np.ndarray, heads: int) -> np.ndarray:
    """q_proj's or k_proj's rows reordered per head for a rotation of adjacent pairs: row 2i + j of a head
    is its row j * head_dim/2 + i (j = 0, 1), the two halves MiniMind rotates together made neighbours."""
    rows, columns = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2).reshape(rows, columns)


def tensor_name(key: str) -> str:
    """llama.cpp's name of a state dict key."""
    if key == "model.embed_tokens.weight":
        return "token_embd.weight"
    if key == "model.norm.weight":
        return "output_norm.weight"
    if key == "lm_head.weight":
        return "output.weight"
    parts = key.split(".")  # model.layers.N.<module...>.weight
    return f"blk.{parts[2]}.{BLOCK_NAMES['.'.join(parts[3:-1])]}.weight"


def write(model: MiniMindForCausalLM, tokenizer_json: Path, path: Path, file_type: str = "f32",
          pre_tokenizer: str = "gpt-2") -> None:
    """The model's weights and the tokenizer's vocabulary as a GGUF file at `path`."""
    import gguf

    config = model.config
    arch = architecture(model)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    quant = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "bf16": gguf.GGMLQuantizationType.BF16}[file_type]
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "bf16": gguf.LlamaFileType.MOSTLY_BF16}[file_type])
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    tokens = [""] * config.vocab_size
    types = [gguf.TokenType.UNUSED] * config.vocab_size
    for token, index in spec["model"]["vocab"].items():
        if index < config.vocab_size:
            tokens[index], types[index] = token, gguf.TokenType.NORMAL
    for added in spec.get("added_tokens", []):
        if added["id"] < config.vocab_size:
            tokens[added["id"]], types[added["id"]] = added["content"], gguf.TokenType.CONTROL
    tokens = [token or f"[UNUSED_{index}]" for index, token in enumerate(tokens)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_add_bos_token(False)
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied: llama.cpp reads the embeddings
        array = tensor.detach().to(torch.float32).numpy()
        if arch == "llama" and key.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in key else config.num_key_value_heads
            array = np.ascontiguousarray(rotated_pairs_adjacent(array, heads))
        kind = quant if array.ndim == 2 else gguf.GGMLQuantizationType.F32
        writer.add_tensor(tensor_name(key), gguf.quants.quantize(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama(path: Path, context: int):
    """The file loaded by llama.cpp: one thread, its cache in F32."""
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=context, n_batch=512, n_threads=1, n_threads_batch=1, flash_attn=False,
                 type_k=0, type_v=0, logits_all=False, verbose=False)


def greedy(llm, prompt: list[int], new_tokens: int) -> list[int]:
    """llama.cpp's greedy new tokens: its logits' argmax each step, fed one at a time after the prompt."""
    n_vocab = llm.n_vocab()
    out, feed = [], prompt
    llm.reset()
    for _ in range(new_tokens):
        llm.eval(feed)
        out.append(int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,)))))
        feed = [out[-1]]
    return out


def check(path: Path, prompt: list[int], new_tokens: int, texts: list[str], encode) -> dict:
    """The file run by llama.cpp: its greedy tokens, and its tokenizer against kvlab's (`encode`) on `texts`."""
    import llama_cpp

    llm = llama(path, len(prompt) + new_tokens + 8)
    tokens = greedy(llm, prompt, new_tokens)
    differs = [text for text in texts if llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) != encode(text)]
    return {"tokens": tokens, "tokenizer_texts": len(texts), "tokenizer_differs": len(differs),
            "versions": {"llama_cpp_python": llama_cpp.__version__}}
