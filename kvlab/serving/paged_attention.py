"""Attention over a paged cache: write this step's K and V into a request's blocks, gather every
position it holds back through its block table, and attend with MiniMind's own math.

Shapes: R rows of one request fed together (1, or its n samples), T positions fed per row this step,
S = start + T positions held after it, H query heads, KV key/value heads, D head_dim, bs block_size.

Per request, the attention is the model's own function (kvlab.engine.model.attention: its flash path
for a cache-free prefill, else scores, causal mask on the fed columns, a float32 softmax), so that a
request gets the very bits `generate` alone gives it: a request is never padded, so no attention mask
is needed. `block_attention` is the compiled step's, row by row over (row, block) pairs.
"""

from __future__ import annotations

import math

import torch

from kvlab.engine.kv_dtype import load, name_of, store
from kvlab.engine.step import stored
from kvlab.engine.model import apply_rope, attention


def slot_ids(tables: list[list[int]], start: int, end: int, block_size: int) -> torch.Tensor:
    """(R, end - start) flat slot of each position: block table[position // bs], offset position % bs."""
    positions = torch.arange(start, end)
    blocks = torch.tensor(tables)[:, positions // block_size]
    return blocks * block_size + positions % block_size


def write_kv(keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             scales: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Store this step's k and v, (R, T, KV, D), in one layer's pool (num_blocks, bs, KV, D) at `slots`, in
    the pool's dtype (kvlab.engine.kv_dtype.store; int8's scales in `scales`, (num_blocks, bs, KV, 1) each)."""
    for pool, scale_pool, x in ((keys, scales and scales[0], k), (values, scales and scales[1], v)):
        held, scale = store(x, name_of(pool.dtype))
        pool.view(-1, *pool.shape[2:])[slots.flatten()] = held.reshape(-1, *held.shape[2:])
        if scale is not None:
            scale_pool.view(-1, *scale_pool.shape[2:])[slots.flatten()] = scale.reshape(-1, *scale.shape[2:])


def block_index(tables: list[list[int]], length: int, block_size: int) -> torch.Tensor:
    """(R, blocks) the blocks holding each row's first `length` positions, in order."""
    used = -(-length // block_size)
    return torch.tensor([table[:used] for table in tables])


def gather_kv(keys: torch.Tensor, values: torch.Tensor, blocks: torch.Tensor, length: int,
              scales: tuple[torch.Tensor, torch.Tensor] | None = None, dtype: torch.dtype | None = None):
    """Each row's first `length` positions, read block by block (`blocks`, from block_index): (R, S, KV, D)
    each, contiguous, the layout MiniMind's torch.cat cache has, read back in `dtype` (the pool's if None)
    from what the pool stores (kvlab.engine.kv_dtype.load)."""
    rows, used = blocks.shape
    block_size = keys.shape[1]

    def held(pool):
        return pool[blocks].reshape(rows, used * block_size, *pool.shape[2:])[:, :length].contiguous()

    k, v = held(keys), held(values)
    if scales is None and (dtype is None or dtype == keys.dtype):
        return k, v
    return (load(k, scales and held(scales[0]), dtype or keys.dtype),
            load(v, scales and held(scales[1]), dtype or keys.dtype))


def paged_attention(attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    keys: torch.Tensor, values: torch.Tensor, start: int, slots: torch.Tensor,
                    blocks: torch.Tensor, scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One layer's attention for one request, from its projections q (R, T, H*D), k, v (R, T, KV*D) to
    the input of o_proj (R, T, H*D). `attn` is the model's Attention (its heads, q_norm and k_norm);
    cos, sin (T, D) the RoPE tables at positions start .. start + T - 1; keys, values the layer's pool;
    `slots` where this step's positions go (slot_ids), `blocks` the blocks of every position held after
    them (block_index); `scales` an int8 pool's. Per-head norms and RoPE, this step's K and V written into
    the blocks, every held position gathered back through the tables (in q's dtype, whatever the pool
    stores), then the model's attention."""
    rows, fed, _ = q.shape
    q = q.view(rows, fed, attn.num_heads, attn.head_dim)
    k = k.view(rows, fed, attn.num_kv_heads, attn.head_dim)
    v = v.view(rows, fed, attn.num_kv_heads, attn.head_dim)
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    write_kv(keys, values, slots, k, v, scales)
    held_k, held_v = gather_kv(keys, values, blocks, start + fed, scales, q.dtype)
    return attention(q, held_k, held_v, attn.n_rep, attn.use_flash, had_past=start > 0)



def block_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                    pair_rows: torch.Tensor, pair_blocks: torch.Tensor, pair_starts: torch.Tensor) -> torch.Tensor:
    """One query per row, each over the blocks that hold the positions it may see: the attention of
    the serving engine's compiled step (kvlab.serving.compiled_step), for rows of any requests, a
    prompt's positions among them. q (N, 1, H, D), normed and rotated; keys, values one layer's pool
    (num_blocks, bs, KV, D), this step's K and V written already; positions (N,) each row's position
    (it sees positions 0 .. position). The work is split into (row, block) pairs, one per block a row
    reads: pair_rows (P,) the row, pair_blocks (P,) the block, pair_starts (P,) the position of the
    block's first slot. Returns (N, 1, H * D).

    Each pair scores its row's query against its block's keys, a row's scores are exponentiated
    against the row's largest, and each row sums its pairs' weights and weighted values: softmax over
    the row's positions, computed block by block, so a row reads the blocks it holds and no padding
    (vLLM's PagedAttention splits the work the same way). Query head h is served by KV head
    h // (H / KV), as repeat_kv serves it, without the copy. The products are written as products and
    sums, so that the compiler runs the gathers through the pool inside its loops; `stored` keeps it
    from computing the query's norm and rotation, or the exponentials, again inside them. Measured on
    the lab's model at 64 rows of 16 to 300 positions: 0.80 ms a layer, against 2.18 ms for every row
    over the longest row's blocks."""
    rows, _, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = keys.shape
    group = heads // kv_heads
    grouped_q = stored(q.reshape(rows, kv_heads, group, head_dim))[pair_rows]  # (P, KV, group, D)
    block_k = keys[pair_blocks].permute(0, 2, 1, 3)  # (P, KV, bs, D)
    scores = (grouped_q[:, :, :, None, :] * block_k[:, :, None]).sum(-1) / math.sqrt(head_dim)  # (P, KV, group, bs)
    seen = pair_starts[:, None] + torch.arange(block_size, device=q.device) <= positions[pair_rows][:, None]
    scores = scores.float().masked_fill(~seen[:, None, None, :], float("-inf"))
    # every pair sees its block's first position, so each block's largest score is finite
    block_max = scores.amax(-1)  # (P, KV, group)
    row_max = block_max.new_full((rows, kv_heads, group), float("-inf")).scatter_reduce(
        0, pair_rows[:, None, None].expand_as(block_max), block_max, "amax")
    weights = stored(torch.exp(scores - row_max[pair_rows][..., None]))  # (P, KV, group, bs)
    total = scores.new_zeros(rows, kv_heads, group).index_add(0, pair_rows, weights.sum(-1))
    block_v = values[pair_blocks].permute(0, 2, 1, 3)  # (P, KV, bs, D)
    weighted = (weights.type_as(q)[..., None] * block_v[:, :, None]).sum(-2)  # (P, KV, group, D)
    out = q.new_zeros(rows, kv_heads, group, head_dim).index_add(0, pair_rows, weighted) / total[..., None].type_as(q)
    return out.reshape(rows, 1, heads * head_dim)
