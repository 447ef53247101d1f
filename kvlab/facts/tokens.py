"""Token sequences compared: where two first differ. One rule for every comparison of generated tokens
(fidelity against MiniMind's code, a cache dtype against float32's, an export against kvlab's generate).

Free of PyTorch.
"""

from __future__ import annotations


def first_difference(ours, theirs) -> int | None:
    """The first position where the two sequences differ (the shorter one's length where one is the
    other's start), None where they are the same."""
    ours, theirs = list(ours), list(theirs)
    if ours == theirs:
        return None
    return next((index for index, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
