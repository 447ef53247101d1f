"""What serving a trace cost, counted at every step: exact counts (the same on any machine) beside
the wall time.

A slot is one of the `max_num_seqs` rows a step may run. A slot-step is useful when a row draws a
token it keeps (an answer's token, its eos included): not a step that only feeds part of a prompt,
or positions computed again, or a sample that drew its eos already and is still fed to keep its
request's rows together. Slot utilisation = useful slot-steps / (slots x forward steps): for one
trace the useful slot-steps are the tokens answered, whatever the policy, so it compares how many
steps each policy took to answer them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepRecord:
    """One forward step: its index on the engine's clock, when it ended, the tokens it fed (prefill:
    prompt positions and positions computed again after a preemption; decode: one new position per
    row), its useful slots (rows that drew a token they keep), the blocks held once it was scheduled,
    the queues after it, and its seconds: the scheduler's, the forward pass's, the whole step's (the
    draws and bookkeeping too; an `on_schedule` hook's time left out) and the CPU seconds of the thread
    that ran it (under the wall seconds: the thread waited for the CPU)."""

    step: int
    time: float
    prefill_tokens: int
    decode_tokens: int
    useful_slots: int
    blocks_in_use: int
    running: int
    waiting: int
    schedule_s: float = 0.0
    forward_s: float = 0.0
    step_s: float = 0.0
    cpu_s: float = 0.0


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
    def useful_slot_steps(self) -> int:
        return sum(s.useful_slots for s in self.steps)

    @property
    def slot_utilisation(self) -> float:
        return self.useful_slot_steps / max(1, self.max_num_seqs * len(self.steps))

    def summary(self) -> dict:
        """Every counter as a flat dict (what the demo prints)."""
        return {
            "forward_steps": self.forward_steps, "idle_steps": self.idle_steps,
            "prefill_tokens": self.prefill_tokens, "decode_tokens": self.decode_tokens,
            "max_tokens_per_step": max((s.prefill_tokens + s.decode_tokens for s in self.steps), default=0),
            "useful_slot_steps": self.useful_slot_steps, "slot_utilisation": self.slot_utilisation,
            "preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed_tokens, "peak_blocks_in_use": self.peak_blocks_in_use,
            "mean_blocks_in_use": self.mean_blocks_in_use, "num_blocks": self.num_blocks,
            "prefix_hit_blocks": self.prefix_hit_blocks, "prefix_hit_tokens": self.prefix_hit_tokens,
            "blocks_saved_by_sharing": self.blocks_saved_by_sharing, "wall_s": self.wall_s,
        }
