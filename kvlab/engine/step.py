"""One decode step of MiniMind, written for a compiler: its math, and the weights it reads.

The step computes what MiniMind's cached forward computes for one token per row, and keeps MiniMind's
tokens (kvlab.engine.fast drives it, compiled, in `generate`'s loop):

- **Static shapes.** It reads a cache of a fixed length (positions past the ones written masked),
  the position it writes as a tensor, and a padding bias, so every step of a generation has the same
  shapes and runs the same code.
- **Few inputs.** The weights are one packed copy (`pack_layout`, `PackedWeights`), then K and V of
  each layer, the token, the position and the padding: twelve tensors for the lab's four layers, so a
  compiled step checks few inputs, and another model of the same architecture reuses it (the
  weights are inputs, not constants baked into the code).
- **Fewer operator calls** (`StepPlan`): q, k and v from one matrix product of concatenated weights,
  q/k norm and RoPE applied to q and k at once; gate and up from one product; attention over the
  grouped heads without materialising `repeat_kv`; RoPE from tables indexed by the position tensor.
  On a CPU the products with weight matrices can be written row by row (`rowwise_matmul`), so a
  compiler fuses them, with the norms and activations around them, into its own loops instead of
  calling the BLAS library for each. Each change is exact up to the order of float additions: the
  tokens stay MiniMind's, the logits within 1e-5 on the tests' models (tests/test_fast.py);
  tools/decode_speed.py --ablation times each.

The static shape itself is not free of rounding: attention over the whole cache, its unwritten
positions masked, adds its terms in another order than MiniMind's over the positions written. On the
lab's trained checkpoints (logits up to 19) the eager static-shape step with none of the changes is
already 1.05e-5 from MiniMind's logits after 64 tokens, 1.2e-5 after 1,024; the compiled step 1.1e-5
and 2.0e-5 (a millionth of the logits), with the same tokens, greedy and sampled. RMSNorm and RoPE are
the model's own functions (kvlab.engine.model). The serving engine's compiled step
(kvlab.serving.compiled_step) reads the same packed weights and calls the same projections and MLP.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvlab.engine import sampling
from kvlab.engine.model import MiniMindForCausalLM, apply_rope, rms_norm
from kvlab.kernels import ops, torch_internals

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
    panels: LayerPanels | None = None  # the products' weights in kvlab::linear's panels, where given


class LayerPanels(NamedTuple):
    """One block's product weights laid out for kvlab.kernels' kvlab::linear (views of the packed
    weights' panels), each beside its weight in LayerWeights: qkv, o, gate_up, down."""

    qkv: tuple[torch.Tensor, ...]
    o: torch.Tensor
    gate_up: tuple[torch.Tensor, ...]
    down: torch.Tensor


class ModelWeights(NamedTuple):
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    cos: torch.Tensor  # (L, D): the RoPE tables of the positions the cache holds
    sin: torch.Tensor
    # the LM head in kvlab::linear's panels, where the packed weights have panels (PackedWeights): then
    # every product goes through kvlab.kernels' C++ operator on them (see `linear`)
    lm_head_panels: torch.Tensor | None = None


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


PRODUCTS = ("qkv", "q", "k", "v", "o", "gate_up", "gate", "up", "down")  # a block's pieces that are products' weights


def panel_layout(shape: Shape, plan: StepPlan, width: int) -> list[tuple[str, tuple[int, ...], int]]:
    """Every product's weight the packed weights hold, in their order (the LM head last, named
    "lm_head" also where it is the embedding), its shape and its size in panels `width` columns wide."""
    layout = [(name, size) for name, size in pack_layout(shape, plan) if name.partition(".")[2] in PRODUCTS]
    layout.append(("lm_head", (shape.vocab, shape.hidden)))
    return [(name, size, ops.panel_size(*size, width)) for name, size in layout]


def laid_out(flat: torch.Tensor, layout: list[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """Each named tensor of `layout` as a view of `flat`, where they lie end to end in its order."""
    views, offset = {}, 0
    for name, size in layout:
        count = math.prod(size)
        views[name] = flat[offset : offset + count].view(size)
        offset += count
    return views


def unpack(packed: torch.Tensor, shape: Shape, plan: StepPlan, panels: torch.Tensor | None = None,
           width: int = 0) -> ModelWeights:
    """The packed weights as the step reads them: views, no copy (in compiled code, not even a call);
    with their `panels` (PackedWeights.panels, `width` columns a panel), the products' panels beside
    them (LayerWeights.panels, ModelWeights.lm_head_panels)."""
    views = laid_out(packed, pack_layout(shape, plan))
    laid = laid_out(panels, [(name, (count,)) for name, _, count in panel_layout(shape, plan, width)]) \
        if panels is not None else {}

    def pieces(source: dict, index: int, *names: str) -> tuple[torch.Tensor, ...]:
        return tuple(source[f"{index}.{name}"] for name in names if f"{index}.{name}" in source)

    def layer_panels(i: int) -> LayerPanels | None:
        return LayerPanels(pieces(laid, i, "qkv", "q", "k", "v"), laid[f"{i}.o"], pieces(laid, i, "gate_up", "gate", "up"),
                           laid[f"{i}.down"]) if laid else None

    layers = tuple(
        LayerWeights(views[f"{i}.input_norm"], views[f"{i}.post_norm"], pieces(views, i, "qkv", "q", "k", "v"),
                     pieces(views, i, "qk_norm", "q_norm", "k_norm"), views[f"{i}.o"],
                     pieces(views, i, "gate_up", "gate", "up"), views[f"{i}.down"], layer_panels(i))
        for i in range(shape.layers))
    return ModelWeights(views["embed"], layers, views["final_norm"], views.get("lm_head", views["embed"]),
                        views["cos"], views["sin"], laid.get("lm_head"))


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
    changes: a training step, load_state_dict); `packs` counts the copies. With a `panel_width` (that
    of kvlab.kernels' kvlab::linear, ops.panel_width()), each copy also lays the products' weights out
    in its panels (`panels`, flat, `panel_layout`), which the views carry beside them."""

    def __init__(self, model: MiniMindForCausalLM, shape: Shape, plan: StepPlan, panel_width: int = 0):
        weight = model.lm_head.weight
        self._model = weakref.ref(model)
        self.shape, self.plan = shape, plan
        self.layout = pack_layout(shape, plan)
        self.packed = torch.zeros(sum(math.prod(size) for _, size in self.layout), dtype=weight.dtype,
                                  device=weight.device)
        self.panel_width = panel_width
        self.panels = (torch.zeros(sum(count for *_, count in panel_layout(shape, plan, panel_width)),
                                   dtype=torch.float32, device=weight.device) if panel_width else None)
        self.views = unpack(self.packed, shape, plan, self.panels, panel_width)
        self.packs = 0
        self._parameters = list(model.parameters())  # listed once: walking the modules costs 2 ms
        self._packed_from = None

    def _lay_out_panels(self) -> None:
        """The packed products' weights copied into their panels (kvlab::linear_panels)."""
        views = {**laid_out(self.packed, self.layout), "lm_head": self.views.lm_head}
        layout = panel_layout(self.shape, self.plan, self.panel_width)
        panels = laid_out(self.panels, [(name, (count,)) for name, _, count in layout])
        for name, _, _ in layout:
            panels[name].copy_(ops.linear_panels(views[name]))

    def _versions(self) -> list[tuple[int, int]]:
        """Where each of the model's weights lies and how often it was changed in place."""
        return [(tensor.data_ptr(), torch_internals.version(tensor)) for tensor in self._parameters]

    def refresh(self) -> None:
        """Copy the model's weights into the packed weights, if any changed since the last copy (checked
        at every step: no grad mode entered for the check alone)."""
        version = self._versions()
        if version == self._packed_from:
            return
        model = self._model()
        with torch.no_grad():
            for name, view in laid_out(self.packed, self.layout).items():
                view.copy_(piece_source(model, name, self.shape))
            if self.panels is not None:
                self._lay_out_panels()
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


def linear(x: torch.Tensor, weight: torch.Tensor, plan: StepPlan, panels: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T; with `rowwise_matmul`, as a product and a sum over the last axis, of x stored;
    with the weight's `panels` (LayerWeights.panels), by kvlab.kernels' C++ operator kvlab::linear (its
    own product on them from 4 rows on, MKL's product as F.linear's below)."""
    if plan.rowwise_matmul:
        return (stored(x).unsqueeze(-2) * weight).sum(-1)
    if panels is not None:
        return ops.linear(x, weight, panels)
    return F.linear(x, weight)


def panels_of(layer: LayerWeights, name: str, index: int = 0) -> torch.Tensor | None:
    """The panels of the layer's product weight `name` ("qkv", "o", "gate_up", "down"; `index` within
    a tuple), or None where the weights have none."""
    if layer.panels is None:
        return None
    found = getattr(layer.panels, name)
    return found[index] if isinstance(found, tuple) else found


def project_qkv(x: torch.Tensor, layer: LayerWeights, shape: Shape, cos, sin, plan: StepPlan):
    """q (B, 1, H, D), k and v (B, 1, KV, D) of one token per row, q/k normed and rotated."""
    batch = x.shape[0]
    heads, kv_heads, head_dim = shape.heads, shape.kv_heads, shape.head_dim
    if not plan.fused_qkv:
        q_weight, k_weight, v_weight = layer.qkv
        q = linear(x, q_weight, plan, panels_of(layer, "qkv", 0)).view(batch, 1, heads, head_dim)
        k = linear(x, k_weight, plan, panels_of(layer, "qkv", 1)).view(batch, 1, kv_heads, head_dim)
        v = linear(x, v_weight, plan, panels_of(layer, "qkv", 2)).view(batch, 1, kv_heads, head_dim)
        if shape.qk_norm:
            q, k = rms_norm(q, layer.qk_norm[0], shape.eps), rms_norm(k, layer.qk_norm[1], shape.eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v
    # one product; its heads are q's H, then k's KV, then v's KV
    heads_out = linear(x, layer.qkv[0], plan, panels_of(layer, "qkv")).view(batch, 1, heads + 2 * kv_heads, head_dim)
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
        gate, up = linear(x, layer.gate_up[0], plan, panels_of(layer, "gate_up")).split([shape.intermediate,
                                                                                       shape.intermediate], dim=-1)
    else:
        gate = linear(x, layer.gate_up[0], plan, panels_of(layer, "gate_up", 0))
        up = linear(x, layer.gate_up[1], plan, panels_of(layer, "gate_up", 1))
    return linear(F.silu(gate) * up, layer.down, plan, panels_of(layer, "down"))


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
    (kvlab.engine.sampling.is_greedy)."""

    def __init__(self, shape: Shape, plan: StepPlan):
        super().__init__()
        self.shape, self.plan = shape, plan

    def forward(self, token_ids, position, padding_bias, temperature, packed, *cache):
        layers = self.shape.layers
        logits = packed_step_logits(token_ids, position, padding_bias, packed, list(cache[:layers]),
                                    list(cache[layers:]), self.shape, self.plan)
        return logits, sampling.greedy_pick(logits, temperature, keepdim=True)


def shape_of(model: MiniMindForCausalLM, cache_length: int) -> Shape:
    config = model.config
    return Shape(config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                 config.intermediate_size, config.num_hidden_layers, config.vocab_size, cache_length,
                 config.rms_norm_eps, config.qk_norm, model.lm_head.weight is model.model.embed_tokens.weight)
