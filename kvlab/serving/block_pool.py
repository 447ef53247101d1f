"""The paged KV cache: one pool of fixed-size blocks, allocated once, shared by every request.

Per layer, one K and one V tensor of shape (num_blocks + 1, block_size, KV heads, head_dim), before
repeat_kv as MiniMind's cache keeps them; the last block is never lent: padded rows of the compiled
step write there (kvlab.serving.compiled_step). On a CPU the tensors lie in an anonymous mapping
(`zeroed_memory`): the kernel hands out its pages zeroed when they are first touched, in 2 MiB pages
where it grants them, so a pool is ready at once and a short run pays only for the blocks it uses
(measured on the lab's model, 2,048 blocks, some 70 MB: 2 ms against 36 ms for torch.zeros, and the
64-request benchmark's engine 0.72 to 0.65 s, creation included). A request holds blocks, not a
tensor of its own: its block table says which block holds which `block_size` positions
(kvlab.serving.paged_attention reads and writes through it).

Bookkeeping, as nano-vllm's block manager keeps it:
  * a reference count per block: how many block tables hold it (a prefix shared by two requests,
    or the prompt of a request's n samples, is one block held twice);
  * a free list of the blocks nobody holds, oldest-freed first: a block is taken from the front,
    and a freed block goes to the back, so what it holds survives as long as possible;
  * the prefix cache: a full block of prompt tokens is kept under a hash chained over every token up
    to its end (its own and all the blocks' before it), so the same hash means the same prefix. A
    freed block keeps its hash until it is taken for something else: a later request with that
    prefix takes it back without computing it.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import mmap
from collections import OrderedDict
from dataclasses import dataclass

import torch

from kvlab.engine.config import MiniMindConfig
from kvlab.engine.kv_dtype import TORCH_DTYPES, check as check_kv_dtype


HUGE_PAGE = 2 << 20


def zeroed_memory(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A zero tensor. On a CPU (where the platform maps anonymous memory): over a private anonymous
    mapping, 2 MiB-aligned and marked MADV_HUGEPAGE where the platform has it, nothing written now;
    elsewhere torch.zeros."""
    if torch.device(device).type != "cpu" or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    nbytes = count * torch.empty(0, dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    mapped = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = -ctypes.addressof(ctypes.c_char.from_buffer(mapped)) % HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapped.madvise(mmap.MADV_HUGEPAGE, offset, nbytes - nbytes % mmap.PAGESIZE)
    return torch.frombuffer(mapped, dtype=dtype, count=count, offset=offset).view(shape)  # it keeps `mapped`


def chain_hash(parent: bytes | None, tokens: list[int]) -> bytes:
    """The hash of a full block: of the previous block's hash and this block's tokens."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(parent or b"")
    digest.update(b"".join(token.to_bytes(8, "little", signed=True) for token in tokens))
    return digest.digest()


def prefix_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """The chained hash of every full block of `tokens`."""
    hashes, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = chain_hash(parent, tokens[start:start + block_size])
        hashes.append(parent)
    return hashes


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set while the block is in the prefix cache
    tokens: tuple[int, ...] | None = None  # the tokens it holds, checked on a hit


class BlockPool:
    """The blocks' storage and bookkeeping (see the module's docstring)."""

    def __init__(self, config: MiniMindConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", kv_dtype: str = "float32"):
        # one block more than the pool lends: the scratch block, where padded rows of a compiled step write
        shape = (num_blocks + 1, block_size, config.num_key_value_heads, config.head_dim)
        # what the blocks store (kvlab.engine.kv_dtype): the model's values (`dtype`), or fewer bits; int8
        # with one float32 scale per token and KV head, in pools of their own
        storage = dtype if check_kv_dtype(kv_dtype) == "float32" else TORCH_DTYPES[kv_dtype]
        self.keys = [zeroed_memory(shape, storage, device) for _ in range(config.num_hidden_layers)]
        self.values = [zeroed_memory(shape, storage, device) for _ in range(config.num_hidden_layers)]
        self.scales: list[tuple[torch.Tensor, torch.Tensor] | None] = [
            (zeroed_memory((*shape[:3], 1), torch.float32, device), zeroed_memory((*shape[:3], 1), torch.float32, device))
            if kv_dtype == "int8" else None for _ in range(config.num_hidden_layers)]
        self.kv_dtype = kv_dtype
        self.scratch_block = num_blocks
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(index) for index in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[bytes, int] = {}  # hash -> block id

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        """Blocks some table holds."""
        return self.num_blocks - len(self.free)

    def nbytes(self) -> int:
        """Bytes of the blocks the pool lends (its scratch block aside), int8's scales included."""
        scales = [t for pair in self.scales if pair for t in pair]
        return sum(t[:self.num_blocks].numel() * t.element_size() for t in (*self.keys, *self.values, *scales))

    def allocate(self) -> int:
        """Take the free block freed longest ago (forgetting what it cached); its reference count is 1."""
        if not self.free:
            raise RuntimeError("no free block: the scheduler must check num_free first")
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            del self.cached[block.hash]
            block.hash, block.tokens = None, None
        block.ref_count = 1
        return block_id

    def hold(self, block_id: int) -> None:
        """One more table holds this block (taking it off the free list if nobody did)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        """One table fewer holds it; held by none, it goes to the back of the free list, keeping its hash."""
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {block_id} released more often than held")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[block_id] = None

    def lookup(self, block_hash: bytes, tokens: list[int]) -> int | None:
        """The block caching this hash (and these very tokens), or None."""
        block_id = self.cached.get(block_hash)
        if block_id is None or self.blocks[block_id].tokens != tuple(tokens):
            return None
        return block_id

    def register(self, block_id: int, block_hash: bytes, tokens: list[int]) -> None:
        """Put a full block in the prefix cache (a hash cached already keeps its first block)."""
        if block_hash in self.cached:
            return
        block = self.blocks[block_id]
        block.hash, block.tokens = block_hash, tuple(tokens)
        self.cached[block_hash] = block_id

    def copy(self, source: int, target: int) -> None:
        """Copy every layer's K and V of one block into another (a partial block given to a second row)."""
        for keys, values, scales in zip(self.keys, self.values, self.scales):
            for pool in (keys, values, *(scales or ())):
                pool[target] = pool[source]
