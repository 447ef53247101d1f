"""The lab's closed forms, and the names of its modes and columns, free of PyTorch so that the
jobs that only read results (check, report, figures) can use them without loading it."""

from __future__ import annotations

# The two ways the lab generates: (label in the result files, use_cache).
MODES = (("with_cache", True), ("without_cache", False))
# The two ways `batch` fills B rows: one prompt shared by every row, or B different prompts.
BATCH_MODES = ("shared", "distinct")
GIB = 1024**3


def fed_formulas(prompt_len: int, new_tokens: int) -> dict:
    """Tokens fed to forward for N new tokens after a P-token prompt: P+N-1 with the cache
    (prefill, then one a step), P*N + N(N-1)/2 without (everything so far, every step)."""
    p, n = prompt_len, new_tokens
    return {"with_cache": p + n - 1, "without_cache": p * n + n * (n - 1) // 2}


# The vLLM paper's own numbers (Kwon et al., "Efficient Memory Management for Large Language Model
# Serving with PagedAttention", SOSP 2023): the share of KV-cache memory that holds token states in the
# systems it compares (Figure 2), with vLLM's paging in blocks of 16 tokens, its throughput gain, and
# the memory its block sharing saves in parallel sampling (Figure 15: blocks saved by sharing over the
# blocks without sharing, for 2 to 6 samples of each Alpaca request on OPT-13B). Shown beside the lab's
# own numbers, labelled as theirs; never used as a result.
VLLM_PAPER = {
    "existing_token_share": (0.204, 0.382),
    "vllm_token_share": 0.963,
    "block_tokens": 16,
    "throughput_gain": (2, 4),
    "parallel_sampling_saving": (0.061, 0.098),
}


def request_blocks(prompt_len: int, max_tokens: int, n: int, block_size: int) -> int:
    """The most blocks a paged cache holds for one request (kvlab.serving's rule): every position but
    the last new token's, in whole blocks, each of n samples in its own but the prompt's full blocks,
    which they share."""
    most = prompt_len + max_tokens - 1
    shared = prompt_len // block_size if n > 1 else 0
    return shared + n * (-(-most // block_size) - shared)


def pool_room(prompt_len: int, n: int, num_blocks: int, block_size: int) -> int:
    """The most new tokens a request of `prompt_len` tokens and n samples may ask of a pool of
    `num_blocks`: `request_blocks` solved for max_tokens (0 or less: its prompt alone does not fit)."""
    shared = prompt_len // block_size if n > 1 else 0
    return block_size * (shared + (num_blocks - shared) // n) - prompt_len + 1


def fits_column(budget_gib: float) -> str:
    """kv_waste.csv's column of the requests that fit in a budget: 24 -> "fits_24gib"."""
    return f"fits_{budget_gib:g}gib"


def fits_budgets(row: dict) -> dict[str, str]:
    """A kv_waste.csv row's budgets, as written in its column names ("24"), each with its column."""
    return {key.removeprefix("fits_").removesuffix("gib"): key for key in row if key.startswith("fits_")}
