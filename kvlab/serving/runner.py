"""One forward step over a mixed batch: every scheduled request's fed positions (a prompt chunk, or
one token per row to decode) through the model's own weights, reading and writing the paged cache.

The runner calls the model's submodules (embed_tokens, each layer's input_layernorm, q_proj, k_proj,
v_proj, q_norm, k_norm, o_proj, post_attention_layernorm, mlp; the final norm and lm_head) in the
order MiniMind's forward does. Attention is per request (kvlab.serving.paged_attention). The rest is
row by row, and how the rows are grouped into calls is `ServingConfig.matmuls`:

  * "per_request": one call per request, shaped as `generate` alone would shape it, (R, T, C). A
    matrix product does not compute a row alike for every row count: measured on the CPU (MKL,
    AVX2), one row and two or three rows get other bits than four or more, and with two threads so
    do the rows past a multiple of 4 below twelve. So a decode row batched with others gets other
    bits than the same row fed alone. Per request, it gets the same ones; so do the logits, taken
    from lm_head over all T positions as `generate` takes them.
  * "fused": one call for every row of the step, (1, N, C), and lm_head over the last rows only, as
    servers do. Fewer, larger calls; bits may differ from `generate` alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlab.engine.model import MiniMindForCausalLM
from kvlab.serving.block_pool import BlockPool
from kvlab.serving.paged_attention import block_index, paged_attention, slot_ids


@dataclass
class Chunk:
    """What one request feeds in a step: ids (R, T) at positions start .. start + T - 1 of each row,
    whose blocks are `tables` (one per row); `wants_logits` when a draw follows."""

    ids: torch.Tensor
    start: int
    tables: list[list[int]]
    wants_logits: bool

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @property
    def fed(self) -> int:
        return self.ids.shape[1]


class ModelRunner:
    def __init__(self, model: MiniMindForCausalLM, pool: BlockPool, matmuls: str = "per_request"):
        self.model = model
        self.pool = pool
        self.fused = matmuls == "fused"

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk]) -> list[torch.Tensor | None]:
        """Feed every chunk; returns, per chunk, its rows' last logits (R, V) if it wants them, else None."""
        inner = self.model.model
        places = [self.place(chunk) for chunk in chunks]
        hidden = [inner.embed_tokens(chunk.ids) for chunk in chunks]  # (R, T, C) each
        for index, layer in enumerate(inner.layers):
            hidden = self.layer(index, layer, hidden, places)
        return self.logits(hidden, chunks)

    def place(self, chunk: Chunk) -> dict:
        """What every layer needs of a chunk: its RoPE rows, the slots it writes, the blocks it reads."""
        inner, size, end = self.model.model, self.pool.block_size, chunk.start + chunk.fed
        return {"cos": inner.freqs_cos[chunk.start:end], "sin": inner.freqs_sin[chunk.start:end], "start": chunk.start,
                "slots": slot_ids(chunk.tables, chunk.start, end, size), "blocks": block_index(chunk.tables, end, size)}

    def layer(self, index: int, layer, hidden: list[torch.Tensor], places: list[dict]) -> list[torch.Tensor]:
        """One Block of MiniMind over every chunk: attention through the pool, then the MLP, each added back."""
        attn = layer.self_attn
        normed = self.rowwise(layer.input_layernorm, hidden)
        queries, keys, values = (self.rowwise(proj, normed) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        pool_k, pool_v = self.pool.keys[index], self.pool.values[index]
        mixed = [paged_attention(attn, q, k, v, place["cos"], place["sin"], pool_k, pool_v, place["start"],
                                 place["slots"], place["blocks"])
                 for q, k, v, place in zip(queries, keys, values, places)]
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

    def logits(self, hidden: list[torch.Tensor], chunks: list[Chunk]) -> list[torch.Tensor | None]:
        """Each wanting chunk's last-position logits (R, V)."""
        inner, head = self.model.model, self.model.lm_head
        wanting = [i for i, c in enumerate(chunks) if c.wants_logits]
        result: list[torch.Tensor | None] = [None] * len(chunks)
        if not self.fused:
            for i in wanting:
                result[i] = head(inner.norm(hidden[i]))[:, -1, :]  # every position, as generate computes them
            return result
        if wanting:
            last = torch.cat([hidden[i][:, -1, :] for i in wanting]).unsqueeze(0)  # (1, rows, C)
            out = head(inner.norm(last))[0]
            for i, part in zip(wanting, out.split([chunks[i].rows for i in wanting])):
                result[i] = part
        return result
