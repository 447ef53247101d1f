"""The lab's closed forms and labels, free of PyTorch so that the jobs that only read
results (check, report, figures) can use them without loading it."""

from __future__ import annotations

# The two ways the lab generates: (label in the result files, use_cache).
MODES = (("with_cache", True), ("without_cache", False))


def fed_formulas(prompt_len: int, new_tokens: int) -> dict:
    """Tokens fed to forward for N new tokens after a P-token prompt: P+N-1 with the cache
    (prefill, then one a step), P*N + N(N-1)/2 without (everything so far, every step)."""
    p, n = prompt_len, new_tokens
    return {"with_cache": p + n - 1, "without_cache": p * n + n * (n - 1) // 2}
