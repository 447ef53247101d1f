"""What serving a trace cost, counted at every step: exact counts (the same on any machine) beside
the wall time.

A slot is one of the `max_num_seqs` rows a step may run. A slot is used in a step when an unfinished
row of a request fed a token in it (a sample that drew its eos and still gets fed, to keep its
request's rows together, does not count). Slot utilisation = used slot-steps / (slots x forward steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepRecord:
    """One forward step: its index on the engine's clock, when it ended, the tokens it fed (prefill:
    prompt positions and positions computed again after a preemption; decode: one new position per
    row), the slots it used, the blocks held once it was scheduled, and the queues after it."""

    step: int
    time: float
    prefill_tokens: int
    decode_tokens: int
    used_slots: int
    blocks_in_use: int
    running: int
    waiting: int


@dataclass
class EngineStats:
    max_num_seqs: int
    num_blocks: int
    steps: list[StepRecord] = field(default_factory=list)
    idle_steps: int = 0  # clock ticks with nothing to run (waiting for an arrival)
    preemptions: int = 0
    recomputed_tokens: int = 0  # positions fed again, after a preemption had taken their blocks
    prefix_hit_blocks: int = 0  # prompt blocks taken from the prefix cache instead of computed
    prefix_hit_tokens: int = 0
    blocks_saved_by_sharing: int = 0  # table entries served by a block another table held already
    wall_s: float = 0.0

    @property
    def forward_steps(self) -> int:
        return len(self.steps)

    @property
    def prefill_tokens(self) -> int:
        return sum(s.prefill_tokens for s in self.steps)

    @property
    def decode_tokens(self) -> int:
        return sum(s.decode_tokens for s in self.steps)

    @property
    def peak_blocks_in_use(self) -> int:
        return max((s.blocks_in_use for s in self.steps), default=0)

    @property
    def mean_blocks_in_use(self) -> float:
        return sum(s.blocks_in_use for s in self.steps) / max(1, len(self.steps))

    @property
    def used_slot_steps(self) -> int:
        return sum(s.used_slots for s in self.steps)

    @property
    def slot_utilisation(self) -> float:
        return self.used_slot_steps / max(1, self.max_num_seqs * len(self.steps))

    def summary(self) -> dict:
        """Every counter as a flat dict (what the demo prints)."""
        return {
            "forward_steps": self.forward_steps, "idle_steps": self.idle_steps,
            "prefill_tokens": self.prefill_tokens, "decode_tokens": self.decode_tokens,
            "max_tokens_per_step": max((s.prefill_tokens + s.decode_tokens for s in self.steps), default=0),
            "slot_utilisation": self.slot_utilisation, "preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed_tokens, "peak_blocks_in_use": self.peak_blocks_in_use,
            "mean_blocks_in_use": self.mean_blocks_in_use, "num_blocks": self.num_blocks,
            "prefix_hit_blocks": self.prefix_hit_blocks, "prefix_hit_tokens": self.prefix_hit_tokens,
            "blocks_saved_by_sharing": self.blocks_saved_by_sharing, "wall_s": self.wall_s,
        }
