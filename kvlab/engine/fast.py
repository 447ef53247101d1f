"""The fast decode path: `generate(..., kv_cache="static", compile=True)`.

A cached decode step of the lab's model spends most of its time not on arithmetic but on the fixed
cost of some 400 operator calls (kvlab.lab.anatomy opens it). This module attacks that cost in two
ways, and keeps MiniMind's tokens:

- **Static shapes, compiled once.** A decode step here reads a preallocated cache of its final
  length (`DecodeCache`, K and V per layer as (B, KV, L, D)), the position it writes as a tensor and
  a mask, so every step of a generation has the same shapes and the same code. `torch.compile`
  compiles it once (`dynamic=False`, `fullgraph=True`); each later step only checks its guards and
  runs the compiled kernels. The model's weights are *inputs* of the compiled step, not constants
  baked into it, so another model of the same architecture reuses the same compiled code.
- **Fewer operator calls** (`StepPlan`): q, k and v from one matrix product of concatenated
  weights, their q/k norms and RoPE applied to q and k at once; gate and up from one product;
  attention over the grouped heads without materialising `repeat_kv`; RoPE from tables indexed by
  the position tensor. Each is exact up to the order of float additions: the tokens stay MiniMind's,
  the logits within 1e-5 (tests/test_fast.py).

What stays eager, and why:

- **The prefill** (the prompt, fed once) runs the model's own eager forward into the same cache:
  its shape is the prompt's, and it is one call per generation.
- **The next-token choice** (kvlab.engine.sampling, the one home of each rule): a compiled draw would
  take its random numbers from inductor's generator, not from the one `torch.manual_seed` seeds, so
  seeded samples would part from the eager path's; and torch 2.13's inductor fails on
  argmax(logits / temperature) in its Gumbel-max pass (kvlab.lab.anatomy met it).

Each compiled step is cached per (model, batch, cache length, dtype, device, plan) in a `Decoder`
that owns its cache and its fused weights. The cache length is the generation's final length rounded
up to a multiple of BUCKET_POSITIONS (never past max_position_embeddings), so prompts of different
lengths share one compiled step; the price is attention over up to BUCKET_POSITIONS - 1 masked
positions. On a GPU the step is compiled with mode "reduce-overhead" (CUDA graphs: the whole step
replayed as one launch), its cache and weights at fixed addresses. Where no C++ compiler is found
on a CPU (inductor writes C++ there), `generate` says so in one line and runs the eager static path.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvlab.engine import sampling
from kvlab.engine.model import CausalLMOutput, MiniMindForCausalLM, StaticCache, apply_rope, repeat_kv

# A compiled step serves every cache length up to its own; lengths are rounded up to this multiple.
BUCKET_POSITIONS = 256
ATTENTIONS = ("repeat_kv", "grouped", "sdpa")
# MiniMind's rule for a padded key (kvlab.engine.model.Attention): it scores -1e9.
PADDED_KEY_SCORE = -1e9


@dataclass(frozen=True)
class StepPlan:
    """How the decode step computes, and whether it is compiled. Every choice keeps MiniMind's tokens.

    fused_qkv: q, k and v from one matrix product of the three weights concatenated; q/k norm and
        RoPE then run once on q and k side by side (MiniMind: three products, each norm and RoPE twice).
    fused_gate_up: the MLP's gate and up from one product (MiniMind: two).
    attention: "repeat_kv" copies each KV head for its query heads (MiniMind); "grouped" lays the
        query heads of one KV head side by side and multiplies them with it (no copy);
        "sdpa" is PyTorch's fused attention with enable_gqa (the same grouping, one operator call).
    compile_mode: a torch.compile mode ("default"; "reduce-overhead" adds CUDA graphs on a GPU), or
        None to run the same step eagerly (to measure what the fusions buy without compiling).
    """

    fused_qkv: bool = True
    fused_gate_up: bool = True
    attention: str = "grouped"
    compile_mode: str | None = "default"
    cpp_wrapper: bool = False
    rowwise_matmul: bool = False

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {self.attention!r}")
        if self.rowwise_matmul and self.compile_mode is None:
            raise ValueError("rowwise_matmul needs a compile_mode (run eagerly, it would materialise every product)")
        if self.cpp_wrapper and self.compile_mode != "default":
            raise ValueError(f"cpp_wrapper needs compile_mode 'default', got {self.compile_mode!r}")


class Shape(NamedTuple):
    """The architecture's numbers the step needs (constants of the compiled code)."""

    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    qk_norm: bool


class LayerWeights(NamedTuple):
    """One block's weights as the step reads them: the model's own tensors, or (fused) concatenations
    of them that the Decoder refreshes in place at the start of every generation."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: tuple[torch.Tensor, ...]  # (q, k, v) weights, or one (q|k|v) weight when fused
    qk_norm: tuple[torch.Tensor, ...]  # () without q/k norms; (q, k) weights, or one (H + KV, D) when fused
    o: torch.Tensor
    gate_up: tuple[torch.Tensor, ...]  # (gate, up) weights, or one (gate|up) weight when fused
    down: torch.Tensor


class ModelWeights(NamedTuple):
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    cos: torch.Tensor  # (max_positions, D), the model's RoPE tables
    sin: torch.Tensor


# --- the step ------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """MiniMind's RMSNorm (kvlab.engine.model.RMSNorm) as a function of its weight."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed).type_as(x)


def linear(x: torch.Tensor, weight: torch.Tensor, plan: StepPlan) -> torch.Tensor:
    """x @ weight.T; with `rowwise_matmul`, written as a product and a sum over the last axis, which
    the compiler turns into one loop it can fuse with the operations around it (no library call)."""
    if plan.rowwise_matmul:
        return (x.unsqueeze(-2) * weight).sum(-1)
    return F.linear(x, weight)


def matmul(a: torch.Tensor, b: torch.Tensor, plan: StepPlan) -> torch.Tensor:
    """a @ b, (..., M, K) @ (..., K, N); with `rowwise_matmul`, as a product and a sum over K."""
    if plan.rowwise_matmul:
        return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)
    return a @ b


def project_qkv(x: torch.Tensor, layer: LayerWeights, shape: Shape, cos, sin, plan: StepPlan):
    """q (B, 1, H, D), k and v (B, 1, KV, D) of one token per row, q/k normed and rotated."""
    batch = x.shape[0]
    heads, kv_heads, head_dim = shape.heads, shape.kv_heads, shape.head_dim
    if not plan.fused_qkv:
        q_weight, k_weight, v_weight = layer.qkv
        q = linear(x, q_weight, plan).view(batch, 1, heads, head_dim)
        k = linear(x, k_weight, plan).view(batch, 1, kv_heads, head_dim)
        v = linear(x, v_weight, plan).view(batch, 1, kv_heads, head_dim)
        if shape.qk_norm:
            q, k = rms_norm(q, layer.qk_norm[0], shape.eps), rms_norm(k, layer.qk_norm[1], shape.eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v
    # one product; its heads are q's H, then k's KV, then v's KV
    heads_out = linear(x, layer.qkv[0], plan).view(batch, 1, heads + 2 * kv_heads, head_dim)
    qk, v = heads_out.split([heads + kv_heads, kv_heads], dim=2)
    if shape.qk_norm:
        qk = rms_norm(qk, layer.qk_norm[0], shape.eps)  # weight (H + KV, D): q's rows, then k's
    qk = apply_rope(qk, cos, sin)
    q, k = qk.split([heads, kv_heads], dim=2)
    return q, k, v


def attend(q, keys_t, values, key_bias, shape: Shape, plan: StepPlan) -> torch.Tensor:
    """One query per row over the whole cache. q (B, 1, H, D); keys_t (B, KV, D, L), the keys stored
    transposed so that q @ keys_t needs no copy; values (B, KV, L, D); key_bias (B, 1, 1, L): 0 for a
    key the query may see, -inf (not written yet) or -1e9 (padding). Returns (B, 1, H * D)."""
    batch, heads, kv_heads, head_dim = q.shape[0], shape.heads, shape.kv_heads, shape.head_dim
    n_rep = heads // kv_heads
    if plan.attention == "sdpa":
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys_t.transpose(-2, -1), values, attn_mask=key_bias,
                                             enable_gqa=True)
        return out.transpose(1, 2).reshape(batch, 1, heads * head_dim)
    if plan.attention == "repeat_kv":
        # each KV head copied for its n_rep query heads, as MiniMind's repeat_kv: (B, H, D, L), (B, H, L, D)
        length = values.shape[2]
        k_t = keys_t[:, :, None].expand(batch, kv_heads, n_rep, head_dim, length).reshape(batch, heads, head_dim, length)
        v = values[:, :, None].expand(batch, kv_heads, n_rep, length, head_dim).reshape(batch, heads, length, head_dim)
        grouped_q = q.transpose(1, 2)  # (B, H, 1, D): scores (B, H, 1, L)
    else:
        # query head h is served by KV head h // n_rep: (B, KV, n_rep, D) against (B, KV, D, L),
        # scores (B, KV, n_rep, L)
        k_t, v = keys_t, values
        grouped_q = q.view(batch, kv_heads, n_rep, head_dim)
    scores = matmul(grouped_q, k_t, plan) / math.sqrt(head_dim)
    weights = F.softmax(scores.float() + key_bias, dim=-1).type_as(q)
    return matmul(weights, v, plan).reshape(batch, 1, heads * head_dim)


def mlp(x: torch.Tensor, layer: LayerWeights, shape: Shape, plan: StepPlan) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    if plan.fused_gate_up:
        gate, up = linear(x, layer.gate_up[0], plan).split([shape.intermediate, shape.intermediate], dim=-1)
    else:
        gate, up = linear(x, layer.gate_up[0], plan), linear(x, layer.gate_up[1], plan)
    return linear(F.silu(gate) * up, layer.down, plan)


def step_logits(token_ids: torch.Tensor, position: torch.Tensor, padding_bias: torch.Tensor, weights: ModelWeights,
                keys_t: list[torch.Tensor], values: list[torch.Tensor], shape: Shape, plan: StepPlan) -> torch.Tensor:
    """One decode step with static shapes: the logits (B, V) after `token_ids` (B, 1) at `position`
    (a (1,) tensor, the same for every row), its K and V written into the cache at that position
    (per layer keys_t (B, KV, D, L) and values (B, KV, L, D)). padding_bias (B, L): -1e9 at the
    prompt's padding, else 0."""
    cache_length = values[0].shape[2]
    cos, sin = weights.cos[position], weights.sin[position]  # (1, D): this position's rotation
    visible = torch.arange(cache_length, device=position.device) <= position  # written positions
    key_bias = torch.where(visible, padding_bias, float("-inf"))[:, None, None, :]  # (B, 1, 1, L)
    hidden = F.embedding(token_ids, weights.embed)  # (B, 1, C)
    for index, layer in enumerate(weights.layers):
        q, k, v = project_qkv(rms_norm(hidden, layer.input_norm, shape.eps), layer, shape, cos, sin, plan)
        keys_t[index].index_copy_(3, position, k.permute(0, 2, 3, 1))  # (B, KV, D, 1) into (B, KV, D, L)
        values[index].index_copy_(2, position, v.transpose(1, 2))  # (B, KV, 1, D) into (B, KV, L, D)
        attended = attend(q, keys_t[index], values[index], key_bias, shape, plan)
        hidden = linear(attended, layer.o, plan) + hidden
        hidden = hidden + mlp(rms_norm(hidden, layer.post_norm, shape.eps), layer, shape, plan)
    hidden = rms_norm(hidden, weights.final_norm, shape.eps)
    return linear(hidden[:, 0], weights.lm_head, plan)


# --- the compiler ----------------------------------------------------------------------------------


def find_cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU (its own search: $CXX, g++, ...), or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        return get_cpp_compiler()
    except Exception:  # inductor raises its own InvalidCxxCompiler, or an older torch lacks the helper
        return None


_COMPILED: dict[tuple, object] = {}


def compiled_step(mode: str, cpp_wrapper: bool):
    """`step_logits` compiled for `mode`, one wrapper per mode for the whole process: its compiled
    code is keyed by the inputs' shapes, dtypes and devices (and the plan and Shape's values), so
    every Decoder with the same shapes shares it. `cpp_wrapper`: inductor writes the code that calls
    the kernels in C++ too, not Python (mode "default" only)."""
    key = (mode, cpp_wrapper)
    if key not in _COMPILED:
        how = {"options": {"cpp_wrapper": True}} if cpp_wrapper else {"mode": mode}
        _COMPILED[key] = torch.compile(step_logits, dynamic=False, fullgraph=True, **how)
    return _COMPILED[key]


# --- the decoder: a cache, its weights and its step, per shape --------------------------------------


def bucket_length(needed: int, limit: int) -> int:
    """The cache length for a generation that needs `needed` positions: rounded up to a multiple
    of BUCKET_POSITIONS, at most `limit` (the model's max_position_embeddings)."""
    return min(-(-needed // BUCKET_POSITIONS) * BUCKET_POSITIONS, limit)


class DecodeCache(StaticCache):
    """A StaticCache laid out for a one-token query: per layer the keys stored transposed,
    (B, KV, D, L), and the values (B, KV, L, D), so that both of attention's products read the cache
    as it lies (MiniMind's (B, L, KV, D) would be copied to a new layout first). `keys` and
    `values` are (B, L, KV, D) views of them, as the model's eager forward (the prefill) writes
    a StaticCache."""

    def __init__(self, config, batch: int, max_tokens: int, dtype, device):
        kv_heads, head_dim, layers = config.num_key_value_heads, config.head_dim, config.num_hidden_layers
        self.keys_t = [torch.zeros(batch, kv_heads, head_dim, max_tokens, dtype=dtype, device=device) for _ in range(layers)]
        self.head_major_values = [torch.zeros(batch, kv_heads, max_tokens, head_dim, dtype=dtype, device=device)
                                  for _ in range(layers)]
        self.keys = [t.permute(0, 3, 1, 2) for t in self.keys_t]
        self.values = [t.transpose(1, 2) for t in self.head_major_values]
        self.max_tokens = max_tokens
        self.length = 0


@dataclass
class Decoder:
    """Everything one shape of generation needs, made once and reused by every generation of that
    shape: the cache, the fused weights, the position and padding inputs, and the step to call.

    `first_step_s` is the wall time of the first compiled step (compiling, or finding the compiled
    code when another Decoder of the same shapes compiled it), kept apart from every timing."""

    model: MiniMindForCausalLM
    batch: int
    cache_length: int
    plan: StepPlan
    cache: DecodeCache = field(init=False)
    first_step_s: float | None = None
    steps: int = 0

    def __post_init__(self):
        config, weight = self.model.config, self.model.lm_head.weight
        device = weight.device
        self.cache = DecodeCache(config, self.batch, self.cache_length, weight.dtype, device)
        # the step's own inputs, at fixed addresses and strides: the token fed and its position
        self.token_ids = torch.zeros(self.batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.padding_bias = torch.zeros(self.batch, self.cache_length, dtype=torch.float32, device=device)
        self.shape = Shape(config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                           config.intermediate_size, config.rms_norm_eps, config.qk_norm)
        self.fused = self._allocate_fused()
        self.weights = None
        mode = self.plan.compile_mode
        if mode is None:
            self.step_fn = step_logits
        else:
            if device.type == "cuda":
                self._fix_addresses()
            self.step_fn = compiled_step(mode, self.plan.cpp_wrapper)

    def _allocate_fused(self) -> list[dict]:
        """Per layer, the concatenated weights the plan asks for (filled by `refresh`)."""
        fused = []
        for block in self.model.model.layers:
            attention, ffn = block.self_attn, block.mlp
            layer = {}
            if self.plan.fused_qkv:
                rows = sum(p.weight.shape[0] for p in (attention.q_proj, attention.k_proj, attention.v_proj))
                layer["qkv"] = attention.q_proj.weight.new_empty(rows, attention.q_proj.weight.shape[1])
                if self.shape.qk_norm:
                    layer["qk_norm"] = attention.q_norm.weight.new_empty(self.shape.heads + self.shape.kv_heads,
                                                                         self.shape.head_dim)
            if self.plan.fused_gate_up:
                layer["gate_up"] = ffn.gate_proj.weight.new_empty(2 * self.shape.intermediate, ffn.gate_proj.weight.shape[1])
            fused.append(layer)
        return fused

    def _fix_addresses(self):
        """CUDA graphs replay fixed addresses: mark the cache, the step's inputs and the weights static."""
        for tensor in (*self.cache.keys_t, *self.cache.head_major_values, self.padding_bias, self.token_ids,
                       self.position):
            torch._dynamo.mark_static_address(tensor)
        for layer in self.fused:
            for tensor in layer.values():
                torch._dynamo.mark_static_address(tensor)

    @torch.no_grad()
    def refresh(self) -> ModelWeights:
        """The step's weights from the model's, read again: the model's own tensors where unfused, and
        the fused ones rewritten in place (a copy of the projections' weights: microseconds) so they
        follow any change of the model's weights since the last generation and keep their addresses."""
        layers = []
        for block, fused in zip(self.model.model.layers, self.fused):
            attention, ffn = block.self_attn, block.mlp
            projections = (attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight)
            norms = (attention.q_norm.weight, attention.k_norm.weight) if self.shape.qk_norm else ()
            gate_up = (ffn.gate_proj.weight, ffn.up_proj.weight)
            if self.plan.fused_qkv:
                torch.cat(projections, dim=0, out=fused["qkv"])
                projections = (fused["qkv"],)
                if norms:
                    fused["qk_norm"][: self.shape.heads] = norms[0]
                    fused["qk_norm"][self.shape.heads:] = norms[1]
                    norms = (fused["qk_norm"],)
            if self.plan.fused_gate_up:
                torch.cat(gate_up, dim=0, out=fused["gate_up"])
                gate_up = (fused["gate_up"],)
            layers.append(LayerWeights(block.input_layernorm.weight, block.post_attention_layernorm.weight, projections,
                                       norms, attention.o_proj.weight, gate_up, ffn.down_proj.weight))
        inner = self.model.model
        self.weights = ModelWeights(inner.embed_tokens.weight, tuple(layers), inner.norm.weight, self.model.lm_head.weight,
                                    inner.freqs_cos, inner.freqs_sin)
        return self.weights

    def start(self, attention_mask: torch.Tensor | None) -> DecodeCache:
        """Make the decoder ready for a new generation: the cache empty, the weights read again, the
        prompt's padding (attention_mask (B, P), 0 at padding) set in the padding bias."""
        self.cache.length = 0
        self.refresh()
        self.padding_bias.zero_()
        if attention_mask is not None:
            prompt = attention_mask.shape[1]
            self.padding_bias[:, :prompt] = (1.0 - attention_mask.float()) * PADDED_KEY_SCORE
        return self.cache

    def decode_step(self, input_ids, attention_mask, past_key_values, use_cache: bool, **knobs):
        """`MiniMindForCausalLM.decode_step`'s contract: the prompt goes through the model's eager forward
        (into this decoder's cache); each later token through the static-shape step. Then the
        eager next-token choice. Returns (outputs, (B, 1) ids)."""
        if self.cache.length == 0:
            return self.model.decode_step(input_ids, attention_mask, self.cache, use_cache, **knobs)
        self.position.fill_(self.cache.length)
        self.token_ids.copy_(input_ids[:, -1:])  # a view of input_ids has a new stride each step
        logits = self._run_step(self.token_ids)
        self.cache.length += 1
        next_token = sampling.next_token(logits, input_ids, **knobs)
        return CausalLMOutput(logits=logits[:, None, :], past_key_values=self.cache), next_token

    def _run_step(self, token_ids: torch.Tensor) -> torch.Tensor:
        args = (token_ids, self.position, self.padding_bias, self.weights, self.cache.keys_t,
                self.cache.head_major_values, self.shape, self.plan)
        if self.plan.compile_mode is not None and token_ids.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # a new replay: the last step's outputs may be reused
        if self.steps == 0:
            start = time.perf_counter()
            logits = self.step_fn(*args)
            if token_ids.device.type == "cuda":
                torch.cuda.synchronize()
            self.first_step_s = time.perf_counter() - start
        else:
            logits = self.step_fn(*args)
        self.steps += 1
        return logits


_DECODERS: "weakref.WeakKeyDictionary[MiniMindForCausalLM, dict]" = weakref.WeakKeyDictionary()


def decoders_of(model: MiniMindForCausalLM) -> dict:
    """The model's Decoders, keyed by (batch, cache length, dtype, device, plan)."""
    return _DECODERS.setdefault(model, {})


def decoder_for(model: MiniMindForCausalLM, batch: int, needed: int, plan: StepPlan) -> Decoder:
    """The Decoder of this shape, made on first use. `needed`: the positions the generation fills."""
    weight = model.lm_head.weight
    length = bucket_length(needed, model.config.max_position_embeddings)
    key = (batch, length, weight.dtype, weight.device, plan)
    found = decoders_of(model)
    if key not in found:
        found[key] = Decoder(model, batch, length, plan)
    return found[key]


def default_plan(device: torch.device) -> StepPlan:
    """What `generate(..., compile=True)` runs: every fusion, compiled; with CUDA graphs on a GPU."""
    return StepPlan(compile_mode="reduce-overhead" if device.type == "cuda" else "default")


NO_COMPILER = ("generate(compile=True): no C++ compiler found (torch.compile needs one on a CPU; "
               "install g++ or set CXX), so this generation runs the eager static path")


def decoding(model: MiniMindForCausalLM, input_ids: torch.Tensor, attention_mask, needed: int,
             plan: StepPlan | None = None):
    """(decode_step, cache) for `generate(..., kv_cache="static", compile=True)`: a Decoder's step and
    its emptied cache; with no C++ compiler on a CPU, one warning and the eager static path's."""
    device = input_ids.device
    plan = plan or _PLANS.get(model) or default_plan(device)
    if plan.compile_mode is not None and device.type == "cpu" and find_cpp_compiler() is None:
        warnings.warn(NO_COMPILER, RuntimeWarning, stacklevel=3)
        cache = StaticCache(model.config, input_ids.shape[0], needed, model.lm_head.weight.dtype, device)
        return model.decode_step, cache
    decoder = decoder_for(model, input_ids.shape[0], needed, plan)
    return decoder.decode_step, decoder.start(attention_mask)


_PLANS: "weakref.WeakKeyDictionary[MiniMindForCausalLM, StepPlan]" = weakref.WeakKeyDictionary()


def generate(model: MiniMindForCausalLM, inputs: torch.Tensor, plan: StepPlan, **generate_kwargs) -> torch.Tensor:
    """`model.generate(inputs, kv_cache="static", compile=True, **generate_kwargs)` with the step of
    `plan` instead of the default one (to measure one fusion, or the fused step uncompiled)."""
    _PLANS[model] = plan
    try:
        return model.generate(inputs, kv_cache="static", compile=True, **generate_kwargs)
    finally:
        del _PLANS[model]
