"""One forward step over a mixed batch: every scheduled request's fed positions (a prompt chunk, or
one token per row to decode) through the model's own weights, reading and writing the paged cache.

Two ways through, `ServingConfig.compile`:

  * compiled (the default): every position of every piece in one call of the compiled step
    (kvlab.serving.compiled_step), compiled once, whatever the rows' number and contexts;
  * eager: request by request, calling the model's submodules (embed_tokens, each layer's
    input_layernorm, q_proj, k_proj, v_proj, q_norm, k_norm, o_proj, post_attention_layernorm, mlp;
    the final norm and lm_head) in the order MiniMind's forward does, attention per request
    (kvlab.serving.paged_attention). How it groups rows into calls is `ServingConfig.matmuls`:

    - "per_request": one call per request, shaped as `generate` alone would shape it, (R, T, C). A
      matrix product does not compute a row alike for every row count: measured on the CPU (MKL,
      AVX2), one row and two or three rows get other bits than four or more, and with two threads so
      do the rows past a multiple of 4 below twelve. Per request, a request gets the bits `generate`
      alone gives it; so do the logits, taken from lm_head over all T positions as `generate` takes them.
    - "fused": one call for every row of the step, (1, N, C), and lm_head over the last rows only, as
      servers do. Fewer, larger calls; bits may differ from `generate` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.engine.model import MiniMindForCausalLM
from kvlab.serving.block_pool import BlockPool
from kvlab.serving.compiled_step import CompiledStep, RowInput
from kvlab.serving.paged_attention import block_index, paged_attention, slot_ids


@dataclass
class PieceInput:
    """A piece (kvlab.serving.request.Piece) as the model runner takes it: `token_ids` (one list per row, each T long) at positions
    start .. start + T - 1 of each row, whose blocks are `tables` (one per row); `wants_logits` when a
    draw follows, and `temperature`, at which the compiled step makes its greedy pick of each row (the
    request's, when its knobs are plain greedy)."""

    token_ids: list[list[int]]
    start: int
    tables: list[list[int]]
    wants_logits: bool
    temperature: float = 1.0

    @property
    def rows(self) -> int:
        return len(self.token_ids)

    @property
    def fed(self) -> int:
        return len(self.token_ids[0])

    @property
    def end(self) -> int:
        return self.start + self.fed


@dataclass
class EagerInput:
    """A piece's input as the eager way feeds it: its ids (R, T), its RoPE rows (T, D), the slots it writes
    (R, T) and the blocks of every position it reads (R, blocks)."""

    piece: PieceInput
    ids: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    blocks: torch.Tensor


class ModelRunner:
    def __init__(self, model: MiniMindForCausalLM, pool: BlockPool, matmuls: str = "per_request",
                 compile: bool = True):
        self.model = model
        self.pool = pool
        self.fused = matmuls == "fused"
        self.compiled = CompiledStep(model, pool) if compile else None

    def forward(self, inputs: list[PieceInput]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Feed every piece's input; returns the last logits of every row of the inputs that want them, (R, V),
        input after input, and the compiled step's greedy pick of each (R) at its input's temperature
        (None the eager way, and where the picks are not `greedy_pick_rows`'s)."""
        if self.compiled is None:
            with torch.inference_mode():
                wanted = [logits for logits in self.eager(inputs) if logits is not None]
            return (torch.cat(wanted) if wanted else torch.empty(0, self.model.config.vocab_size)), None
        return self.compiled([RowInput(ids, piece.start, table, piece.wants_logits)
                              for piece in inputs for ids, table in zip(piece.token_ids, piece.tables)],
                             [piece.temperature for piece in inputs if piece.wants_logits for _ in piece.tables])

    # --- the eager way ---------------------------------------------------------------------------

    def eager(self, inputs: list[PieceInput]) -> list[torch.Tensor | None]:
        inner = self.model.model
        placed = [self.place(piece) for piece in inputs]
        hidden = [inner.embed_tokens(place.ids) for place in placed]  # (R, T, C) each
        for index, layer in enumerate(inner.layers):
            hidden = self.layer(index, layer, hidden, placed)
        return self.logits(hidden, inputs)

    def place(self, piece: PieceInput) -> EagerInput:
        """What every layer needs of a piece's input: its ids, RoPE rows, the slots it writes, the blocks it reads."""
        inner, size, end = self.model.model, self.pool.block_size, piece.end
        device = self.model.lm_head.weight.device
        return EagerInput(piece, torch.tensor(piece.token_ids, device=device), inner.freqs_cos[piece.start:end],
                          inner.freqs_sin[piece.start:end], slot_ids(piece.tables, piece.start, end, size),
                          block_index(piece.tables, end, size))

    def layer(self, index: int, layer, hidden: list[torch.Tensor], placed: list[EagerInput]) -> list[torch.Tensor]:
        """One Block of MiniMind over every piece's input: attention through the pool, then the MLP, each added back."""
        attn = layer.self_attn
        normed = self.rowwise(layer.input_layernorm, hidden)
        queries, keys, values = (self.rowwise(proj, normed) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        pool_k, pool_v, scales = self.pool.keys[index], self.pool.values[index], self.pool.scales[index]
        mixed = [paged_attention(attn, q, k, v, place.cos, place.sin, pool_k, pool_v, place.piece.start, place.slots,
                                 place.blocks, scales)
                 for q, k, v, place in zip(queries, keys, values, placed)]
        hidden = [out + h for out, h in zip(self.rowwise(attn.o_proj, mixed), hidden)]
        mlp_out = self.rowwise(layer.mlp, self.rowwise(layer.post_attention_layernorm, hidden))
        return [h + m for h, m in zip(hidden, mlp_out)]

    def rowwise(self, module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """`module` applied to each (R, T, C) input: a call each, or one over all their rows (fused)."""
        if not self.fused:
            return [module(x) for x in inputs]
        flat = torch.cat([x.reshape(-1, x.shape[-1]) for x in inputs]).unsqueeze(0)  # (1, N, C)
        out = module(flat)[0]
        sizes = [x.shape[0] * x.shape[1] for x in inputs]
        return [part.view(*x.shape[:2], -1) for part, x in zip(out.split(sizes), inputs)]

    def logits(self, hidden: list[torch.Tensor], inputs: list[PieceInput]) -> list[torch.Tensor | None]:
        """Each wanting input's last-position logits (R, V)."""
        inner, head = self.model.model, self.model.lm_head
        wanting = [i for i, c in enumerate(inputs) if c.wants_logits]
        result: list[torch.Tensor | None] = [None] * len(inputs)
        if not self.fused:
            for i in wanting:
                result[i] = head(inner.norm(hidden[i]))[:, -1, :]  # every position, as generate computes them
            return result
        if wanting:
            last = torch.cat([hidden[i][:, -1, :] for i in wanting]).unsqueeze(0)  # (1, rows, C)
            out = head(inner.norm(last))[0]
            for i, part in zip(wanting, out.split([inputs[i].rows for i in wanting])):
                result[i] = part
        return result
