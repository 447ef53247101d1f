"""A request as the engine serves it: its prompt, its sampling knobs, its rows (one per sample) with
their block tables, where it stands, and what happened to it when.

Positions: a row's tokens are the prompt (shared by every row) and then its own new tokens.
`num_computed` positions of each row are in the cache; the rows of a request always hold the same
number (they are fed together, as `generate` feeds the rows of `num_return_sequences`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import NamedTuple

import torch

from kvlab.engine import sampling


class State(Enum):
    PENDING = "pending"  # not arrived yet
    WAITING = "waiting"  # arrived (or preempted), holds no blocks
    RUNNING = "running"  # holds blocks, fed at every step it gets
    FINISHED = "finished"


EVENT_KINDS = ("arrival", "admission", "first_token", "token", "preemption", "finish", "abort")


class Event(NamedTuple):
    """Something that happened to a request: its `kind` (one of EVENT_KINDS), the engine's `step`
    (the forward step it happened in; the same on any machine) and `time` (time.perf_counter()).
    A draw ("first_token", then "token") carries the tokens drawn, one per row. (A named tuple: one is
    made for every token served, and a frozen dataclass takes four times as long to make.)"""

    kind: str
    step: int
    time: float
    tokens: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SamplingParams:
    """One request's knobs. Names and defaults are those of MiniMind's `generate` (max_tokens is its
    max_new_tokens, n its num_return_sequences). `seed` gives the request a generator of its own,
    `torch.Generator().manual_seed(seed)`: its draws are then those of `generate` after
    `torch.manual_seed(seed)`, whatever else the engine serves; without a seed it draws from PyTorch's
    global generator. `eos_token_id=None` runs every row to max_tokens."""

    max_tokens: int = 16
    temperature: float = 0.85
    top_p: float = 0.85
    top_k: int = 50
    repetition_penalty: float = 1.0
    do_sample: bool = True
    seed: int | None = None
    eos_token_id: int | None = 2
    n: int = 1

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        sampling.check_temperature(self.temperature, self.do_sample)

    @cached_property
    def knob_key(self) -> tuple:
        """The knobs as a key: requests of one key draw greedily in one call."""
        return tuple(self.knobs().items())

    @cached_property
    def is_greedy(self) -> bool:
        """Whether the next token is argmax(logits / temperature) (kvlab.engine.sampling.is_greedy)."""
        return sampling.is_greedy(**self.knobs())

    def knobs(self) -> dict:
        """The keyword arguments of kvlab.engine.sampling.pick."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    repetition_penalty=self.repetition_penalty, do_sample=self.do_sample)


@dataclass
class Row:
    """One sample of a request: the tokens it has drawn (after its eos, eos again, as `generate` pads a
    finished row while others run), the blocks that hold its cache, in position order."""

    new_tokens: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    finished: bool = False

    def output(self, eos_token_id: int | None) -> list[int]:
        """Its tokens up to and with its first eos."""
        if self.finished:
            return self.new_tokens[: self.new_tokens.index(eos_token_id) + 1]
        return list(self.new_tokens)

    def take(self, token: int, eos_token_id: int | None) -> tuple[int, ...]:
        """Append a drawn token (eos, if the row finished before: `generate`'s padding); returns what the
        row's answer gained, () once it has ended."""
        if self.finished:
            self.new_tokens.append(eos_token_id)
            return ()
        self.new_tokens.append(token)
        self.finished = eos_token_id is not None and token == eos_token_id
        return (token,)


class Request:
    """A request and where it stands (see the module's docstring)."""

    def __init__(self, request_id: int, prompt: list[int], params: SamplingParams, arrival_step: int = 0,
                 arrival_s: float | None = None, device: torch.device | str = "cpu"):
        self.request_id = request_id
        self.prompt = list(prompt)
        self.prompt_len = len(self.prompt)  # the prompt never changes: plain attributes, read every step
        self.n = params.n
        self.params = params
        self.arrival_step = arrival_step
        self.arrival_s = arrival_s
        self.state = State.PENDING
        self.rows = [Row() for _ in range(params.n)]
        self.num_computed = 0  # positions of each row in the cache
        self.high_water = 0  # the most positions it ever had cached: below it, a position is recomputed
        self.forked = params.n == 1  # whether every row has its own table (after the prompt, for n > 1)
        self.block_hashes: list[bytes] = []  # chained hash of each full prompt block (set by the engine)
        # on the device the draws happen on, as torch.manual_seed seeds every device's generator
        self.generator = None if params.seed is None else torch.Generator(device=device).manual_seed(params.seed)
        self.events: list[Event] = []
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache, over all admissions
        self.aborted = False  # stopped by ServingEngine.abort before it finished

    # --- lengths -----------------------------------------------------------------------------------

    @property
    def num_new(self) -> int:
        """New tokens drawn so far (each row has as many)."""
        return len(self.rows[0].new_tokens)

    @property
    def num_known(self) -> int:
        """Positions of each row whose token is known: prompt and new tokens."""
        return self.prompt_len + self.num_new

    @property
    def most_positions(self) -> int:
        """The most positions a row ever holds in the cache: the last new token is never fed."""
        return self.prompt_len + self.params.max_tokens - 1

    def token_ids(self, row: int, start: int, end: int) -> list[int]:
        """Row `row`'s tokens at positions start .. end - 1."""
        prompt_len, new_tokens = self.prompt_len, self.rows[row].new_tokens
        if start >= prompt_len:  # decoding: only new tokens, without copying the prompt
            return new_tokens[start - prompt_len:end - prompt_len]
        return (self.prompt + new_tokens)[start:end]

    @property
    def unfinished_rows(self) -> int:
        rows = self.rows
        if len(rows) == 1:  # most requests: no generator expression
            return 0 if rows[0].finished else 1
        return sum(not row.finished for row in rows)

    # --- what happened -----------------------------------------------------------------------------

    def record(self, kind: str, step: int, tokens: tuple[int, ...] | None = None, at: float | None = None) -> None:
        self.events.append(Event(kind, step, time.perf_counter() if at is None else at, tokens))

    def output(self) -> "RequestOutput":
        eos = self.params.eos_token_id
        return RequestOutput(
            request_id=self.request_id, prompt=list(self.prompt),
            samples=[row.output(eos) for row in self.rows],
            finish_reasons=["eos" if row.finished else "abort" if self.aborted else "length" for row in self.rows],
            events=list(self.events), preemptions=self.preemptions, recomputed_tokens=self.recomputed_tokens,
            cached_tokens=self.cached_tokens)


@dataclass(frozen=True)
class RequestOutput:
    """What a finished request gave: each sample's new tokens (its eos last, when it drew one), why each
    ended ("eos", "length", or "abort" when ServingEngine.abort stopped it), its events, and what serving
    it cost it."""

    request_id: int
    prompt: list[int]
    samples: list[list[int]]
    finish_reasons: list[str]
    events: list[Event]
    preemptions: int
    recomputed_tokens: int
    cached_tokens: int

    def _event(self, kind: str) -> Event:
        return next(event for event in self.events if event.kind == kind)

    @property
    def ttft_steps(self) -> int:
        """Steps from its arrival to the step that drew its first token."""
        return self._event("first_token").step - self._event("arrival").step

    @property
    def ttft_s(self) -> float:
        return self._event("first_token").time - self._event("arrival").time

    @property
    def latency_s(self) -> float:
        """From arrival to finish."""
        return self._event("finish").time - self._event("arrival").time

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first, vLLM's (latency - TTFT) / (tokens - 1)."""
        draws = sum(event.kind in ("first_token", "token") for event in self.events)
        return None if draws < 2 else (self.latency_s - self.ttft_s) / (draws - 1)


@dataclass(slots=True)
class Piece:
    """What a request feeds in one step: `length` positions from `start` of each of `rows`
    (row 0 alone while its prompt is shared, all rows after). `end` and `tokens` (what it costs of
    the step's budget) are set with it: a step reads them several times for each of its pieces."""

    request: Request
    start: int
    length: int
    rows: list[int]
    end: int = field(init=False)
    tokens: int = field(init=False)

    def __post_init__(self):
        self.end = self.start + self.length
        self.tokens = self.length * len(self.rows)

    @property
    def draws(self) -> bool:
        """Whether it reaches the last known token, so the step draws the next."""
        return self.end == self.request.num_known
