"""The serving engine: requests arrive, are scheduled step by step, fed through the paged cache and
answered, each as `generate` would answer it alone.

    engine = ServingEngine(model, ServingConfig(num_blocks=1024, max_num_seqs=64))
    engine.add_request(prompt_ids, SamplingParams(max_tokens=32, seed=0), arrival_step=3)
    result = engine.run()    # result.outputs[i].samples, result.stats.summary()

One `step`: the requests that have arrived join the waiting queue, the scheduler picks the step's
pieces (it may admit and preempt), the runner feeds them in one forward pass (kvlab.serving.runner:
the decode rows in one compiled step), then each piece's positions are cached, full prompt blocks
enter the prefix cache, a prompt of n > 1 rows forks, and a piece that reached its last known token
draws the next one per row (kvlab.engine.sampling; the plain greedy requests in one call, other
greedy requests of the same knobs in one call, a sampled one with its own generator). A request whose
rows all drew eos, or that has max_tokens, gives its blocks back at once; so does one aborted
(`abort`: a server's client that left).

`step` returns what it did (`StepOutput`): per request touched, whether it was admitted, the tokens
each row's answer gained, and its output once finished, beside the step's record (its counts and
seconds). A server forwards exactly that, and `forget`s each finished request so its record does not
pile up. `warm_up` compiles the decode step before the first request, as a server does at start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvlab.engine import sampling
from kvlab.engine.model import MiniMindForCausalLM
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.block_pool import BlockPool, prefix_hashes
from kvlab.serving.config import ServingConfig
from kvlab.serving.request import Request, RequestOutput, SamplingParams, State
from kvlab.serving.runner import PieceInput, ModelRunner
from kvlab.serving.request import Piece
from kvlab.serving.scheduler import Schedule, Scheduler
from kvlab.serving.stats import EngineStats, StepRecord


@dataclass
class ServeResult:
    outputs: list[RequestOutput]  # in the order the requests were added
    stats: EngineStats


@dataclass
class RequestUpdate:
    """What one step did to one request: admitted it, added `tokens` to each row's answer (per row;
    () for a row that had ended), preempted it, or finished it (`output`)."""

    request_id: int
    admitted: bool = False
    tokens: tuple[tuple[int, ...], ...] | None = None
    preempted: bool = False
    output: RequestOutput | None = None


@dataclass
class StepOutput:
    """What one `step` did: an update per request touched, in the order they were touched, and the
    step's record (None when the step only waited for an arrival)."""

    updates: list[RequestUpdate] = field(default_factory=list)
    record: StepRecord | None = None

    @property
    def finished(self) -> list[RequestOutput]:
        return [update.output for update in self.updates if update.output is not None]


class ServingEngine:
    """`on_draw(request_id, logits)`, if given, sees the logits (rows, V) of every draw before it (a lab
    can hold them against `generate`'s); `on_schedule(engine, plan)` sees every step's plan before its
    forward pass (what a lab records of the cache then), its time left out of the step's."""

    def __init__(self, model: MiniMindForCausalLM, config: ServingConfig | None = None,
                 on_draw: Callable[[int, torch.Tensor], None] | None = None,
                 on_schedule: Callable[["ServingEngine", Schedule], None] | None = None):
        self.config = config or ServingConfig()
        self.on_draw = on_draw
        self.on_schedule = on_schedule
        self.config.check_model(model.config.max_position_embeddings)
        self.model = model
        weight = model.lm_head.weight
        self.device = weight.device
        self.pool = BlockPool(model.config, self.config.num_blocks, self.config.block_size, weight.dtype, weight.device,
                              self.config.kv_dtype)
        self.blocks = BlockManager(self.pool, self.config.prefix_caching)
        self.scheduler = Scheduler(self.config, self.blocks)
        self.runner = ModelRunner(model, self.pool, self.config.matmuls, self.config.compile)
        self.stats = EngineStats(self.config.max_num_seqs, self.config.num_blocks, self.config.step_records)
        self.requests: list[Request | None] = []  # by id; None once forgotten
        self.clock = 0  # the step index: one per forward step, and one per tick spent waiting for an arrival
        self.started: float | None = None  # perf_counter of the first step; arrival_s counts from it

    # --- requests --------------------------------------------------------------------------------

    def add_request(self, prompt: list[int], params: SamplingParams | None = None, *, arrival_step: int = 0,
                    arrival_s: float | None = None) -> int:
        """Queue a request to arrive at clock step `arrival_step`, or `arrival_s` seconds after the first
        step (then the step is not looked at). Returns its id (its index in the outputs)."""
        params = params or SamplingParams()
        self.check_request(list(prompt), params)
        request = Request(len(self.requests), prompt, params, arrival_step, arrival_s, self.device)
        request.block_hashes = prefix_hashes(request.prompt, self.config.block_size)
        self.requests.append(request)
        self.scheduler.add(request)
        return request.request_id

    def check_request(self, prompt: list[int], params: SamplingParams) -> None:
        """Refuse, before any work, a request the engine could never serve, naming the knob."""
        config, vocab = self.config, self.model.config.vocab_size
        if not prompt:
            raise ValueError("prompt: a request needs at least one token")
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt: token ids must lie in 0 .. {vocab - 1} (the model's vocab_size)")
        self.model.check_room(len(prompt), params.max_tokens)
        config.check_request(len(prompt), params.max_tokens, params.n)

    def has_unfinished(self) -> bool:
        """Whether a request is still pending, waiting or running."""
        return self.scheduler.has_unfinished()

    def abort(self, request_id: int) -> RequestOutput | None:
        """Stop a request wherever it stands (a client that left): a running one gives its blocks back at
        once. Returns its output (the tokens drawn so far, each unfinished row's reason "abort"), or None
        if it had finished already."""
        request = self.requests[request_id]
        if request is None or not self.scheduler.abort(request):
            return None
        request.aborted = True
        request.record("abort", self.clock)
        return request.output()

    def forget(self, request_id: int) -> None:
        """Drop a finished request's record, its tokens and events (a server's, which serves for ever and
        never calls `run`; `run`'s outputs leave it out)."""
        if self.requests[request_id] is not None and self.requests[request_id].state is not State.FINISHED:
            raise ValueError(f"request {request_id} is not finished: abort it first")
        self.requests[request_id] = None

    @property
    def compiled(self) -> bool:
        """Whether its steps run compiled (`compile` asked for, and a C++ compiler found)."""
        return self.runner.compiled is not None and self.runner.compiled.compiled

    def warm_up(self) -> float:
        """Compile the step now (a throwaway step on the scratch block), not at the first request's first
        token, as a server does before it serves. Returns the seconds compiling took (0 when it was
        compiled already, or the engine runs eagerly)."""
        step = self.runner.compiled
        if step is None:
            return 0.0
        scratch = self.pool.scratch_block
        step([([0, 0], 0, [scratch], True)])
        return step.compile_s

    # --- the loop --------------------------------------------------------------------------------

    def run(self) -> ServeResult:
        """Step until every request added is finished."""
        begun = time.perf_counter()
        while self.has_unfinished():
            self.step()
        self.stats.wall_s += time.perf_counter() - begun
        return ServeResult([request.output() for request in self.requests if request is not None], self.stats)

    def step(self) -> StepOutput:
        """One tick of the clock: a forward step, or a wait for the next arrival."""
        began, began_cpu = time.perf_counter(), time.thread_time()
        if self.started is None:
            self.started = began
        self.let_in_arrivals()
        plan = self.scheduler.schedule()
        if not plan.pieces:
            self.wait_for_arrival()
            return StepOutput()
        scheduled = time.perf_counter()
        hook_s = self.call_hook(plan)
        updates: dict[int, RequestUpdate] = {}
        self.note_schedule(plan, updates)
        blocks_in_use = self.pool.num_used
        inputs, drawing, offset, useful_slots = [], [], 0, 0
        for piece in plan.pieces:  # whether each draws: known before the draws move each request's end
            request = piece.request
            drew = piece.draws
            inputs.append(self.piece_input(piece, drew))
            if drew:
                useful_slots += request.unfinished_rows
                drawing.append((request, list(range(offset, offset + len(piece.rows)))))
                offset += len(piece.rows)
        forward_began = time.perf_counter()
        logits, picks = self.runner.forward(inputs)
        forward_s = time.perf_counter() - forward_began
        fed = {"prefill": 0, "decode": 0}
        for piece in plan.pieces:
            self.count_fed(piece, fed)
            self.mark_computed(piece)
        self.draw(logits, picks, drawing, updates)
        for request, _ in drawing:
            if not request.unfinished_rows or request.num_new == request.params.max_tokens:
                self.scheduler.finish(request)
                request.record("finish", self.clock)
                updates[request.request_id].output = request.output()
        ended = time.perf_counter()
        record = StepRecord(self.clock, ended, fed["prefill"], fed["decode"], useful_slots, blocks_in_use,
                            len(self.scheduler.running), len(self.scheduler.waiting), schedule_s=scheduled - began,
                            forward_s=forward_s, step_s=ended - began - hook_s,
                            cpu_s=time.thread_time() - began_cpu - hook_s)
        self.stats.record(record)
        self.clock += 1
        return StepOutput(list(updates.values()), record)

    def call_hook(self, plan: Schedule) -> float:
        """Run `on_schedule` on the plan; its seconds (taken off the step's)."""
        if self.on_schedule is None:
            return 0.0
        began = time.perf_counter()
        self.on_schedule(self, plan)
        return time.perf_counter() - began

    def let_in_arrivals(self) -> None:
        """The requests that have arrived join the waiting queue, each with its arrival event."""
        now = time.perf_counter()
        for request in self.scheduler.arrive(self.clock, now - self.started):
            at = self.started + request.arrival_s if request.arrival_s is not None else now
            request.record("arrival", self.clock, at=at)

    def wait_for_arrival(self) -> None:
        """Nothing can run: move the clock to the next arrival (sleeping until it, for one in seconds)."""
        scheduler = self.scheduler
        if scheduler.running or scheduler.waiting or not scheduler.pending:
            raise RuntimeError("the scheduler found nothing to run although requests wait (a bug)")
        upcoming = scheduler.pending[0]
        if upcoming.arrival_s is not None:
            time.sleep(max(0.0, self.started + upcoming.arrival_s - time.perf_counter()))
            ticks = 1
        else:
            ticks = max(1, upcoming.arrival_step - self.clock)
        self.stats.idle_steps += ticks
        self.clock += ticks

    def note_schedule(self, plan: Schedule, updates: dict[int, RequestUpdate]) -> None:
        """Events, counters and updates of the step's admissions and preemptions."""
        size = self.config.block_size
        for request in plan.preempted:
            request.record("preemption", self.clock)
            self.stats.preemptions += 1
            self.update(updates, request).preempted = True
        for admission in plan.admitted:
            request = admission.request
            request.record("admission", self.clock)
            request.cached_tokens += admission.hit_blocks * size
            self.stats.prefix_hit_blocks += admission.hit_blocks
            self.stats.prefix_hit_tokens += admission.hit_blocks * size
            self.stats.blocks_saved_by_sharing += admission.shared_hits
            self.update(updates, request).admitted = True

    @staticmethod
    def update(updates: dict[int, RequestUpdate], request: Request) -> RequestUpdate:
        if request.request_id not in updates:
            updates[request.request_id] = RequestUpdate(request.request_id)
        return updates[request.request_id]

    # --- one piece -------------------------------------------------------------------------------

    def piece_input(self, piece: Piece, draws: bool) -> PieceInput:
        """What the piece feeds; a plain greedy request's temperature goes with it (the compiled step's pick)."""
        request, start = piece.request, piece.start
        params = request.params
        temperature = params.temperature if draws and params.is_greedy else 1.0
        if piece.rows == [0]:  # one row (most pieces): without the comprehensions
            return PieceInput([request.token_ids(0, start, piece.end)], start, [request.rows[0].block_table],
                              draws, temperature)
        ids = [request.token_ids(row, start, piece.end) for row in piece.rows]
        tables = [request.rows[row].block_table for row in piece.rows]
        return PieceInput(ids, start, tables, draws, temperature)

    def count_fed(self, piece: Piece, fed: dict) -> None:
        """Split a piece's positions: prompt or computed again (prefill), new (decode); count the recomputed."""
        request = piece.request
        if piece.start >= request.prompt_len and piece.start >= request.high_water:  # decoding: all new
            fed["decode"] += piece.tokens
            return
        rows = len(piece.rows)
        again = max(0, min(piece.end, request.high_water) - piece.start)
        prefill_end = max(request.prompt_len, request.high_water)
        prefill = max(0, min(piece.end, prefill_end) - piece.start)
        fed["prefill"] += prefill * rows
        fed["decode"] += (piece.length - prefill) * rows
        request.recomputed_tokens += again * rows
        self.stats.recomputed_tokens += again * rows

    def mark_computed(self, piece: Piece) -> None:
        """After the forward: the piece's positions are cached, its full prompt blocks enter the prefix
        cache, and a shared prompt that ended forks into its rows."""
        request = piece.request
        request.num_computed = piece.end
        if piece.start >= request.prompt_len:  # decoding: no prompt block filled, no fork ahead
            return
        self.blocks.cache_full_blocks(piece)
        if not request.forked and request.num_computed == request.prompt_len:
            self.stats.blocks_saved_by_sharing += self.blocks.fork(request)

    def draw(self, logits: torch.Tensor, picks: torch.Tensor | None, drawing: list[tuple[Request, list[int]]],
             updates: dict[int, RequestUpdate]) -> None:
        """Every drawing request's next token per row from its rows of `logits` (a request of n > 1 whose
        shared prompt just ended has one row, which serves every sample), chosen as `generate` chooses
        (its knobs in MiniMind's order): a sampled request's rows in one call with its own generator (or
        the global one), as `generate` draws its rows; the plain greedy requests' rows
        (kvlab.engine.sampling.is_greedy: argmax(logits / temperature)) in one call for all, whatever
        their temperatures; other greedy requests with the same knobs and no repetition penalty in one
        call for all their rows. Greedy choices draw nothing at random and treat each row apart. The
        plain greedy rows take the compiled step's `picks` (the same division and argmax, made in the
        step) where it gives them (kvlab.engine.sampling.greedy_pick_exact), else NumPy or torch choose
        here."""
        plain: list[tuple[Request, list[int]]] = []
        groups: dict[tuple, list[tuple[Request, list[int]]]] = {}
        for request, rows in drawing:
            if len(rows) != request.n:
                rows = rows * request.n
            if self.on_draw is not None:
                self.on_draw(request.request_id, logits[rows])
            params = request.params
            if params.is_greedy:
                plain.append((request, rows))
            elif not params.do_sample and params.repetition_penalty == 1.0:
                groups.setdefault(params.knob_key, []).append((request, rows))
            else:
                seen = torch.tensor([request.prompt + row.new_tokens for row in request.rows], device=logits.device)
                tokens = sampling.pick(logits[rows], seen, **params.knobs(), generator=request.generator)
                self.take(request, tokens[:, 0].tolist(), updates)
        if plain:
            rows = [row for _, request_rows in plain for row in request_rows]
            if picks is not None:
                picked = picks.tolist()
                tokens = picked if rows == list(range(len(picked))) else [picked[row] for row in rows]
            else:
                chosen = logits if rows == list(range(logits.shape[0])) else logits[rows]
                tokens = sampling.greedy_pick_rows(chosen, [request.params.temperature for request, request_rows in plain
                                                         for _ in request_rows])
            self.take_each(plain, tokens, updates)
        for group in groups.values():
            rows = [row for _, request_rows in group for row in request_rows]
            chosen = logits if rows == list(range(logits.shape[0])) else logits[rows]
            self.take_each(group, sampling.pick(chosen, None, **group[0][0].params.knobs())[:, 0].tolist(), updates)

    def take_each(self, drawn: list[tuple[Request, list[int]]], tokens: list[int],
                  updates: dict[int, RequestUpdate]) -> None:
        """`tokens` drawn for the requests' rows laid end to end, each request's taken."""
        offset = 0
        for request, _ in drawn:
            self.take(request, tokens[offset:offset + request.n], updates)
            offset += request.n

    def take(self, request: Request, tokens: list[int], updates: dict[int, RequestUpdate]) -> None:
        """Each row's drawn token appended (a row that ended gets eos again, as `generate` pads it)."""
        eos, rows = request.params.eos_token_id, request.rows
        if len(rows) == 1:  # most requests: no generator expressions
            gained, drawn = (rows[0].take(tokens[0], eos),), (rows[0].new_tokens[-1],)
        else:
            gained = tuple(row.take(token, eos) for row, token in zip(rows, tokens))
            drawn = tuple(row.new_tokens[-1] for row in rows)
        request.record("first_token" if len(rows[0].new_tokens) == 1 else "token", self.clock, drawn)
        self.update(updates, request).tokens = gained
