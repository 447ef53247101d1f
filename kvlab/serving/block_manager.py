"""The block manager: every block a request holds, in the request's own verbs, as nano-vllm's
`BlockManager` speaks them. The scheduler asks it whether a request fits and tells it what runs; the
engine tells it what a step computed. Beneath it, kvlab.serving.block_pool keeps the blocks
themselves (storage, reference counts, the free list, the prefix hashes).

  allocate(request, piece)   admit: the prompt's cached prefix held, blocks for the first piece
  append(piece)              blocks for a running request's next piece (and the fork's copies)
  append_position(r, p)      the same for one row decoding, in short (False when no block is free)
  free(request)              every block back (finished, aborted, or preempted)
  cache_full_blocks(piece)   the prompt blocks a piece filled enter the prefix cache
  fork(request)              at the end of a shared prompt, each of n > 1 rows gets its own table

A request's rows each have a block table (their blocks in position order). A request of n > 1
samples feeds its prompt once, in row 0's blocks; at the prompt's end every other row holds the full
prompt blocks too and gets a copy of the last, partial one (allocated with the piece that ends the
prompt) to write its own tokens after.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.serving.block_pool import BlockPool
from kvlab.serving.request import Piece, Request


@dataclass
class Admission:
    """A request admitted this step, and how much of its prompt the prefix cache gave it."""

    request: Request
    hit_blocks: int
    shared_hits: int  # of which some running request held already (memory saved, not only compute)


class BlockManager:
    def __init__(self, pool: BlockPool, prefix_caching: bool):
        self.pool = pool
        self.block_size = pool.block_size
        self.prefix_caching = prefix_caching

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    # --- what a piece needs ------------------------------------------------------------------------

    def fork_copies(self, piece: Piece) -> int:
        """Blocks the rows of n > 1 need when this piece ends their shared prompt inside a block: a copy
        of that partial block for every row but row 0, to write its own tokens after."""
        request = piece.request
        ends_prompt = not request.forked and piece.end == request.prompt_len
        return request.n - 1 if ends_prompt and request.prompt_len % self.block_size else 0

    def blocks_needed(self, piece: Piece) -> int:
        """New blocks a piece needs: those its positions reach past each row's table, and its fork copies."""
        request = piece.request
        reach = -(-piece.end // self.block_size)
        if request.forked and len(piece.rows) == 1:  # most pieces: one row of its own, no fork ahead
            return max(0, reach - len(request.rows[piece.rows[0]].block_table))
        return (sum(max(0, reach - len(request.rows[row].block_table)) for row in piece.rows)
                + self.fork_copies(piece))

    def can_append(self, piece: Piece) -> bool:
        return self.blocks_needed(piece) <= self.pool.num_free

    def append(self, piece: Piece) -> None:
        """Allocate the blocks a piece needs (`can_append` first); the fork's copies go to the other rows'
        tables, which `fork` completes when the prompt is done."""
        request = piece.request
        copies = self.fork_copies(piece)
        for row in piece.rows:
            table = request.rows[row].block_table
            while len(table) * self.block_size < piece.end:
                table.append(self.pool.allocate())
        for row in request.rows[1:1 + copies]:
            row.block_table.append(self.pool.allocate())

    def append_position(self, request: Request, position: int) -> bool:
        """`append` for one row decoding (a request of one sample past its prompt, feeding `position`),
        in short: its block, allocated if the position begins one. False, with nothing allocated, when
        it needs a block and none is free."""
        table = request.rows[0].block_table
        if len(table) * self.block_size > position:
            return True
        if not self.pool.num_free:
            return False
        table.append(self.pool.allocate())
        return True

    # --- admission -----------------------------------------------------------------------------------

    def cached_prefix(self, request: Request) -> list[int]:
        """The blocks of the longest run of the prompt's full blocks found in the prefix cache, never the
        block of the prompt's last token (its logits must be computed: a prompt wholly cached still
        computes that block's positions)."""
        if not self.prefix_caching:
            return []
        size = self.block_size
        usable = (request.prompt_len - 1) // size
        found = []
        for index, block_hash in enumerate(request.block_hashes[:usable]):
            block_id = self.pool.lookup(block_hash, request.prompt[index * size:(index + 1) * size])
            if block_id is None:
                break
            found.append(block_id)
        return found

    def allocate(self, piece: Piece, hits: list[int]) -> Admission | None:
        """Admit `piece.request` (its first piece starting after the cached prefix `hits`), if the hits
        that nobody holds and the piece's blocks fit the free list; else leave everything as it was."""
        request = piece.request
        idle_hits = sum(self.pool.blocks[block_id].ref_count == 0 for block_id in hits)
        request.rows[0].block_table = list(hits)  # held below, once the rest is known to fit
        if self.blocks_needed(piece) + idle_hits > self.pool.num_free:
            request.rows[0].block_table = []
            return None
        for block_id in hits:
            self.pool.hold(block_id)
        self.append(piece)
        return Admission(request, len(hits), len(hits) - idle_hits)

    def free(self, request: Request) -> None:
        """Release every block of every row's table (a shared block once per table that holds it)."""
        for row in request.rows:
            for block_id in row.block_table:
                self.pool.release(block_id)
            row.block_table = []

    # --- after a step ----------------------------------------------------------------------------------

    def cache_full_blocks(self, piece: Piece) -> None:
        """Every prompt block this piece filled goes into the prefix cache under its chained hash."""
        if not self.prefix_caching:
            return
        request, size = piece.request, self.block_size
        table = request.rows[0].block_table
        for index in range(piece.start // size, min(piece.end, request.prompt_len) // size):
            self.pool.register(table[index], request.block_hashes[index], request.prompt[index * size:(index + 1) * size])

    def fork(self, request: Request) -> int:
        """Every row but row 0 holds the prompt's full blocks and gets the copy of its partial one that
        `append` allocated; returns the blocks shared (table entries served by a block held already)."""
        full = request.prompt_len // self.block_size
        source = request.rows[0].block_table
        for row in request.rows[1:]:
            own = row.block_table  # the partial block's copy, if the prompt ends inside a block
            for block_id in source[:full]:
                self.pool.hold(block_id)
            if own:
                self.pool.copy(source[full], own[0])
            row.block_table = source[:full] + own
        request.forked = True
        return (request.n - 1) * full
