"""The scheduler: which requests feed what in the next forward step, at the level of single steps.

Two queues, as nano-vllm and vLLM keep them: `waiting` (arrived, or preempted, holding no blocks; a
preempted request goes back to its front) and `running` (holding blocks, oldest admitted first).
Each step has a budget of `max_num_batched_tokens` fed tokens:

  1. every running request, oldest first, gets its next piece: one token per row to decode, or the
     next chunk of a prefill. Its new positions need blocks; when none is free, the newest running
     request is preempted (it gives all its blocks back and will be computed again from its tokens)
     until one is, or until the request itself was the newest.
  2. then waiting requests, first come first served, are admitted while the budget, the slots
     (`max_num_seqs` rows) and the free blocks last: first the longest prefix of its prompt's full
     blocks found in the prefix cache, then blocks for what it computes this step. The first one
     that does not fit stops the admissions (no request overtakes another).

Under the "static" policy nothing is admitted while anything runs: a batch starts together and the
next waits for its longest row. A piece never crosses the end of the prompt for a request of n > 1
samples: the prompt is fed once (one row, its blocks shared), and at its end the rows fork.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from kvlab.serving.block_pool import BlockPool
from kvlab.serving.config import ServingConfig
from kvlab.serving.request import Request, State


@dataclass
class Piece:
    """What a request feeds in one step: `length` positions from `start` of each of `rows`
    (row 0 alone while its prompt is shared, all rows after)."""

    request: Request
    start: int
    length: int
    rows: list[int]

    @property
    def tokens(self) -> int:
        """What it costs of the step's budget."""
        return self.length * len(self.rows)

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def draws(self) -> bool:
        """Whether it reaches the last known token, so the step draws the next."""
        return self.end == self.request.num_known


@dataclass
class Admission:
    """A request admitted this step, and how much of its prompt the prefix cache gave it."""

    request: Request
    hit_blocks: int
    shared_hits: int  # of which some running request held already (memory saved, not only compute)


@dataclass
class Schedule:
    pieces: list[Piece] = field(default_factory=list)
    admitted: list[Admission] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: ServingConfig, pool: BlockPool):
        self.config = config
        self.pool = pool
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def rows_running(self) -> int:
        return sum(request.n for request in self.running)

    # --- the step --------------------------------------------------------------------------------

    def schedule(self) -> Schedule:
        """The next step's pieces: the running requests' first, then the admitted ones'."""
        plan = Schedule()
        may_admit = self.config.policy == "continuous" or not self.running
        budget = self.schedule_running(plan, self.config.max_num_batched_tokens)
        if may_admit:
            self.admit_waiting(plan, budget)
        return plan

    def schedule_running(self, plan: Schedule, budget: int) -> int:
        """Each running request's next piece, oldest first, preempting the newest for blocks. Returns the
        budget left."""
        index = 0
        while index < len(self.running):
            request = self.running[index]
            piece = self.next_piece(request, request.num_computed, budget)
            if piece is None:  # not within what is left of the budget: next step
                index += 1
                continue
            while not self.reserve(piece):
                victim = self.running[-1]
                self.preempt(victim)
                plan.preempted.append(victim)
                if victim is request:
                    break
            else:
                plan.pieces.append(piece)
                budget -= piece.tokens
                index += 1
        return budget

    def admit_waiting(self, plan: Schedule, budget: int) -> None:
        """Admit from the front of the queue while the head fits; the first that does not stops it."""
        while self.waiting and budget > 0:
            admission, piece = self.try_admit(self.waiting[0], budget)
            if admission is None:
                return
            self.waiting.popleft()
            self.running.append(admission.request)
            plan.admitted.append(admission)
            plan.pieces.append(piece)
            budget -= piece.tokens

    def next_piece(self, request: Request, start: int, budget: int) -> Piece | None:
        """The request's next piece from position `start` within `budget` tokens, or None if none fits.
        Prompt positions go whole in one piece unless chunked prefill is on; new tokens being computed
        again after a preemption go as many as fit; decoding is one position per row."""
        prompt_len, known = request.prompt_len, request.num_known
        if start < prompt_len:
            left = prompt_len - start
            length = min(left, budget) if self.config.chunked_prefill else (left if left <= budget else 0)
            if length == left and request.n == 1:
                length += min(known - prompt_len, budget - length)  # one row: on past the prompt
            rows = [0]
        else:
            rows = list(range(request.n))
            length = min(known - start, budget // request.n)
        return Piece(request, start, length, rows) if length > 0 else None

    # --- blocks ----------------------------------------------------------------------------------

    def fork_copies(self, piece: Piece) -> int:
        """Blocks the rows of n > 1 need when this piece ends their shared prompt inside a block: a copy
        of that partial block for every row but row 0, to write its own tokens after."""
        request = piece.request
        ends_prompt = not request.forked and piece.end == request.prompt_len
        return request.n - 1 if ends_prompt and request.prompt_len % self.pool.block_size else 0

    def blocks_needed(self, piece: Piece) -> int:
        """New blocks a piece needs: those its positions reach past each row's table, and its fork copies."""
        request, size = piece.request, self.pool.block_size
        reach = -(-piece.end // size)
        return sum(max(0, reach - len(request.rows[row].block_table)) for row in piece.rows) + self.fork_copies(piece)

    def reserve(self, piece: Piece) -> bool:
        """Allocate the blocks a piece needs, if that many are free (the fork copies go to the other
        rows' tables, which the engine completes when the prompt is done)."""
        if self.blocks_needed(piece) > self.pool.num_free:
            return False
        request, size = piece.request, self.pool.block_size
        copies = self.fork_copies(piece)
        for row in piece.rows:
            table = request.rows[row].block_table
            while len(table) * size < piece.end:
                table.append(self.pool.allocate())
        for row in request.rows[1:1 + copies]:
            row.block_table.append(self.pool.allocate())
        return True

    def cached_prefix(self, request: Request) -> list[int]:
        """The blocks of the longest run of the prompt's full blocks found in the prefix cache, never the
        block of the prompt's last token (its logits must be computed: a prompt wholly cached still
        computes that block's positions)."""
        if not self.config.prefix_caching:
            return []
        size = self.pool.block_size
        usable = (request.prompt_len - 1) // size
        found = []
        for index, block_hash in enumerate(request.block_hashes[:usable]):
            block_id = self.pool.lookup(block_hash, request.prompt[index * size:(index + 1) * size])
            if block_id is None:
                break
            found.append(block_id)
        return found

    def try_admit(self, request: Request, budget: int) -> tuple[Admission | None, Piece | None]:
        """Admit the head of the queue if its rows, its first piece and that piece's blocks fit."""
        if self.rows_running + request.n > self.config.max_num_seqs:
            return None, None
        hits = self.cached_prefix(request)
        start = len(hits) * self.pool.block_size
        piece = self.next_piece(request, start, budget)
        if piece is None:
            return None, None
        idle_hits = sum(self.pool.blocks[block_id].ref_count == 0 for block_id in hits)
        request.rows[0].block_table = list(hits)  # held below, once the rest is known to fit
        if self.blocks_needed(piece) + idle_hits > self.pool.num_free:
            request.rows[0].block_table = []
            return None, None
        for block_id in hits:
            self.pool.hold(block_id)
        request.num_computed = start
        self.reserve(piece)
        request.state = State.RUNNING
        return Admission(request, len(hits), len(hits) - idle_hits), piece

    def preempt(self, request: Request) -> None:
        """Take every block back from a running request and queue it first to be computed again."""
        self.free(request)
        request.high_water = max(request.high_water, request.num_computed)
        request.num_computed = 0
        request.forked = request.n == 1
        request.preemptions += 1
        request.state = State.WAITING
        self.running.remove(request)
        self.waiting.appendleft(request)

    def free(self, request: Request) -> None:
        """Release every block of every row's table (a shared block once per table that holds it)."""
        for row in request.rows:
            for block_id in row.block_table:
                self.pool.release(block_id)
            row.block_table = []

    def finish(self, request: Request) -> None:
        self.free(request)
        request.state = State.FINISHED
        self.running.remove(request)
