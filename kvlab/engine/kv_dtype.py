"""What the KV cache stores: K and V in float32 (MiniMind's, and every result of the lab's), or in
fewer bits, as serving systems offer it (vLLM's `kv_cache_dtype`, llama.cpp's `--cache-type-k/-v`).

The model's arithmetic does not change: a K or V is stored in the cache's dtype when written
(`store`) and read back to the model's dtype for attention (`load`). Attention reads every position
from what the cache holds, this step's own included, as vLLM and llama.cpp attend from their cache:
so a request served from a paged pool and `generate` with the same dtype read the same values.

  float32            the model's own values, bit for bit (no round trip is made)
  bfloat16, float16  the nearest value of the type (torch's cast)
  int8               symmetric, with one float32 scale per token and KV head (over head_dim):
                     scale = max |x| / 127, q = round(x / scale); read back as q x scale, off by at
                     most scale / 2 from x. The scales are part of the bytes
                     (MiniMindConfig.kv_bytes_per_token counts them).

A value is stored from its own token's and head's values alone, so writing a prompt at once or in
pieces stores the same bytes. `StoredCache` is MiniMind's cache (grown by torch.cat) in a dtype of
these; generate(..., kv_dtype=...) keeps one.
"""

from __future__ import annotations

import torch

from kvlab.engine.config import KV_BYTES_PER_ELEMENT

KV_DTYPES = tuple(KV_BYTES_PER_ELEMENT)  # float32 first: the default
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8}
INT8_LEVELS = 127


def check(kv_dtype: str, where: str = "kv_dtype") -> str:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"{where} must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    return kv_dtype


def name_of(dtype: torch.dtype) -> str:
    """The kv_dtype name of a torch dtype a cache is kept in."""
    return next(name for name, torch_dtype in TORCH_DTYPES.items() if torch_dtype == dtype)


def cache_for(model, kv_dtype: str) -> "StoredCache | None":
    """A fresh cache for `model` (a MiniMindForCausalLM) keeping `kv_dtype`: None (MiniMind's own) where
    that is the model's dtype, else a StoredCache."""
    same = name_of(next(model.parameters()).dtype) == kv_dtype
    return None if same else StoredCache(model.config.num_hidden_layers, check(kv_dtype))


def store(x: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`x` (..., D) as the cache keeps it: (values in `kv_dtype`, the int8 scales (..., 1) float32, else None)."""
    if kv_dtype == "int8":
        scale = x.abs().amax(-1, keepdim=True).float() / INT8_LEVELS
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero head stores zeros
        return torch.round(x.float() / scale).clamp(-INT8_LEVELS, INT8_LEVELS).to(torch.int8), scale
    return x.to(TORCH_DTYPES[kv_dtype]), None


def load(values: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """What `store` kept, read back in `dtype` (the model's)."""
    if scale is not None:
        return (values.float() * scale).to(dtype)
    return values.to(dtype)


class StoredCache:
    """MiniMind's cache, per layer K and V grown by torch.cat, kept in `kv_dtype` (with int8's scales):
    each write stores the new positions and returns every position held, read back in the model's
    dtype. The same protocol as the model's StaticCache: `layer(index)`, `length`, `nbytes()`."""

    def __init__(self, num_layers: int, kv_dtype: str):
        self.kv_dtype = check(kv_dtype)
        self.held: list[list[tuple[torch.Tensor, torch.Tensor | None]] | None] = [None] * num_layers
        self.length = 0

    def layer(self, index: int) -> "StoredLayer":
        return StoredLayer(self, index)

    def write(self, index: int, k: torch.Tensor, v: torch.Tensor):
        """Store this call's K and V (B, T, KV, D) of layer `index` after the positions held; returns every
        position held, (B, S, KV, D) each, in k's dtype."""
        new = [store(k, self.kv_dtype), store(v, self.kv_dtype)]
        if self.held[index] is not None:
            new = [(torch.cat([old[0], part[0]], dim=1), None if part[1] is None else torch.cat([old[1], part[1]], dim=1))
                   for old, part in zip(self.held[index], new)]
        self.held[index] = new
        return tuple(load(values, scale, k.dtype) for values, scale in new)

    def nbytes(self) -> int:
        """Bytes held: the stored values and their scales."""
        return sum(t.numel() * t.element_size() for layer in self.held if layer for pair in layer for t in pair
                   if t is not None)


class StoredLayer:
    """One layer's view of a StoredCache, as Attention receives it (the protocol of StaticLayer)."""

    def __init__(self, cache: StoredCache, index: int):
        self.cache, self.index = cache, index

    @property
    def start(self) -> int:
        return self.cache.length

    def write(self, k: torch.Tensor, v: torch.Tensor):
        return self.cache.write(self.index, k, v)
