"""The serving trace's settings (config key extras.serving), typed: what the trace rule, the rate
sweep and the compile job read, one object from the config to the measurement (config.yaml's comments
say what each is; schemas/config.schema.yaml checks them, kvlab.config.check_serving checks them
together)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping


# the knobs only the rate sweep reads, and those only the trace rule reads: each rule is handed the
# others' left out (rules/serving.smk), so that changing one's reruns only that rule
RATE_SWEEP = ("rate_fractions", "rate_max_seconds")
TRACE_ONLY = ("rate", "tight_blocks", "prefix_requests", "question_tokens", "parallel_requests", "parallel_n",
              "repeats")


@dataclass(frozen=True)
class ServingSettings:
    requests: int  # the trace: one request per validation document, the first ones
    prompt_min: int  # each prompt cut to a seeded length from prompt_min tokens to at most prompt_cap
    prompt_cap: int
    max_tokens_min: int  # each request's max_tokens drawn from this range (no eos)
    max_tokens_max: int
    temperature: float  # every other request sampled with these and a seed of its own
    top_p: float
    seed: int
    slots: int  # rows running at once (max_num_seqs)
    block_size: int  # tokens a block holds
    num_blocks: int  # the pool
    max_batched_tokens: int  # tokens one forward step may feed
    compile: bool  # the engine's one compiled step (false: eager)
    budget_s: float | None = None  # seconds the trace rule may take (its repeats after the first planned to fit)
    # TRACE_ONLY (None where a rule was not handed them)
    rate: float | None = None  # Poisson arrivals per forward step (None: all at once)
    tight_blocks: int | None = None  # a tight pool, where running requests are preempted
    prefix_requests: int | None = None  # the shared-prefix trace
    question_tokens: int | None = None
    parallel_requests: int | None = None  # the n > 1 trace: parallel_n samples of each prompt
    parallel_n: int | None = None
    repeats: int | None = None  # timed runs of each policy
    # RATE_SWEEP
    rate_fractions: tuple[float, ...] | None = None  # fractions of continuous's saturation throughput
    rate_max_seconds: float | None = None  # the most one run of the rate sweep may take

    @classmethod
    def of(cls, serving: Mapping[str, Any]) -> ServingSettings:
        """The settings from the config's extras.serving (a key it lacks or does not know is an error:
        the schema has checked them)."""
        values = dict(serving)
        if values.get("rate_fractions") is not None:
            values["rate_fractions"] = tuple(values["rate_fractions"])
        return cls(**values)

    def changed(self, **changes) -> ServingSettings:
        """These settings with some changed."""
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """Every setting by its config name (what a result file records)."""
        values = dataclasses.asdict(self)
        if self.rate_fractions is not None:
            values["rate_fractions"] = list(self.rate_fractions)
        return values


def without(serving: Mapping[str, Any], keys: tuple[str, ...]) -> dict:
    """The config's extras.serving less `keys` (RATE_SWEEP or TRACE_ONLY): what one rule is handed."""
    return {key: value for key, value in serving.items() if key not in keys}
