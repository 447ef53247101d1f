"""The traces the serving measurements serve: seeded lists of requests, each a validation document's
prompt cut to a seeded length, a seeded `max_tokens`, greedy or sampled with a seed of its own, and
an arrival on the engine's step clock (Poisson gaps, kvlab.facts.arrivals). Every request runs to its
`max_tokens` (no eos), so how long it runs is the trace's alone: the counts measured on it are the
same on every machine.

  main_trace    the first `requests` validation prompts at `rate` per step (None: all at once)
  traces        the three the trace rule serves: `trace`, `prefix` (the lab's prompt as a system
                prompt before each question), `parallel` (n > 1 samples of each prompt)
  spaced        the same prompts one after another's end: each served alone
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from kvlab.engine.model import MiniMindForCausalLM
from kvlab.engine.sampling import GREEDY
from kvlab.facts.arrivals import poisson_arrivals
from kvlab.facts.serving import ServingSettings
from kvlab.serving import SamplingParams, ServingConfig
from kvlab.serving.config import block_size_problem


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: what `ServingEngine.add_request` takes."""

    prompt: list[int]
    params: SamplingParams
    arrival_step: int = 0

    def record(self, index: int) -> dict:
        """What the trace's files say of it."""
        return {"request": index, "prompt_len": len(self.prompt), "max_tokens": self.params.max_tokens,
                "n": self.params.n, "seed": self.params.seed, "greedy": not self.params.do_sample,
                "arrival_step": self.arrival_step}


def request_params(index: int, max_tokens: int, sampling: dict, seed: int, n: int = 1) -> SamplingParams:
    """Every other request greedy; the others, and every request of n > 1 samples (parallel sampling),
    sampled with `sampling`'s knobs and a seed of their own."""
    if index % 2 == 0 and n == 1:
        return SamplingParams(max_tokens=max_tokens, n=n, eos_token_id=None, **GREEDY)
    return SamplingParams(max_tokens=max_tokens, n=n, eos_token_id=None, seed=seed * 1000 + index, **sampling)


def make_trace(prompts: list[list[int]], rate: float | None, max_tokens: tuple[int, int], prompt_min: int,
               sampling: dict, seed: int, n: int = 1, prefix: list[int] | None = None) -> list[TraceRequest]:
    """One request per prompt, in order: cut to a seeded length from `prompt_min` tokens to its own
    (bos kept), `max_tokens` drawn from the range, arriving at Poisson steps of `rate` per forward step
    (None: all at step 0). With `prefix`, each prompt (without its bos) follows it: a system prompt
    shared by every request. The lengths and the arrivals are drawn apart: the same seed gives the same
    requests at any rate, and one pattern of arrivals, scaled."""
    rng = random.Random(seed)
    arrivals = poisson_arrivals(len(prompts), rate, f"arrivals {seed}") if rate else [0] * len(prompts)
    trace = []
    for index, (prompt, arrival) in enumerate(zip(prompts, arrivals)):
        length = rng.randint(min(prompt_min, len(prompt)), len(prompt))
        ids = prompt[:length] if prefix is None else list(prefix) + prompt[1:length]
        params = request_params(index, rng.randint(*max_tokens), sampling, seed, n)
        trace.append(TraceRequest(ids, params, arrival_step=int(arrival)))
    return trace


def spaced(trace: list[TraceRequest], max_tokens: int) -> list[TraceRequest]:
    """The same prompts, each with `max_tokens`, arriving one after another's end: every request is
    served alone (what a time to first token without queueing needs)."""
    return [TraceRequest(request.prompt, dataclasses.replace(request.params, max_tokens=max_tokens),
                         arrival_step=index * (max_tokens + 1))
            for index, request in enumerate(trace)]


def sampling_knobs(settings: ServingSettings) -> dict:
    return dict(temperature=settings.temperature, top_p=settings.top_p)


def main_trace(prompts: list[list[int]], settings: ServingSettings, rate: float | None) -> list[TraceRequest]:
    """The trace every way serves: the first `requests` validation prompts, at `rate` per step."""
    s = settings
    return make_trace(prompts[: s.requests], rate, (s.max_tokens_min, s.max_tokens_max), s.prompt_min,
                      sampling_knobs(s), s.seed)


def traces(prompts: list[list[int]], system_prompt: list[int],
           settings: ServingSettings) -> dict[str, list[TraceRequest]]:
    """The three traces, each from the first validation prompts: `trace` (distinct prompts), `prefix`
    (the lab's prompt as a system prompt before each document's first question_tokens tokens) and
    `parallel` (parallel_n samples of each prompt, every request sampled)."""
    s = settings
    span = (s.max_tokens_min, s.max_tokens_max)
    questions = [prompt[: s.question_tokens + 1] for prompt in prompts[: s.prefix_requests]]
    return {"trace": main_trace(prompts, s, s.rate),
            "prefix": make_trace(questions, s.rate, span, s.question_tokens + 1, sampling_knobs(s), s.seed + 1,
                                 prefix=system_prompt),
            "parallel": make_trace(prompts[: s.parallel_requests], s.rate, span, s.prompt_min,
                                   sampling_knobs(s), s.seed + 2, n=s.parallel_n)}


# --- refusals, naming the config key -----------------------------------------------------------------


def check_fits(trace: list[TraceRequest], config: ServingConfig, key: str) -> None:
    """Refuse, in one line naming the config key, a trace with a request the pool could never hold."""
    for index, request in enumerate(trace):
        needed = config.blocks_for(len(request.prompt), request.params.max_tokens, request.params.n)
        if needed > config.num_blocks:
            raise ValueError(f"config key '{key}': {config.num_blocks} blocks of {config.block_size} tokens cannot hold "
                             f"request {index} ({len(request.prompt)}-token prompt + max_tokens "
                             f"{request.params.max_tokens}, n={request.params.n}: {needed} blocks)")


def check_block_size(model: MiniMindForCausalLM, block_size: int) -> None:
    """A block size must divide the model's positions (the engine's own rule), named by its config key."""
    problem = block_size_problem(block_size, model.config.max_position_embeddings)
    if problem:
        raise ValueError(f"config key 'extras.serving.block_size': {problem}")
