"""MiniMind in plain PyTorch: the same layers, parameter names and `generate` as MiniMind.

Read top to bottom (the config is kvlab.engine.config): RMSNorm, rotary position
tables, the KV cache (MiniMind's, and one allocated once), attention with grouped-query heads,
the SwiGLU MLP, one block, the stack, the causal-LM head with its `generate`, and the generation
loop `generate` runs. `rms_norm` and `attention` are the one home of their math: the serving
engine's paged attention and the compiled steps (kvlab.engine.fast, kvlab.serving) call them.

Shapes: B batch, T tokens fed this call, S cached + fed tokens, H query heads,
KV key/value heads, D head_dim, C hidden_size, V vocab_size.

A batch of prompts of different lengths is left-padded, as MiniMind's `generate` takes it: an
`attention_mask` (B, S) of 1 for a real token and 0 for padding hides the padding from every
query. Positions are not shifted (RoPE scores depend only on the distance between two tokens).

The cache is MiniMind's: per layer (K, V), grown by `torch.cat` at every step, so each step copies
all it holds. `StaticCache` is the other way, beside it and never used by the lab's seven steps:
allocated once for the final length and written in place (`generate(..., kv_cache="static")`).
`generate(..., kv_dtype=...)` keeps MiniMind's cache in fewer bits (kvlab.engine.kv_dtype.StoredCache).
The compiled decode step (kvlab.engine.fast.generate) drives the same loop with a step of its own;
this module knows nothing of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from kvlab.engine import sampling
from kvlab.engine.config import MiniMindConfig
from kvlab.engine.kv_dtype import StoredCache, StoredLayer, check as check_kv_dtype

KVCache = list[tuple[torch.Tensor, torch.Tensor]]
KV_CACHES = ("cat", "static")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """MiniMind's RMSNorm: x / sqrt(mean(x²) + eps) in float32, times the weight, in x's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_tables(head_dim: int, max_positions: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for every position, each (max_positions, head_dim), halves repeated."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(max_positions), inv_freq).float()
    cos = torch.cat([torch.cos(angles), torch.cos(angles)], dim=-1)
    sin = torch.cat([torch.sin(angles), torch.sin(angles)], dim=-1)
    return cos, sin


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, heads, D); cos, sin: (T, D)."""
    return ((x * cos.unsqueeze(1)) + (rotate_half(x) * sin.unsqueeze(1))).to(x.dtype)


def extend_cache(past_kv: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor):
    """MiniMind's cache: the past K and V with this call's appended, by torch.cat (a new tensor each
    step, so the whole cache is copied again)."""
    return torch.cat([past_kv[0], k], dim=1), torch.cat([past_kv[1], v], dim=1)


class StaticCache:
    """A KV cache allocated once for `max_tokens` positions and written in place, as serving code
    keeps it (nanochat's KVCache, Hugging Face's StaticCache, gpt-fast): no step copies what the
    cache already holds. Per layer K and V are (B, max_tokens, KV, D), before repeat_kv, like
    MiniMind's; the first `length` positions hold tokens."""

    def __init__(self, config: MiniMindConfig, batch: int, max_tokens: int, dtype, device):
        shape = (batch, max_tokens, config.num_key_value_heads, config.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.max_tokens = max_tokens
        self.length = 0

    def layer(self, index: int) -> "StaticLayer":
        return StaticLayer(self, index)

    def write(self, index: int, k: torch.Tensor, v: torch.Tensor):
        """Write this call's K and V of layer `index` after the tokens held; the held and new ones, as views."""
        end = self.length + k.shape[1]
        if end > self.max_tokens:
            raise ValueError(f"the static cache holds {self.max_tokens} positions; this call needs {end}")
        self.keys[index][:, self.length:end] = k
        self.values[index][:, self.length:end] = v
        return self.keys[index][:, :end], self.values[index][:, :end]

    def nbytes(self) -> int:
        """Bytes reserved (all positions, held or not)."""
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class StaticLayer:
    """One layer's view of a StaticCache, as Attention receives it."""

    cache: StaticCache
    index: int

    @property
    def start(self) -> int:
        return self.cache.length

    def write(self, k: torch.Tensor, v: torch.Tensor):
        return self.cache.write(self.index, k, v)


# the caches kept as an object with a view per layer (`layer(index)`, `length`, `nbytes()`)
LAYERED = (StaticCache, StoredCache)


def cache_length(past_key_values) -> int:
    """Tokens a cache holds (any kind; 0 for none)."""
    if isinstance(past_key_values, LAYERED):
        return past_key_values.length
    return past_key_values[0][0].shape[1] if past_key_values else 0


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, S, KV, D) -> (B, S, KV * n_rep, D): each KV head serves n_rep query heads."""
    if n_rep == 1:
        return x
    batch, length, kv_heads, head_dim = x.shape
    expanded = x[:, :, :, None, :].expand(batch, length, kv_heads, n_rep, head_dim)
    return expanded.reshape(batch, length, kv_heads * n_rep, head_dim)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_rep: int, use_flash: bool, had_past: bool,
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """MiniMind's attention of q (B, T, H, D), normed and rotated, over k, v (B, S, KV, D), before
    repeat_kv, the last T of S being the fed positions. Returns (B, T, H * D), the input of o_proj.

    PyTorch's fused kernel for a cache-free prefill without padding (`use_flash`, the config's
    flash_attn); else scores, the causal mask on the fed columns, MiniMind's -1e9 for a padded key
    (`attention_mask` (B, S), 0 at padding), a float32 softmax, and the values."""
    batch, fed, _, head_dim = q.shape
    q = q.transpose(1, 2)  # (B, H, T, D)
    k = repeat_kv(k, n_rep).transpose(1, 2)  # (B, H, S, D)
    v = repeat_kv(v, n_rep).transpose(1, 2)
    unpadded = attention_mask is None or bool(attention_mask.all())
    if use_flash and fed > 1 and not had_past and unpadded:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)  # (B, H, T, S)
        causal = torch.full((fed, fed), float("-inf"), device=scores.device).triu(1)
        scores[:, :, :, -fed:] += causal
        scores = scores.float()
        if attention_mask is not None:
            # MiniMind's rule: a padded key (mask 0) scores -1e9, so softmax gives it no weight.
            # Added in float32, where a padded query that sees only padding stays finite.
            scores = scores + (1.0 - attention_mask[:, None, None, :].float()) * -1e9
        out = F.softmax(scores, dim=-1).type_as(q) @ v
    return out.transpose(1, 2).reshape(batch, fed, -1)


class Attention(nn.Module):
    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.n_rep = self.num_heads // self.num_kv_heads
        self.head_dim = config.head_dim
        self.use_flash = config.flash_attn
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, past_kv=None, use_cache=False, attention_mask=None):
        batch, fed, _ = x.shape
        q = self.q_proj(x).view(batch, fed, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, fed, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, fed, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        had_past = past_kv is not None
        if isinstance(past_kv, (StaticLayer, StoredLayer)):
            had_past = past_kv.start > 0
            k, v = past_kv.write(k, v)  # (B, S, KV, D): views of the preallocated cache, or read back from its dtype
        elif past_kv is not None:
            k, v = extend_cache(past_kv, k, v)  # (B, S, KV, D)
        # The cache keeps K and V *before* repeat_kv: GQA's saving is the cache's saving.
        present = (k, v) if use_cache else None
        out = attention(q, k, v, self.n_rep, self.use_flash, had_past, attention_mask)
        return self.o_proj(out), present


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, past_kv=None, use_cache=False, attention_mask=None):
        attn_out, present = self.self_attn(self.input_layernorm(x), cos, sin, past_kv, use_cache, attention_mask)
        x = attn_out + x
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, present


class MiniMindModel(nn.Module):
    def __init__(self, config: MiniMindConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        cos, sin = rope_tables(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        fed = input_ids.shape[1]
        start = cache_length(past_key_values)
        if start + fed > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {start + fed} tokens exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings})"
            )
        static = past_key_values if isinstance(past_key_values, LAYERED) else None
        if static is not None:
            past_key_values = [static.layer(index) for index in range(len(self.layers))]
        past_key_values = past_key_values or [None] * len(self.layers)
        cos = self.freqs_cos[start : start + fed]  # positions continue from the cache length
        sin = self.freqs_sin[start : start + fed]
        hidden = self.embed_tokens(input_ids)
        presents = []
        for layer, past_kv in zip(self.layers, past_key_values):
            hidden, present = layer(hidden, cos, sin, past_kv, use_cache, attention_mask)
            presents.append(present)
        if static is not None:
            static.length += fed  # every layer wrote its positions start .. start + fed
            presents = static
        return self.norm(hidden), presents


@dataclass
class CausalLMOutput:
    logits: torch.Tensor  # (B, T, V)
    past_key_values: KVCache | StaticCache | StoredCache | None  # per layer (k, v), each (B, S, KV, D); or the cache object


class MiniMindForCausalLM(nn.Module):
    def __init__(self, config: MiniMindConfig | None = None):
        super().__init__()
        self.config = config or MiniMindConfig()
        self.model = MiniMindModel(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        if self.config.tie_word_embeddings:
            self.model.embed_tokens.weight = self.lm_head.weight

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False) -> CausalLMOutput:
        """`attention_mask` (B, cached + fed), when given: 1 for a real token, 0 for left padding."""
        hidden, presents = self.model(input_ids, attention_mask, past_key_values, use_cache)
        return CausalLMOutput(logits=self.lm_head(hidden), past_key_values=presents if use_cache else None)

    def decode_step(self, input_ids, attention_mask, past_key_values, use_cache: bool, *, temperature: float,
                    top_k: int, top_p: float, repetition_penalty: float, do_sample: bool):
        """One step of `generate`: feed `forward` what the cache has not seen (everything without one),
        then choose each row's next token from the last position's logits. Returns (outputs, (B, 1) ids)."""
        outputs = self.forward(input_ids[:, cache_length(past_key_values):], attention_mask, past_key_values,
                               use_cache=use_cache)
        next_token = sampling.pick(outputs.logits[:, -1, :], input_ids, temperature=temperature, top_k=top_k,
                                          top_p=top_p, repetition_penalty=repetition_penalty, do_sample=do_sample)
        return outputs, next_token

    def check_room(self, prompt_len: int, max_new_tokens: int) -> None:
        """Refuse, before any work, a generation that would run past the position table.
        The last new token is never fed back, so the longest input is P + N - 1 tokens."""
        limit = self.config.max_position_embeddings
        if prompt_len + max_new_tokens - 1 > limit:
            raise ValueError(
                f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) needs "
                f"{prompt_len + max_new_tokens - 1} positions, more than the model's "
                f"max_position_embeddings ({limit})"
            )

    def generation_inputs(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int,
                          num_return_sequences: int, temperature: float, do_sample: bool):
        """`generate`'s checks and its rows: refuse a temperature <= 0 when sampling and a generation past
        the position table; each prompt repeated `num_return_sequences` times (its mask too). Returns
        (input_ids, attention_mask)."""
        sampling.check_temperature(temperature, do_sample)
        self.check_room(inputs.shape[1], max_new_tokens)
        if attention_mask is not None:
            if attention_mask.shape != inputs.shape:
                raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, the inputs {tuple(inputs.shape)}")
            attention_mask = attention_mask.repeat(num_return_sequences, 1)
        return inputs.repeat(num_return_sequences, 1), attention_mask

    @torch.inference_mode()
    def generate(
        self,
        inputs: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 8192,
        temperature: float = 0.85,
        top_p: float = 0.85,
        top_k: int = 50,
        eos_token_id: int | None = 2,
        use_cache: bool = True,
        num_return_sequences: int = 1,
        do_sample: bool = True,
        repetition_penalty: float = 1.0,
        *,
        kv_cache: str = "cat",
        kv_dtype: str = "float32",
    ) -> torch.Tensor:
        """MiniMind's generation loop. Returns prompt + new ids, (B * num_return_sequences, P + n).

        Each step feeds `self.forward` only what the cache has not seen yet: the
        whole prompt first (prefill), then one token a step with the cache, or
        everything so far again without it. Prompts of different lengths come left-padded with
        their `attention_mask` (B, P); each new token extends it with a 1. `kv_cache="static"`
        (not MiniMind's; never the lab's seven steps) keeps the cache in a StaticCache allocated once
        for the final length instead of growing it by torch.cat: the same tokens, without the copies.
        `kv_dtype` (not MiniMind's; float32, the default, is its cache) stores the cache's K and V in fewer
        bits, read back for attention (kvlab.engine.kv_dtype). The compiled decode step is
        kvlab.engine.fast.generate, with the same knobs.
        """
        if kv_cache not in KV_CACHES:
            raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}")
        if check_kv_dtype(kv_dtype) != "float32" and (not use_cache or kv_cache != "cat"):
            raise ValueError(f"kv_dtype={kv_dtype!r} is what a cache stores: it needs use_cache=True and "
                             f"kv_cache='cat', got use_cache={use_cache}, kv_cache={kv_cache!r}")
        input_ids, attention_mask = self.generation_inputs(inputs, attention_mask, max_new_tokens, num_return_sequences,
                                                           temperature, do_sample)
        cache = StoredCache(self.config.num_hidden_layers, kv_dtype) if kv_dtype != "float32" else None
        if use_cache and kv_cache == "static":
            cache = StaticCache(self.config, input_ids.shape[0], inputs.shape[1] + max_new_tokens - 1,
                                self.lm_head.weight.dtype, input_ids.device)
        knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                     do_sample=do_sample)
        return generation_loop(self.decode_step, input_ids, attention_mask, cache, max_new_tokens, eos_token_id,
                               use_cache, knobs)


def generation_loop(step, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, cache, max_new_tokens: int,
                    eos_token_id: int | None, use_cache: bool, knobs: dict) -> torch.Tensor:
    """`generate`'s loop, whatever computes its steps. `step(input_ids, attention_mask, cache, use_cache,
    **knobs)` returns (outputs, (B, 1) next ids): MiniMindForCausalLM.decode_step (the eager model), or
    a compiled step's (kvlab.engine.fast). Each step's ids join the rows; a row that drew eos keeps
    getting eos while others run, and the loop stops when every row has drawn it (MiniMind's rule).
    Returns (B, P + n) ids."""
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for _ in range(max_new_tokens):
        outputs, next_token = step(input_ids, attention_mask, cache, use_cache, **knobs)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=-1)
        if eos_token_id is not None:
            # rows that already finished keep receiving eos
            next_token = torch.where(finished.unsqueeze(-1), torch.full_like(next_token, eos_token_id), next_token)
        input_ids = torch.cat([input_ids, next_token], dim=-1)
        cache = outputs.past_key_values if use_cache else None
        if eos_token_id is not None:
            finished |= next_token.squeeze(-1).eq(eos_token_id)
            if finished.all():
                break
    return input_ids


def left_pad(rows: list[list[int]], pad_id: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as one batch for `generate`: (ids, attention_mask), each (B, longest),
    every row padded on the left with `pad_id` (MiniMind's tokenizer pads with id 0), the mask 0 there."""
    if not rows or not all(rows):
        raise ValueError("left_pad needs at least one prompt, and no empty one")
    width = max(len(row) for row in rows)
    ids = torch.tensor([[pad_id] * (width - len(row)) + list(row) for row in rows], device=device)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], device=device)
    return ids, mask


def random_weights(model: nn.Module, std: float) -> nn.Module:
    """Every weight but the norms' drawn from N(0, std²) from torch's global generator, in place: a
    random MiniMind whose greedy output varies (PyTorch's default init gives near-uniform logits).
    Returns the model, in eval mode."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, std)
    return model.eval()


def count_parameters(model: nn.Module) -> int:
    """Parameters of `model`, a tied embedding counted once."""
    return sum(p.numel() for p in model.parameters())


def kv_cache_bytes(past_key_values: KVCache | StaticCache | StoredCache) -> int:
    """Bytes held by every tensor of a cache, as allocated (a StaticCache's: all it reserved; a
    StoredCache's: its values and scales)."""
    if isinstance(past_key_values, LAYERED):
        return past_key_values.nbytes()
    return sum(t.numel() * t.element_size() for pair in past_key_values for t in pair)
