"""kvlab's C++ operators as Python calls them: a typed wrapper of each of torch.ops.kvlab.*, and each
one's result as the compiler traces it (the fake functions kvlab.kernels.loader registers).

Each wrapper is the bare operator call, nothing besides: traced by torch.compile or torch.export, it
leaves the custom operator itself in the graph (`torch.ops.kvlab.linear.default`, ...), called through
the dispatcher with no Python between. Call them only where kvlab.kernels.loader.library() said the
library is loaded (kvlab.serving.compiled_step's `native`). What each computes, and how, is said at
the head of its C++ file (csrc/paged_attention.cpp, csrc/linear.cpp, csrc/greedy_pick.cpp).
"""

from __future__ import annotations

import torch


def paged_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                    pair_rows: torch.Tensor, pair_blocks: torch.Tensor) -> torch.Tensor:
    """kvlab.serving.paged_attention.block_attention's result, (N, 1, H * D), from the same inputs (its
    pair_starts implied: a row's pairs are its table's blocks in order): q (N, 1, H, D), keys and values
    (blocks, bs, KV, D), float32 on a CPU, D at most 256."""
    return torch.ops.kvlab.paged_attention(q, keys, values, positions, pair_rows, pair_blocks)


def linear(x: torch.Tensor, weight: torch.Tensor, panels: torch.Tensor) -> torch.Tensor:
    """x @ weight.T, as F.linear: from 4 rows on on `panels`, the weight as `linear_panels` lays it out
    (empty: MKL's product at every size); below, MKL's product. A pure function of its inputs."""
    return torch.ops.kvlab.linear(x, weight, panels)


def linear_panels(weight: torch.Tensor) -> torch.Tensor:
    """The weight (N, K) laid out for `linear`: panels of `panel_width()` columns, flat float32 of
    ceil(N / width) * K * width values; empty where the library has no panels."""
    return torch.ops.kvlab.linear_panels(weight)


def panel_width() -> int:
    """The columns of one of `linear`'s panels (32 with AVX-512, 16 with AVX2), 0 where the library was
    built for a CPU without FMA vectors (then `linear` is MKL's product at every size)."""
    return torch.ops.kvlab.panel_width()


def panel_size(rows: int, inner: int, width: int) -> int:
    """The values `linear_panels` gives a weight (rows, inner) with panels `width` columns wide."""
    return -(-rows // width) * inner * width if width else 0


def greedy_pick(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """Each row's argmax(logits / its temperature), torch.argmax's index (kvlab.engine.sampling's
    greedy_pick): logits (R, V) and temperatures (R,), float32 on a CPU; (R,) int64."""
    return torch.ops.kvlab.greedy_pick(logits, temperatures)


# --- the results as the compiler traces them -------------------------------------------------------


def paged_attention_shape(q, keys, values, positions, pair_rows, pair_blocks):
    """kvlab::paged_attention's result: (N, 1, H * D)."""
    return q.new_empty(q.shape[0], 1, q.shape[2] * q.shape[3])


def linear_shape(x, weight, panels):
    """kvlab::linear's result: x's shape, its last size the weight's rows."""
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def greedy_pick_shape(logits, temperatures):
    """kvlab::greedy_pick's result: one int64 per row."""
    return logits.new_empty(logits.shape[0], dtype=torch.int64)


FAKES = {"kvlab::paged_attention": paged_attention_shape, "kvlab::linear": linear_shape,
         "kvlab::greedy_pick": greedy_pick_shape}
