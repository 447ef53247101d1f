"""The fast decode path: `generate(model, ids, ...)`, MiniMind's `generate` on a compiled step.

A cached decode step of the lab's model spends most of its time not on arithmetic but on the fixed
cost of some 400 operator calls (kvlab.measure.anatomy opens it). This module attacks that cost, and
keeps MiniMind's tokens:

- **Static shapes, compiled once.** A decode step here reads a cache allocated for its final length
  (`DecodeCache`), the position it writes as a tensor, and a padding mask, so every step of a
  generation has the same shapes and runs the same code: `torch.compile` compiles it once
  (`dynamic=False`, `fullgraph=True`), and each later step only checks its guards and runs it.
- **Few inputs.** The step reads tensors all owned by its `Decoder` at fixed addresses: the packed
  weights (one flat copy of every weight the step needs, `pack_layout`), K and V of each layer, the
  token, the position, the padding: twelve for the lab's four layers. The compiled code checks each
  input before it runs (the guards, then the wrapper's asserts), so twelve cost less than the
  model's forty-odd tensors; the weights are inputs, not constants baked into the code, so another
  model of the same architecture reuses the compiled step.
- **Fewer operator calls** (`StepPlan`): q, k and v from one matrix product of concatenated
  weights, q/k norm and RoPE applied to q and k at once; gate and up from one product; attention
  over the grouped heads without materialising `repeat_kv`; RoPE from tables indexed by the
  position tensor. On a CPU the products with weight matrices are written row by row
  (`rowwise_matmul`), so inductor fuses them, with the norms and activations around them, into its
  own C++ loops instead of calling the BLAS library for each. Each change is exact up to the order
  of float additions: the tokens stay MiniMind's, the logits within 1e-5 on the tests' models
  (tests/test_fast.py); tools/decode_speed.py --ablation times each.

The static shape itself is not free of rounding: attention over the whole cache, its unwritten
positions masked, adds its terms in another order than MiniMind's over the positions written. On
the lab's trained checkpoints (logits up to 19) the eager static-shape step with none of the changes
is already 1.05e-5 from MiniMind's logits after 64 tokens, 1.2e-5 after 1,024; the default compiled
step is 1.1e-5 and 2.0e-5 (a millionth of the logits), with the same tokens, greedy and sampled.

What stays eager, and why:

- **The prefill** (the prompt, fed once) runs the model's own eager forward into the same cache: its
  shape is the prompt's, and it is one call per generation; its logits are the eager path's, bit
  for bit.
- **The next-token choice** (kvlab.engine.sampling, the one home of each rule): a compiled draw would
  take its random numbers from inductor's generator, not from the one `torch.manual_seed` seeds, so
  seeded samples would part from the eager path's; and torch 2.13's inductor fails on
  argmax(logits / temperature) in its Gumbel-max pass (kvlab.measure.anatomy met it).

A `Decoder` is kept per (model, batch, cache length, dtype, device, plan). The cache length is the
generation's final length rounded up to a multiple of BUCKET_POSITIONS (never past
max_position_embeddings), so prompts of different lengths share one compiled step; the price is
attention over up to BUCKET_POSITIONS - 1 masked positions. Its packed weights are a copy of the
model's, packed again at the start of a generation whenever a weight has changed since (a tensor's
version counter counts its in-place changes: a training step, load_state_dict). On a GPU the step
is compiled with mode "reduce-overhead" (CUDA graphs: the step replayed as one launch), its inputs
at fixed addresses. Compiled code is made for torch's thread count too (one of its guards): another
count compiles the step again. Where no C++ compiler is found on a CPU (inductor writes C++ there),
`generate` says so in one line and runs the eager static path. A Decoder serves one generation at a
time.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvlab.engine import aot, sampling
from kvlab.engine.model import CausalLMOutput, MiniMindForCausalLM, StaticCache, apply_rope, generation_loop, rms_norm

# A compiled step serves every cache length up to its own; lengths are rounded up to this multiple.
BUCKET_POSITIONS = 256
ATTENTIONS = ("repeat_kv", "grouped", "sdpa")
# MiniMind's rule for a padded key (kvlab.engine.model.Attention): it scores -1e9.
PADDED_KEY_SCORE = -1e9


@dataclass(frozen=True)
class StepPlan:
    """How the decode step computes, and how it runs. Every choice keeps MiniMind's tokens.

    fused_qkv: q, k and v from one matrix product of the three weights concatenated; q/k norm and
        RoPE then run once on q and k side by side (MiniMind: three products, each norm and RoPE twice).
    fused_gate_up: the MLP's gate and up from one product (MiniMind: two).
    attention: "repeat_kv" copies each KV head for its query heads (MiniMind); "grouped" lays the
        query heads of one KV head side by side and multiplies them with it (no copy);
        "sdpa" is PyTorch's fused attention with enable_gqa (the same grouping, one operator call).
    compile_mode: a torch.compile mode ("default"; "reduce-overhead" adds CUDA graphs on a GPU), or
        None to run the same step eagerly (to measure what the fusions buy without compiling).
    cpp_wrapper: inductor writes the code that calls its kernels in C++ too (mode "default" only).
    rowwise_matmul: each product with a weight matrix written as a product and a sum (one output
        per row of the weight), which inductor compiles into its own loops, fused with what comes
        after, instead of calling the BLAS library (compiled plans only). Attention's two products
        stay matrix products: as sums over a cache of hundreds of positions they measured slower.
    aot: the step compiled ahead of time by AOTInductor (kvlab.engine.aot: exported, compiled into a
        library kept on disk, called without Python in between), its cache length symbolic, so
        every generation's cache is exactly its length; the greedy choice made inside the step
        (mode "default" on a CPU only).
    """

    fused_qkv: bool = True
    fused_gate_up: bool = True
    attention: str = "grouped"
    compile_mode: str | None = "default"
    cpp_wrapper: bool = False
    rowwise_matmul: bool = False
    aot: bool = False

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {self.attention!r}")
        if self.rowwise_matmul and self.compile_mode is None:
            raise ValueError("rowwise_matmul needs a compile_mode (run eagerly, it would materialise every product)")
        if self.cpp_wrapper and self.compile_mode != "default":
            raise ValueError(f"cpp_wrapper needs compile_mode 'default', got {self.compile_mode!r}")
        if self.aot and self.compile_mode != "default":
            raise ValueError(f"aot needs compile_mode 'default', got {self.compile_mode!r}")


class Shape(NamedTuple):
    """The architecture's numbers the step needs (constants of the compiled code)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    vocab: int
    positions: int  # the cache length: the RoPE rows packed
    eps: float
    qk_norm: bool
    tied: bool  # the LM head is the embedding (tie_word_embeddings)


class LayerWeights(NamedTuple):
    """One block's weights as the step reads them (views of the packed weights)."""

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
    cos: torch.Tensor  # (L, D): the RoPE tables of the positions the cache holds
    sin: torch.Tensor


# --- the packed weights ------------------------------------------------------------------------------


def layer_pieces(shape: Shape, plan: StepPlan) -> list[tuple[str, tuple[int, ...]]]:
    """One block's tensors in the order they lie in the packed weights, with their shapes."""
    hidden, heads, kv_heads, head_dim, inner = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate
    pieces = [("input_norm", (hidden,)), ("post_norm", (hidden,))]
    if plan.fused_qkv:
        pieces.append(("qkv", ((heads + 2 * kv_heads) * head_dim, hidden)))
    else:
        pieces += [("q", (heads * head_dim, hidden)), ("k", (kv_heads * head_dim, hidden)),
                   ("v", (kv_heads * head_dim, hidden))]
    if shape.qk_norm:
        pieces += [("qk_norm", (heads + kv_heads, head_dim))] if plan.fused_qkv else [("q_norm", (head_dim,)),
                                                                                     ("k_norm", (head_dim,))]
    pieces.append(("o", (hidden, heads * head_dim)))
    pieces += [("gate_up", (2 * inner, hidden))] if plan.fused_gate_up else [("gate", (inner, hidden)),
                                                                           ("up", (inner, hidden))]
    pieces.append(("down", (hidden, inner)))
    return pieces


def pack_layout(shape: Shape, plan: StepPlan) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the packed weights, in order: the embedding, each block's pieces (named
    "3.qkv"), the final norm, the LM head (unless it is the embedding), the RoPE tables."""
    layout = [("embed", (shape.vocab, shape.hidden))]
    for index in range(shape.layers):
        layout += [(f"{index}.{name}", size) for name, size in layer_pieces(shape, plan)]
    layout.append(("final_norm", (shape.hidden,)))
    if not shape.tied:
        layout.append(("lm_head", (shape.vocab, shape.hidden)))
    layout += [("cos", (shape.positions, shape.head_dim)), ("sin", (shape.positions, shape.head_dim))]
    return layout


def unpack(packed: torch.Tensor, shape: Shape, plan: StepPlan) -> ModelWeights:
    """The packed weights as the step reads them: views, no copy (in compiled code, not even a call)."""
    views, offset = {}, 0
    for name, size in pack_layout(shape, plan):
        count = math.prod(size)
        views[name] = packed[offset : offset + count].view(size)
        offset += count

    def pieces(index: int, *names: str) -> tuple[torch.Tensor, ...]:
        return tuple(views[f"{index}.{name}"] for name in names if f"{index}.{name}" in views)

    layers = tuple(
        LayerWeights(views[f"{i}.input_norm"], views[f"{i}.post_norm"], pieces(i, "qkv", "q", "k", "v"),
                     pieces(i, "qk_norm", "q_norm", "k_norm"), views[f"{i}.o"], pieces(i, "gate_up", "gate", "up"),
                     views[f"{i}.down"])
        for i in range(shape.layers))
    return ModelWeights(views["embed"], layers, views["final_norm"], views.get("lm_head", views["embed"]),
                        views["cos"], views["sin"])


def piece_source(model: MiniMindForCausalLM, name: str, shape: Shape) -> torch.Tensor:
    """The model's tensor (or tensors, concatenated) that the packed weights hold under `name`."""
    inner = model.model
    if name in ("cos", "sin"):
        return getattr(inner, f"freqs_{name}")[: shape.positions]
    if name == "embed":
        return inner.embed_tokens.weight
    if name == "final_norm":
        return inner.norm.weight
    if name == "lm_head":
        return model.lm_head.weight
    index, piece = name.split(".")
    block = inner.layers[int(index)]
    attention, ffn = block.self_attn, block.mlp
    own = {"input_norm": block.input_layernorm, "post_norm": block.post_attention_layernorm,
           "q": attention.q_proj, "k": attention.k_proj, "v": attention.v_proj, "o": attention.o_proj,
           "gate": ffn.gate_proj, "up": ffn.up_proj, "down": ffn.down_proj}
    if piece in own:
        return own[piece].weight
    if piece == "q_norm" or piece == "k_norm":
        return getattr(attention, piece).weight
    if piece == "qkv":
        return torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
    if piece == "qk_norm":  # one row per head: q's H rows, then k's KV rows
        return torch.cat([attention.q_norm.weight.expand(shape.heads, -1), attention.k_norm.weight.expand(shape.kv_heads, -1)])
    return torch.cat([ffn.gate_proj.weight, ffn.up_proj.weight])  # gate_up


class PackedWeights:
    """One flat copy of every weight a step reads (`packed`, laid out by `pack_layout`) and its views
    (`views`, a ModelWeights). It holds its model weakly. `refresh` copies the model's weights in
    again when one has changed since the last copy (a tensor's version counter counts its in-place
    changes: a training step, load_state_dict); `packs` counts the copies."""

    def __init__(self, model: MiniMindForCausalLM, shape: Shape, plan: StepPlan):
        weight = model.lm_head.weight
        self._model = weakref.ref(model)
        self.shape, self.plan = shape, plan
        self.layout = pack_layout(shape, plan)
        self.packed = torch.zeros(sum(math.prod(size) for _, size in self.layout), dtype=weight.dtype,
                                  device=weight.device)
        self.views = unpack(self.packed, shape, plan)
        self.packs = 0
        self._parameters = list(model.parameters())  # listed once: walking the modules costs 2 ms
        self._packed_from = None

    def _version(self) -> tuple:
        """Where each of the model's weights lies and how often it was changed in place."""
        return tuple((tensor.data_ptr(), tensor._version) for tensor in self._parameters)

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the model's weights into the packed weights, if any changed since the last copy."""
        model = self._model()
        version = self._version()
        if version == self._packed_from:
            return
        offset = 0
        for name, size in self.layout:
            count = math.prod(size)
            self.packed[offset : offset + count].view(size).copy_(piece_source(model, name, self.shape))
            offset += count
        self._packed_from = version
        self.packs += 1


# --- the step ------------------------------------------------------------------------------------


def stored(x: torch.Tensor) -> torch.Tensor:
    """x itself, which the compiler must write to memory before it is read (as_strided needs a real
    storage). A product written row by row reads each element of its input once per row of the
    weight: an input left as a formula (a norm, a residual sum) would be computed again for every row.
    Made contiguous first: the compiler may lay a view's values out anew, where a view's own strides
    would read the wrong elements (a split or a transpose)."""
    x = x.contiguous()
    return x.as_strided(x.size(), x.stride())


def linear(x: torch.Tensor, weight: torch.Tensor, plan: StepPlan) -> torch.Tensor:
    """x @ weight.T; with `rowwise_matmul`, as a product and a sum over the last axis, of x stored."""
    if plan.rowwise_matmul:
        return (stored(x).unsqueeze(-2) * weight).sum(-1)
    return F.linear(x, weight)


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
    q, k = apply_rope(qk, cos, sin).split([heads, kv_heads], dim=2)
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
    scores = (grouped_q @ k_t) / math.sqrt(head_dim)
    weights = F.softmax(scores.float() + key_bias, dim=-1).type_as(q)
    return (weights @ v).reshape(batch, 1, heads * head_dim)


def mlp(x: torch.Tensor, layer: LayerWeights, shape: Shape, plan: StepPlan) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    if plan.fused_gate_up:
        gate, up = linear(x, layer.gate_up[0], plan).split([shape.intermediate, shape.intermediate], dim=-1)
    else:
        gate, up = linear(x, layer.gate_up[0], plan), linear(x, layer.gate_up[1], plan)
    return linear(F.silu(gate) * up, layer.down, plan)


def step_logits(token_ids: torch.Tensor, position: torch.Tensor, padding_bias: torch.Tensor, weights: ModelWeights,
                keys_t, values, shape: Shape, plan: StepPlan) -> torch.Tensor:
    """One decode step with static shapes: the logits (B, V) after `token_ids` (B, 1) at `position`
    (a (1,) tensor, the same for every row), its K and V written into the cache at that position
    (per layer keys_t[i] (B, KV, D, L) and values[i] (B, KV, L, D)). padding_bias (B, L): -1e9 at the
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


def packed_step_logits(token_ids, position, padding_bias, packed, keys_t, values, shape: Shape, plan: StepPlan):
    """`step_logits` on the tensors a Decoder owns (what is compiled): the packed weights unpacked
    into views, the cache's K and V, per layer (B, KV, D, L) and (B, KV, L, D)."""
    return step_logits(token_ids, position, padding_bias, unpack(packed, shape, plan), keys_t, values, shape, plan)


class GreedyStep(torch.nn.Module):
    """`packed_step_logits` as the module AOTInductor compiles: its inputs flat (token ids, position,
    padding bias, temperature, the packed weights, each layer's keys, then each layer's values), its
    outputs the logits (B, V) and the greedy choice (B, 1), `argmax(logits / temperature)`: MiniMind's
    next token when it does not sample and no knob but the temperature is set
    (kvlab.engine.sampling.plain_greedy)."""

    def __init__(self, shape: Shape, plan: StepPlan):
        super().__init__()
        self.shape, self.plan = shape, plan

    def forward(self, token_ids, position, padding_bias, temperature, packed, *cache):
        layers = self.shape.layers
        logits = packed_step_logits(token_ids, position, padding_bias, packed, list(cache[:layers]),
                                    list(cache[layers:]), self.shape, self.plan)
        return logits, torch.argmax(logits / temperature, dim=-1, keepdim=True)


def aot_program(model: MiniMindForCausalLM, batch: int, shape: Shape, plan: StepPlan) -> aot.Program:
    """The AOTInductor package of this architecture's step for `batch` rows (kvlab.engine.aot), its cache
    length symbolic: exported on an example cache of 97 positions (a length no other size shares)."""
    weight = model.lm_head.weight
    example = 97

    def export() -> torch.export.ExportedProgram:
        config = model.config
        kv_heads, head_dim = config.num_key_value_heads, config.head_dim
        keys = [torch.zeros(batch, kv_heads, head_dim, example, dtype=weight.dtype) for _ in range(shape.layers)]
        values = [torch.zeros(batch, kv_heads, example, head_dim, dtype=weight.dtype) for _ in range(shape.layers)]
        packed = torch.zeros(sum(math.prod(size) for _, size in pack_layout(shape, plan)), dtype=weight.dtype)
        inputs = (torch.zeros(batch, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                  torch.zeros(batch, example), torch.tensor(1.0), packed, *keys, *values)
        length = torch.export.Dim("cache_length", min=2, max=max(3, shape.positions))
        cache = (*[{3: length}] * shape.layers, *[{2: length}] * shape.layers)  # the varargs, as one tuple
        dynamic = (None, None, {1: length}, None, None, cache)
        return torch.export.export(GreedyStep(shape, plan), inputs, dynamic_shapes=dynamic)

    from kvlab.engine import model as model_module

    parts = ("decode step", tuple(shape), dataclasses.astuple(plan), batch, str(weight.dtype))
    return aot.program(parts, (sys.modules[__name__], model_module), export)


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
    """`packed_step_logits` compiled for `mode`, one wrapper per mode for the whole process: its
    compiled code is keyed by the inputs' shapes, dtypes and devices (and the plan's and Shape's
    values), so every Decoder with the same shapes shares it."""
    key = (mode, cpp_wrapper)
    if key not in _COMPILED:
        how = {"options": {"cpp_wrapper": True}} if cpp_wrapper else {"mode": mode}
        _COMPILED[key] = torch.compile(packed_step_logits, dynamic=False, fullgraph=True, **how)
    return _COMPILED[key]


# --- the decoder: a cache, its weights and its step, per shape --------------------------------------


def bucket_length(needed: int, limit: int) -> int:
    """The cache length for a generation that needs `needed` positions: rounded up to a multiple
    of BUCKET_POSITIONS, at most `limit` (the model's max_position_embeddings)."""
    return min(-(-needed // BUCKET_POSITIONS) * BUCKET_POSITIONS, limit)


def shape_of(model: MiniMindForCausalLM, cache_length: int) -> Shape:
    config = model.config
    return Shape(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                 config.intermediate_size, config.num_hidden_layers, config.vocab_size, cache_length,
                 config.rms_norm_eps, config.qk_norm, model.lm_head.weight is model.model.embed_tokens.weight)


class DecodeCache(StaticCache):
    """A StaticCache laid out for a one-token query: per layer the keys stored transposed,
    (B, KV, D, L), and the values (B, KV, L, D), so that both of attention's products read the cache
    as it lies (MiniMind's (B, L, KV, D) would be copied to a new layout first). `keys` and `values`
    are (B, L, KV, D) views of them, as the model's eager forward (the prefill) writes a StaticCache.
    One tensor per layer, not one for all: the compiled step writes a whole input in place, where
    it would copy a tensor to write into a view of it."""

    def __init__(self, config, batch: int, max_tokens: int, dtype, device):
        kv_heads, head_dim, layers = config.num_key_value_heads, config.head_dim, config.num_hidden_layers
        self.keys_t = [torch.zeros(batch, kv_heads, head_dim, max_tokens, dtype=dtype, device=device)
                       for _ in range(layers)]
        self.head_major_values = [torch.zeros(batch, kv_heads, max_tokens, head_dim, dtype=dtype, device=device)
                                  for _ in range(layers)]
        self.keys = [layer.permute(0, 3, 1, 2) for layer in self.keys_t]
        self.values = [layer.transpose(1, 2) for layer in self.head_major_values]
        self.max_tokens = max_tokens
        self.length = 0


class Decoder:
    """Everything one shape of generation needs, made once and reused by every generation of that
    shape: the packed weights, the position, token and padding inputs, the step, and the cache (with
    a cache length fixed by the shape, or, for an `aot` plan, made for each generation's own length).
    It holds its model weakly (the model's Decoders go with the model).

    `compile_s` is the wall time of compiling (or loading) the step, kept apart from every timing: an
    `aot` plan's when the Decoder is made, else the first compiled step's (compiling, or finding the
    compiled code when another Decoder of the same shapes compiled it); `steps` counts the decode
    steps run."""

    def __init__(self, model: MiniMindForCausalLM, batch: int, cache_length: int | None, plan: StepPlan):
        self._model = weakref.ref(model)
        self.batch, self.cache_length, self.plan = batch, cache_length, plan
        self.compile_s: float | None = None
        self.steps = 0
        weight = model.lm_head.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.shape = shape_of(model, cache_length or model.config.max_position_embeddings)
        self.weights = PackedWeights(model, self.shape, plan)
        self.cache: DecodeCache | None = None
        self.padding_bias: torch.Tensor | None = None
        self.token_ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)
        self.temperature = torch.ones((), device=self.device)
        self._temperature = 1.0  # what `temperature` holds (read without a tensor access)
        self.program = aot_program(model, batch, self.shape, plan) if plan.aot else None
        if self.program is not None:
            self.compile_s = self.program.compile_s
        self.step_fn = None if plan.compile_mode is None or plan.aot else compiled_step(plan.compile_mode,
                                                                                           plan.cpp_wrapper)
        if cache_length is not None:
            self._allocate(cache_length)

    def _allocate(self, length: int) -> None:
        """A cache and a padding bias of `length` positions (CUDA graphs replay them at fixed addresses)."""
        self.cache = DecodeCache(self.model.config, self.batch, length, self.dtype, self.device)
        self.padding_bias = torch.zeros(self.batch, length, dtype=torch.float32, device=self.device)
        if self.step_fn is not None and self.device.type == "cuda":
            for tensor in self.step_tensors():
                torch._dynamo.mark_static_address(tensor)

    def step_inputs(self) -> tuple:
        """What the compiled step reads, in its order: four tensors, then per layer K and V."""
        return (self.token_ids, self.position, self.padding_bias, self.weights.packed, self.cache.keys_t,
                self.cache.head_major_values)

    def step_tensors(self) -> list[torch.Tensor]:
        """Every tensor of `step_inputs`."""
        return [*self.step_inputs()[:4], *self.cache.keys_t, *self.cache.head_major_values]

    @property
    def model(self) -> MiniMindForCausalLM:
        return self._model()

    def start(self, attention_mask: torch.Tensor | None, needed: int) -> DecodeCache:
        """Make the decoder ready for a new generation of `needed` positions: the cache empty (made anew
        when an `aot` plan's length changes), the weights packed if they changed, the prompt's padding
        (attention_mask (B, P), 0 at padding) in the padding bias."""
        if self.cache_length is None and (self.cache is None or self.cache.max_tokens != needed):
            self._allocate(needed)
        self.cache.length = 0
        self.weights.refresh()
        self.padding_bias.zero_()
        if attention_mask is not None:
            self.padding_bias[:, : attention_mask.shape[1]] = (1.0 - attention_mask.float()) * PADDED_KEY_SCORE
        return self.cache

    def decode_step(self, input_ids, attention_mask, past_key_values, use_cache: bool, **knobs):
        """`MiniMindForCausalLM.decode_step`'s contract: the prompt goes through the model's eager modules
        (into this decoder's cache); each later token through the static-shape step. Then the next
        ids (kvlab.engine.sampling.choose_next: an `aot` step's own greedy choice, or the eager
        choice). Returns (outputs, (B, 1) ids)."""
        greedy = None
        if self.cache.length == 0:
            logits = self._prefill(input_ids, attention_mask)
        else:
            self.position.fill_(self.cache.length)
            self.token_ids.copy_(input_ids[:, -1:])  # a view of input_ids has a new stride each step
            logits, greedy = self.run_step(knobs["temperature"])
            self.cache.length += 1
        next_token = sampling.choose_next(logits, input_ids, greedy, **knobs)
        return CausalLMOutput(logits=logits[:, None, :], past_key_values=self.cache), next_token

    def _prefill(self, input_ids, attention_mask) -> torch.Tensor:
        """The prompt through the model's own eager modules into the cache; the last position's logits.
        The LM head runs on that position alone (MiniMind computes every position's logits and reads
        the last: a seventh of a prompt's arithmetic on the lab's model, for logits some 1e-6 apart,
        another library kernel's roundings)."""
        model = self.model
        hidden, _ = model.model(input_ids, attention_mask, self.cache, use_cache=True)
        return model.lm_head(hidden[:, -1, :])

    def run_step(self, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decode step of `token_ids` at `position`: (B, V) logits, K and V written into the cache;
        and, from an `aot` step, its greedy choice at `temperature` (else None)."""
        greedy = None
        if self.program is not None:
            if self._temperature != temperature:
                self.temperature.fill_(temperature)
                self._temperature = temperature
            logits, greedy = self.program.run([self.token_ids, self.position, self.padding_bias, self.temperature,
                                               self.weights.packed, *self.cache.keys_t, *self.cache.head_major_values])
        elif self.step_fn is None:
            logits = step_logits(self.token_ids, self.position, self.padding_bias, self.weights.views, self.cache.keys_t,
                                 self.cache.head_major_values, self.shape, self.plan)
        else:
            logits = self._compiled_step()
        self.steps += 1
        return logits, greedy

    def _compiled_step(self) -> torch.Tensor:
        """The compiled step; the first one's wall time (its compiling) kept as compile_s."""
        on_gpu = self.token_ids.device.type == "cuda"
        if on_gpu:
            torch.compiler.cudagraph_mark_step_begin()  # a new replay: the last step's outputs may be reused
        start = time.perf_counter()
        logits = self.step_fn(*self.step_inputs(), self.shape, self.plan)
        if self.steps == 0:
            if on_gpu:
                torch.cuda.synchronize()
            self.compile_s = time.perf_counter() - start
        return logits


_DECODERS: "weakref.WeakKeyDictionary[MiniMindForCausalLM, dict]" = weakref.WeakKeyDictionary()


def decoders_of(model: MiniMindForCausalLM) -> dict:
    """The model's Decoders, keyed by (batch, cache length (None: every length), dtype, device, plan)."""
    return _DECODERS.setdefault(model, {})


def decoder_for(model: MiniMindForCausalLM, batch: int, needed: int, plan: StepPlan) -> Decoder:
    """The Decoder of this shape, made on first use. `needed`: the positions the generation fills; an
    `aot` plan's Decoder serves every length, another's the lengths of its bucket."""
    weight = model.lm_head.weight
    length = None if plan.aot else bucket_length(needed, model.config.max_position_embeddings)
    key = (batch, length, weight.dtype, weight.device, plan)
    found = decoders_of(model)
    if key not in found:
        found[key] = Decoder(model, batch, length, plan)
    return found[key]


def default_plan(device) -> StepPlan:
    """What `generate` runs by default: every fusion, compiled. On a CPU the matrix products are
    written row by row, so that inductor fuses the whole step into its own C++ loops, compiled ahead
    of time (`aot`: no Python between the step and the loop, a cache exactly the generation's length,
    the greedy choice inside); on a GPU, cuBLAS's products and CUDA graphs (mode "reduce-overhead":
    the step replayed as one launch)."""
    if torch.device(device).type == "cuda":
        return StepPlan(compile_mode="reduce-overhead")
    return StepPlan(rowwise_matmul=True, aot=True)


NO_COMPILER = ("kvlab.engine.fast.generate: no C++ compiler found (torch.compile needs one on a CPU; "
               "install g++ or set CXX), so this generation runs the eager static path")


def decoding(model: MiniMindForCausalLM, input_ids: torch.Tensor, attention_mask, needed: int,
             plan: StepPlan | None = None):
    """(step, cache) for `generate`: a Decoder's step and its emptied cache; with no C++ compiler on a
    CPU, one warning and the eager static path's (the model's own step over a StaticCache)."""
    device = input_ids.device
    plan = plan or default_plan(device)
    if plan.compile_mode is not None and device.type == "cpu" and find_cpp_compiler() is None:
        warnings.warn(NO_COMPILER, RuntimeWarning, stacklevel=3)
        cache = StaticCache(model.config, input_ids.shape[0], needed, model.lm_head.weight.dtype, device)
        return model.decode_step, cache
    decoder = decoder_for(model, input_ids.shape[0], needed, plan)
    return decoder.decode_step, decoder.start(attention_mask, needed)


@torch.inference_mode()
def generate(model: MiniMindForCausalLM, inputs: torch.Tensor, attention_mask: torch.Tensor | None = None,
             max_new_tokens: int = 8192, temperature: float = 0.85, top_p: float = 0.85, top_k: int = 50,
             eos_token_id: int | None = 2, num_return_sequences: int = 1, do_sample: bool = True,
             repetition_penalty: float = 1.0, *, plan: StepPlan | None = None) -> torch.Tensor:
    """MiniMind's `generate` (the model's knobs, its loop: kvlab.engine.model.generation_loop), each
    decode step one call of a compiled step of static shapes (`plan`: default_plan's, or another, to
    measure one fusion, or the fused step uncompiled). The same tokens as `model.generate`, fewer and
    fused operator calls. Returns prompt + new ids, (B * num_return_sequences, P + n)."""
    input_ids, attention_mask = model.generation_inputs(inputs, attention_mask, max_new_tokens, num_return_sequences,
                                                        temperature, do_sample)
    step, cache = decoding(model, input_ids, attention_mask, inputs.shape[1] + max_new_tokens - 1, plan)
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                 do_sample=do_sample)
    return generation_loop(step, input_ids, attention_mask, cache, max_new_tokens, eos_token_id, True, knobs)
