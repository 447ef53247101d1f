"""The scheduler: which requests feed what in the next forward step, at the level of single steps.

Three queues: `pending` (added, not arrived yet, by arrival), `waiting` (arrived, or preempted,
holding no blocks; a preempted request goes back to its front) and `running` (holding blocks, oldest
admitted first), as nano-vllm and vLLM keep the last two. Requests enter by `add` and leave by
`finish` or `abort`; nothing else edits the queues. Each step has a budget of
`max_num_batched_tokens` fed tokens:

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
samples: the prompt is fed once (one row, its blocks shared), and at its end the rows fork. Blocks
themselves are the block manager's (kvlab.serving.block_manager).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from kvlab.serving.block_manager import Admission, BlockManager
from kvlab.serving.config import ServingConfig
from kvlab.serving.request import Piece, Request, State


@dataclass
class Schedule:
    pieces: list[Piece] = field(default_factory=list)
    admitted: list[Admission] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, config: ServingConfig, blocks: BlockManager):
        self.config = config
        self.blocks = blocks
        self.pending: list[Request] = []  # by (arrival_s, arrival_step, id)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    @property
    def rows_running(self) -> int:
        return sum(request.n for request in self.running)

    def has_unfinished(self) -> bool:
        """Whether a request is still pending, waiting or running (each sits in exactly one of those)."""
        return bool(self.pending or self.waiting or self.running)

    # --- requests in and out -----------------------------------------------------------------------

    def add(self, request: Request) -> None:
        bisect.insort(self.pending, request, key=lambda r: (r.arrival_s or 0.0, r.arrival_step, r.request_id))

    def arrive(self, clock: int, elapsed_s: float) -> list[Request]:
        """Move every pending request that has arrived (by step `clock` or `elapsed_s` seconds after the
        first step) to the back of the waiting queue, in arrival order; returns them."""
        arrived, still = [], []
        for request in self.pending:
            due = request.arrival_s <= elapsed_s if request.arrival_s is not None else request.arrival_step <= clock
            (arrived if due else still).append(request)
        self.pending = still
        for request in arrived:
            request.state = State.WAITING
            self.waiting.append(request)
        return arrived

    def abort(self, request: Request) -> bool:
        """Take a request out of whatever queue holds it (a running one gives its blocks back); False if
        it had finished already."""
        if request.state is State.FINISHED:
            return False
        if request.state is State.PENDING:
            self.pending.remove(request)
        elif request.state is State.WAITING:
            self.waiting.remove(request)
        else:
            self.blocks.free(request)
            self.running.remove(request)
        request.state = State.FINISHED
        return True

    def finish(self, request: Request) -> None:
        self.blocks.free(request)
        request.state = State.FINISHED
        self.running.remove(request)

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
            start = request.num_computed
            if (request.n == 1 and start >= request.prompt_len and budget >= 1 and start + 1 == request.num_known
                    and self.blocks.append_position(request, start)):
                # one row decoding (most pieces): its piece and block in short; without a free block, below
                plan.pieces.append(Piece(request, start, 1, [0]))
                budget -= 1
                index += 1
                continue
            piece = self.next_piece(request, start, budget)
            if piece is None:  # not within what is left of the budget: next step
                index += 1
                continue
            while not self.blocks.can_append(piece):
                victim = self.running[-1]  # the newest
                self.preempt(victim)
                plan.preempted.append(victim)
                if victim is request:
                    break
            else:
                self.blocks.append(piece)
                plan.pieces.append(piece)
                budget -= piece.tokens
                index += 1
        return budget

    def admit_waiting(self, plan: Schedule, budget: int) -> None:
        """Admit from the front of the queue while the head fits; the first that does not stops it."""
        while self.waiting and budget > 0:
            request = self.waiting[0]
            if self.rows_running + request.n > self.config.max_num_seqs:
                return
            hits = self.blocks.cached_prefix(request)
            piece = self.next_piece(request, len(hits) * self.blocks.block_size, budget)
            admission = None if piece is None else self.blocks.allocate(piece, hits)
            if admission is None:
                return
            request.num_computed = piece.start
            request.state = State.RUNNING
            self.waiting.popleft()
            self.running.append(request)
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

    def preempt(self, request: Request) -> None:
        """Take every block back from a running request and queue it first to be computed again."""
        self.blocks.free(request)
        request.high_water = max(request.high_water, request.num_computed)
        request.num_computed = 0
        request.forked = request.n == 1
        request.preemptions += 1
        request.state = State.WAITING
        self.running.remove(request)
        self.waiting.appendleft(request)
