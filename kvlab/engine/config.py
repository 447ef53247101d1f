"""MiniMind's config and the arithmetic it fixes, free of PyTorch: the model (kvlab.engine.model)
is built from it, and the workflow sizes jobs and the lab sizes caches with it before any model
is loaded.

Names and defaults are MiniMind's (`MiniMindConfig` in its model_minimind.py), as are two
derived sizes: head_dim = hidden_size / heads and intermediate_size = hidden_size x pi rounded
up to a multiple of 64.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

# Bytes of one element of each dtype the config's `dtype` key allows.
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2}
# What the KV cache may store (kvlab.engine.kv_dtype): the model's dtypes, and int8 with a float32 scale
# per token and KV head.
KV_BYTES_PER_ELEMENT = {**BYTES_PER_ELEMENT, "int8": 1}
KV_SCALE_BYTES = {"int8": 4}


@dataclass
class MiniMindConfig:
    hidden_size: int = 768
    num_hidden_layers: int = 8
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    head_dim: int | None = None  # default hidden_size // num_attention_heads
    intermediate_size: int | None = None  # default ceil(hidden_size * pi / 64) * 64
    vocab_size: int = 6400
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    bos_token_id: int = 1
    eos_token_id: int = 2
    qk_norm: bool = True  # minimind-3 has per-head q_norm/k_norm; MiniMind2 (2025) has not
    flash_attn: bool = True  # use PyTorch's fused attention for a cache-free prefill, as MiniMind

    def __post_init__(self):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = math.ceil(self.hidden_size * math.pi / 64) * 64
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    def to_dict(self) -> dict:
        return asdict(self)

    def parameter_count(self) -> int:
        """Parameters of the model this config builds, a tied embedding counted once
        (what kvlab.engine.model.count_parameters counts on the built model)."""
        hidden, head_dim = self.hidden_size, self.head_dim
        attention = hidden * head_dim * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)
        q_k_norms = 2 * head_dim if self.qk_norm else 0
        mlp = 3 * hidden * self.intermediate_size
        layer = attention + q_k_norms + mlp + 2 * hidden  # two RMSNorms
        embeddings = self.vocab_size * hidden * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + hidden  # the final RMSNorm

    def kv_bytes_per_token(self, dtype: str = "float32") -> int:
        """Bytes the KV cache holds per token: K and V, for every layer, of the KV heads (before
        repeat_kv), head_dim elements each, of `dtype` ("float32", "float16", "bfloat16", "int8"), and
        int8's scale, one float32 per KV head: 2 x layers x KV heads x (head_dim x element + scale)."""
        per_head = self.head_dim * KV_BYTES_PER_ELEMENT[dtype] + KV_SCALE_BYTES.get(dtype, 0)
        return 2 * self.num_hidden_layers * self.num_key_value_heads * per_head
