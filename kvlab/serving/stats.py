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

from collections import deque
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
    """The engine's counts, each over every step it ran, and its step records: every one, or the last
    `keep_steps` (a server steps for ever: ServingConfig.step_records bounds what it keeps). The
    engine adds each step with `record`."""

    max_num_seqs: int
    num_blocks: int
    keep_steps: int | None = None
    steps: deque[StepRecord] = field(init=False)
    forward_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    max_tokens_per_step: int = 0
    useful_slot_steps: int = 0
    peak_blocks_in_use: int = 0
    block_steps: int = 0  # the blocks in use, summed over the steps
    idle_steps: int = 0  # clock ticks with nothing to run (waiting for an arrival)
    preemptions: int = 0
    recomputed_tokens: int = 0  # positions fed again, after a preemption had taken their blocks
    prefix_hit_blocks: int = 0  # prompt blocks taken from the prefix cache instead of computed
    prefix_hit_tokens: int = 0
    blocks_saved_by_sharing: int = 0  # table entries served by a block another table held already
    wall_s: float = 0.0

    def __post_init__(self):
        self.steps = deque(maxlen=self.keep_steps)

    def record(self, step: StepRecord) -> None:
        """A step ran: counted, and its record kept (the oldest dropped past `keep_steps`)."""
        self.steps.append(step)
        self.forward_steps += 1
        self.prefill_tokens += step.prefill_tokens
        self.decode_tokens += step.decode_tokens
        self.max_tokens_per_step = max(self.max_tokens_per_step, step.prefill_tokens + step.decode_tokens)
        self.useful_slot_steps += step.useful_slots
        self.peak_blocks_in_use = max(self.peak_blocks_in_use, step.blocks_in_use)
        self.block_steps += step.blocks_in_use

    @property
    def mean_blocks_in_use(self) -> float:
        return self.block_steps / max(1, self.forward_steps)

    @property
    def slot_utilisation(self) -> float:
        return self.useful_slot_steps / max(1, self.max_num_seqs * self.forward_steps)

    def summary(self) -> dict:
        """Every counter as a flat dict (what the demo prints)."""
        return {
            "forward_steps": self.forward_steps, "idle_steps": self.idle_steps,
            "prefill_tokens": self.prefill_tokens, "decode_tokens": self.decode_tokens,
            "max_tokens_per_step": self.max_tokens_per_step,
            "useful_slot_steps": self.useful_slot_steps, "slot_utilisation": self.slot_utilisation,
            "preemptions": self.preemptions,
            "recomputed_tokens": self.recomputed_tokens, "peak_blocks_in_use": self.peak_blocks_in_use,
            "mean_blocks_in_use": self.mean_blocks_in_use, "num_blocks": self.num_blocks,
            "prefix_hit_blocks": self.prefix_hit_blocks, "prefix_hit_tokens": self.prefix_hit_tokens,
            "blocks_saved_by_sharing": self.blocks_saved_by_sharing, "wall_s": self.wall_s,
        }
