"""The serving engine: requests arrive, are scheduled step by step, fed through the paged cache and
answered, each as `generate` would answer it alone.

    engine = ServingEngine(model, ServingConfig(num_blocks=64))
    engine.add_request(prompt_ids, SamplingParams(max_tokens=32, seed=0), arrival_step=3)
    result = engine.run()    # result.outputs[i].samples, result.stats.summary()

One `step`: let in the requests that have arrived, ask the scheduler for the step's pieces (it may
admit and preempt), feed them in one forward pass (kvlab.serving.runner), then for each piece: its
positions are cached, full prompt blocks enter the prefix cache, a prompt of n > 1 rows forks, and a
piece that reached its last known token draws the next one per row (kvlab.engine.sampling, with the
request's own generator). A request whose rows all drew eos, or that has max_tokens, gives its blocks
back at once; so does one aborted (`abort`: a server's client that left). A server, which never calls
`run`, `forget`s each finished request so its record does not pile up.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvlab.engine import sampling
from kvlab.engine.model import MiniMindForCausalLM
from kvlab.serving.block_pool import BlockPool, prefix_hashes
from kvlab.serving.config import ServingConfig
from kvlab.serving.request import Request, RequestOutput, SamplingParams, State
from kvlab.serving.runner import Chunk, ModelRunner
from kvlab.serving.scheduler import Piece, Schedule, Scheduler
from kvlab.serving.stats import EngineStats, StepRecord


@dataclass
class ServeResult:
    outputs: list[RequestOutput]  # in the order the requests were added
    stats: EngineStats


class ServingEngine:
    """`on_draw(request_id, logits)`, if given, sees the logits (rows, V) of every draw before it (a lab
    can hold them against `generate`'s bit for bit)."""

    def __init__(self, model: MiniMindForCausalLM, config: ServingConfig | None = None,
                 on_draw: Callable[[int, torch.Tensor], None] | None = None):
        self.config = config or ServingConfig()
        self.on_draw = on_draw
        self.config.check_model(model.config.max_position_embeddings)
        self.model = model
        weight = model.lm_head.weight
        self.pool = BlockPool(model.config, self.config.num_blocks, self.config.block_size, weight.dtype,
                              weight.device)
        self.scheduler = Scheduler(self.config, self.pool)
        self.runner = ModelRunner(model, self.pool, self.config.matmuls)
        self.stats = EngineStats(self.config.max_num_seqs, self.config.num_blocks)
        self.requests: list[Request | None] = []  # by id; None once forgotten
        self.pending: list[Request] = []  # not arrived yet, by arrival
        self.clock = 0  # the step index: one per forward step, and one per tick spent waiting for an arrival
        self.started: float | None = None  # perf_counter of the first step; arrival_s counts from it

    # --- requests --------------------------------------------------------------------------------

    def add_request(self, prompt: list[int], params: SamplingParams | None = None, *, arrival_step: int = 0,
                    arrival_s: float | None = None) -> int:
        """Queue a request to arrive at clock step `arrival_step`, or `arrival_s` seconds after the first
        step (then the step is not looked at). Returns its id (its index in the outputs)."""
        params = params or SamplingParams()
        self.check_request(list(prompt), params)
        request = Request(len(self.requests), prompt, params, arrival_step, arrival_s, self.model.lm_head.weight.device)
        request.block_hashes = prefix_hashes(request.prompt, self.config.block_size)
        self.requests.append(request)
        bisect.insort(self.pending, request, key=lambda r: (r.arrival_s or 0.0, r.arrival_step, r.request_id))
        return request.request_id

    def check_request(self, prompt: list[int], params: SamplingParams) -> None:
        """Refuse, before any work, a request the engine could never serve, naming the knob."""
        config, vocab = self.config, self.model.config.vocab_size
        if not prompt:
            raise ValueError("prompt: a request needs at least one token")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt: token ids must lie in 0 .. {vocab - 1} (the model's vocab_size)")
        self.model.check_room(len(prompt), params.max_tokens)
        size, most = config.block_size, len(prompt) + params.max_tokens - 1
        shared = len(prompt) // size if params.n > 1 else 0
        needed = shared + params.n * (-(-most // size) - shared)
        if needed > config.num_blocks:
            raise ValueError(
                f"ServingConfig.num_blocks ({config.num_blocks}) is too small: this request needs up to {needed} "
                f"blocks of {size} tokens ({len(prompt)}-token prompt + max_tokens {params.max_tokens}, n={params.n})")
        if params.n > config.max_num_seqs:
            raise ValueError(f"ServingConfig.max_num_seqs ({config.max_num_seqs}) is smaller than this request's "
                             f"n ({params.n}): its rows run together")
        if params.n > config.max_num_batched_tokens:
            raise ValueError(f"ServingConfig.max_num_batched_tokens ({config.max_num_batched_tokens}) fits nothing: "
                             f"decoding this request feeds n = {params.n} tokens a step")
        if not config.chunked_prefill and len(prompt) > config.max_num_batched_tokens:
            raise ValueError(f"ServingConfig.max_num_batched_tokens ({config.max_num_batched_tokens}) fits nothing: "
                             f"a {len(prompt)}-token prompt is fed in one step without chunked_prefill")

    def has_unfinished(self) -> bool:
        """Whether a request is still pending, waiting or running (each sits in exactly one of those)."""
        return bool(self.pending or self.scheduler.waiting or self.scheduler.running)

    def abort(self, request_id: int) -> RequestOutput | None:
        """Stop a request wherever it stands (a client that left): a running one gives its blocks back at
        once. Returns its output (the tokens drawn so far, each unfinished row's reason "abort"), or None
        if it had finished already."""
        request = self.requests[request_id]
        if request is None or request.state is State.FINISHED:
            return None
        if request.state is State.PENDING:
            self.pending.remove(request)
        elif request.state is State.WAITING:
            self.scheduler.waiting.remove(request)
        else:
            self.scheduler.free(request)
            self.scheduler.running.remove(request)
        request.state = State.FINISHED
        request.aborted = True
        request.record("abort", self.clock)
        return request.output()

    def forget(self, request_id: int) -> None:
        """Drop a finished request's record, its tokens and events (a server's, which serves for ever and
        never calls `run`; `run`'s outputs leave it out)."""
        if self.requests[request_id] is not None and self.requests[request_id].state is not State.FINISHED:
            raise ValueError(f"request {request_id} is not finished: abort it first")
        self.requests[request_id] = None

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> ServeResult:
        """Step until every request added is finished."""
        begun = time.perf_counter()
        while self.has_unfinished():
            self.step()
        self.stats.wall_s += time.perf_counter() - begun
        return ServeResult([request.output() for request in self.requests if request is not None], self.stats)

    def step(self) -> list[RequestOutput]:
        """One tick of the clock: a forward step, or a wait for the next arrival. Returns the requests it finished."""
        if self.started is None:
            self.started = time.perf_counter()
        self.let_in_arrivals()
        plan = self.scheduler.schedule()
        if not plan.pieces:
            self.wait_for_arrival()
            return []
        self.note_schedule(plan)
        blocks_in_use = self.pool.num_used
        useful_slots = sum(piece.request.unfinished_rows for piece in plan.pieces if piece.draws)
        logits = self.runner.forward([self.chunk(piece) for piece in plan.pieces])
        fed = {"prefill": 0, "decode": 0}
        finished = []
        for piece, piece_logits in zip(plan.pieces, logits):
            self.count_fed(piece, fed)
            if self.advance(piece, piece_logits):
                finished.append(piece.request.output())
        self.stats.steps.append(StepRecord(self.clock, time.perf_counter(), fed["prefill"], fed["decode"], useful_slots,
                                           blocks_in_use, len(self.scheduler.running), len(self.scheduler.waiting)))
        self.clock += 1
        return finished

    def let_in_arrivals(self) -> None:
        """Move every request that has arrived from pending to the back of the waiting queue."""
        now = time.perf_counter()
        elapsed = now - self.started
        still = []
        for request in self.pending:
            if request.arrival_s is not None:
                arrived = request.arrival_s <= elapsed
            else:
                arrived = request.arrival_step <= self.clock
            if not arrived:
                still.append(request)
                continue
            request.state = State.WAITING
            at = self.started + request.arrival_s if request.arrival_s is not None else now
            request.record("arrival", self.clock, at=at)
            self.scheduler.waiting.append(request)
        self.pending = still

    def wait_for_arrival(self) -> None:
        """Nothing can run: move the clock to the next arrival (sleeping until it, for one in seconds)."""
        if self.scheduler.running or self.scheduler.waiting or not self.pending:
            raise RuntimeError("the scheduler found nothing to run although requests wait (a bug)")
        upcoming = self.pending[0]
        if upcoming.arrival_s is not None:
            time.sleep(max(0.0, self.started + upcoming.arrival_s - time.perf_counter()))
            ticks = 1
        else:
            ticks = max(1, upcoming.arrival_step - self.clock)
        self.stats.idle_steps += ticks
        self.clock += ticks

    def note_schedule(self, plan: Schedule) -> None:
        """Events and counters of the step's admissions and preemptions."""
        size = self.config.block_size
        for admission in plan.admitted:
            request = admission.request
            request.record("admission", self.clock)
            request.cached_tokens += admission.hit_blocks * size
            self.stats.prefix_hit_blocks += admission.hit_blocks
            self.stats.prefix_hit_tokens += admission.hit_blocks * size
            self.stats.blocks_saved_by_sharing += admission.shared_hits
        for request in plan.preempted:
            request.record("preemption", self.clock)
            self.stats.preemptions += 1

    # --- one piece -------------------------------------------------------------------------------

    def chunk(self, piece: Piece) -> Chunk:
        request = piece.request
        ids = torch.tensor([request.token_ids(row, piece.start, piece.end) for row in piece.rows],
                           device=self.model.lm_head.weight.device)
        tables = [request.rows[row].block_table for row in piece.rows]
        return Chunk(ids, piece.start, tables, wants_logits=piece.draws)

    def count_fed(self, piece: Piece, fed: dict) -> None:
        """Split a piece's positions: prompt or computed again (prefill), new (decode); count the recomputed."""
        request, rows = piece.request, len(piece.rows)
        again = max(0, min(piece.end, request.high_water) - piece.start)
        prefill_end = max(request.prompt_len, request.high_water)
        prefill = max(0, min(piece.end, prefill_end) - piece.start)
        fed["prefill"] += prefill * rows
        fed["decode"] += (piece.length - prefill) * rows
        request.recomputed_tokens += again * rows
        self.stats.recomputed_tokens += again * rows

    def advance(self, piece: Piece, logits: torch.Tensor | None) -> bool:
        """After the forward: the piece's positions are cached; returns whether the request finished."""
        request = piece.request
        request.num_computed = piece.end
        if self.config.prefix_caching:
            self.register_full_prompt_blocks(piece)
        if not request.forked and request.num_computed == request.prompt_len:
            self.fork(request)
        if not piece.draws:
            return False
        self.draw(request, logits)
        if all(row.finished for row in request.rows) or request.num_new == request.params.max_tokens:
            self.scheduler.finish(request)
            request.record("finish", self.clock)
            return True
        return False

    def register_full_prompt_blocks(self, piece: Piece) -> None:
        """Every prompt block this piece filled goes into the prefix cache under its chained hash."""
        request, size = piece.request, self.config.block_size
        table = request.rows[0].block_table
        for index in range(piece.start // size, min(piece.end, request.prompt_len) // size):
            request_tokens = request.prompt[index * size:(index + 1) * size]
            self.pool.register(table[index], request.block_hashes[index], request_tokens)

    def fork(self, request: Request) -> None:
        """The prompt of n > 1 rows is cached in row 0's blocks: every other row holds its full blocks too,
        and gets a copy of its last, partial one (allocated by the scheduler) to write its own tokens after."""
        size = self.config.block_size
        full = request.prompt_len // size
        source = request.rows[0].block_table
        for row in request.rows[1:]:
            own = row.block_table  # the partial block's copy, if the prompt ends inside a block
            for block_id in source[:full]:
                self.pool.hold(block_id)
            if own:
                self.pool.copy(source[full], own[0])
            row.block_table = source[:full] + own
        self.stats.blocks_saved_by_sharing += (request.n - 1) * full
        request.forked = True

    def draw(self, request: Request, logits: torch.Tensor) -> None:
        """Every row's next token, drawn together in one call as `generate` draws its rows; a row that
        finished gets eos again."""
        params = request.params
        if logits.shape[0] != request.n:
            logits = logits.repeat(request.n, 1)  # the shared prompt's last position serves every row
        if self.on_draw is not None:
            self.on_draw(request.request_id, logits)
        seen = torch.tensor([request.prompt + row.new_tokens for row in request.rows], device=logits.device)
        tokens = sampling.next_token(logits, seen, **params.knobs(), generator=request.generator)[:, 0].tolist()
        drawn = []
        for row, token in zip(request.rows, tokens):
            if row.finished:
                token = params.eos_token_id
            row.new_tokens.append(token)
            row.finished = row.finished or (params.eos_token_id is not None and token == params.eos_token_id)
            drawn.append(token)
        request.record("first_token" if request.num_new == 1 else "token", self.clock, tuple(drawn))
