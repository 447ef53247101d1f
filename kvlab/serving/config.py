"""The serving engine's knobs, checked once, when the config is made and again against the model.

A bad knob is refused with one line that names it, before any request runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.engine.config import KV_BYTES_PER_ELEMENT
from kvlab.facts.formulas import pool_room, request_blocks

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
                            servers batch them (faster where a call costs more than its rows); for the
                            steps' eager part: the prompts, and every row without `compile`
    compile                 every row that feeds one token (decoding) goes through one compiled step,
                            all requests together (kvlab.serving.decode_step); False: every piece eager
                            (as vLLM's enforce_eager)
    kv_dtype                what the pool's blocks store (kvlab.engine.kv_dtype): "float32", the model's
                            own values; "bfloat16", "float16" or "int8" (with a scale per token and KV
                            head), read back for attention, served the eager way (compile=False: the
                            compiled step's kernel reads float32 blocks)
    step_records            the step records the engine keeps (EngineStats.steps): the last so many, None
                            for every one (a run of a trace reads them all; a server, stepping for ever,
                            keeps a few); its counts cover every step either way
    """

    num_blocks: int = 256
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    chunked_prefill: bool = False
    prefix_caching: bool = True
    policy: str = "continuous"
    matmuls: str = "per_request"
    compile: bool = True
    kv_dtype: str = "float32"
    step_records: int | None = None

    def __post_init__(self):
        for knob in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServingConfig.{knob} must be a whole number >= 1, got {value!r}")
        if self.step_records is not None and (not isinstance(self.step_records, int) or self.step_records < 1):
            raise ValueError(f"ServingConfig.step_records must be None or a whole number >= 1, got {self.step_records!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"ServingConfig.policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.kv_dtype not in KV_BYTES_PER_ELEMENT:
            raise ValueError(f"ServingConfig.kv_dtype must be one of {', '.join(KV_BYTES_PER_ELEMENT)}, got {self.kv_dtype!r}")
        if self.kv_dtype != "float32" and self.compile:
            raise ValueError(f"ServingConfig.kv_dtype {self.kv_dtype!r} is served the eager way (the compiled "
                             "step's kernel reads float32 blocks): set compile=False")
        if self.matmuls not in MATMULS:
            raise ValueError(f"ServingConfig.matmuls must be one of {', '.join(MATMULS)}, got {self.matmuls!r}")

    def blocks_for(self, prompt_len: int, max_tokens: int, n: int = 1) -> int:
        """The most blocks one request holds (kvlab.facts.formulas.request_blocks)."""
        return request_blocks(prompt_len, max_tokens, n, self.block_size)

    def room(self, prompt_len: int, n: int = 1) -> int:
        """The most new tokens a request may ask of the pool (kvlab.facts.formulas.pool_room)."""
        return pool_room(prompt_len, n, self.num_blocks, self.block_size)

    def check_request(self, prompt_len: int, max_tokens: int, n: int) -> None:
        """Refuse, naming the knob, a request these knobs could never serve."""
        needed = self.blocks_for(prompt_len, max_tokens, n)
        if needed > self.num_blocks:
            raise ValueError(
                f"ServingConfig.num_blocks ({self.num_blocks}) is too small: this request needs up to {needed} "
                f"blocks of {self.block_size} tokens ({prompt_len}-token prompt + max_tokens {max_tokens}, n={n})")
        if n > self.max_num_seqs:
            raise ValueError(f"ServingConfig.max_num_seqs ({self.max_num_seqs}) is smaller than this request's "
                             f"n ({n}): its rows run together")
        if n > self.max_num_batched_tokens:
            raise ValueError(f"ServingConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) fits nothing: "
                             f"decoding this request feeds n = {n} tokens a step")
        if not self.chunked_prefill and prompt_len > self.max_num_batched_tokens:
            raise ValueError(f"ServingConfig.max_num_batched_tokens ({self.max_num_batched_tokens}) fits nothing: "
                             f"a {prompt_len}-token prompt is fed in one step without chunked_prefill")

    def check_model(self, max_position_embeddings: int) -> None:
        """A block table of whole blocks must end exactly at the model's last position."""
        problem = block_size_problem(self.block_size, max_position_embeddings)
        if problem:
            raise ValueError(f"ServingConfig.block_size: {problem}")


def block_size_problem(block_size: int, max_position_embeddings: int) -> str | None:
    """Why a block size cannot serve a model (None when it can): whole blocks must cover exactly every
    position, so the size must divide the model's max_position_embeddings."""
    if max_position_embeddings % block_size:
        return (f"{block_size} does not divide the model's max_position_embeddings ({max_position_embeddings}), so "
                f"whole blocks cannot cover every position")
    return None
