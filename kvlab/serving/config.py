"""The serving engine's knobs, checked once, when the config is made and again against the model.

A bad knob is refused with one line that names it, before any request runs.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("continuous", "static")
MATMULS = ("per_request", "fused")


@dataclass(frozen=True)
class ServingConfig:
    """How the engine holds caches and batches requests.

    num_blocks              blocks in the pool; each holds `block_size` tokens' K and V in every layer
    block_size              tokens a block holds (vLLM's and nano-vllm's default is 16)
    max_num_seqs            rows (sequences, one per sample) running at once: the batch's slots
    max_num_batched_tokens  tokens one forward step may feed, prefill and decode together
    chunked_prefill         a prompt longer than what is left of a step's budget is split across steps;
                            without it a prompt is fed whole, in one step
    prefix_caching          full prompt blocks are kept under a hash of their tokens and reused
    policy                  "continuous": requests join and leave the batch at every step;
                            "static": a batch is admitted together and runs until its longest row is
                            done before the next one starts (as `generate` serves a batch: today's way)
    matmuls                 "per_request": each request's rows go through the weights in a call of
                            their own, shaped as `generate` alone shapes them, so the CPU's matrix
                            kernels give the same bits; "fused": one call for all the step's rows, as
                            servers batch them (faster where a call costs more than its rows)
    """

    num_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    chunked_prefill: bool = False
    prefix_caching: bool = True
    policy: str = "continuous"
    matmuls: str = "per_request"

    def __post_init__(self):
        for knob in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServingConfig.{knob} must be a whole number >= 1, got {value!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"ServingConfig.policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.matmuls not in MATMULS:
            raise ValueError(f"ServingConfig.matmuls must be one of {', '.join(MATMULS)}, got {self.matmuls!r}")

    @property
    def pool_tokens(self) -> int:
        """Tokens the whole pool holds."""
        return self.num_blocks * self.block_size

    def check_model(self, max_position_embeddings: int) -> None:
        """A block table of whole blocks must end exactly at the model's last position."""
        if max_position_embeddings % self.block_size:
            raise ValueError(
                f"ServingConfig.block_size ({self.block_size}) must divide the model's max_position_embeddings "
                f"({max_position_embeddings}), so whole blocks cover every position")
