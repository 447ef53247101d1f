"""The sampling knobs of MiniMind's `generate`, one small function each.

`generate` applies them in this order to the last position's logits:
temperature, repetition penalty, top-k, top-p. Every experiment that needs one
of these rules calls the function here, so there is exactly one definition of
each rule in the project.
"""

import math
import threading

import numpy as np
import torch

# The lab sheet's greedy knobs: the argmax, top-k and top-p off (every greedy generation in kvlab).
GREEDY = dict(do_sample=False, top_k=0, top_p=1.0)


def check_temperature(temperature: float, do_sample: bool) -> None:
    """Sampling at a temperature <= 0 is undefined (MiniMind would divide by zero
    and sample from NaN), so it is refused."""
    if do_sample and temperature <= 0:
        raise ValueError(f"temperature must be > 0 when sampling (do_sample=True), got {temperature}")


def apply_temperature(logits: torch.Tensor, temperature: float, do_sample: bool) -> torch.Tensor:
    """Divide logits by the temperature, as MiniMind does before any other knob.

    Greedy decoding only takes the argmax, which a positive scale cannot
    change, so a temperature <= 0 there leaves the logits as they are.
    """
    check_temperature(temperature, do_sample)
    if temperature > 0:
        return logits / temperature
    return logits


def apply_repetition_penalty(logits: torch.Tensor, seen_ids: torch.Tensor | None, penalty: float) -> torch.Tensor:
    """Sign-aware repetition penalty over the ids each row has seen.

    logits: (batch, vocab); seen_ids: (batch, length), every id already in the row.
    A seen token's positive logit is divided by the penalty, a negative one multiplied.
    """
    if penalty == 1.0:
        return logits
    seen = torch.zeros_like(logits, dtype=torch.bool)
    seen.scatter_(1, seen_ids, True)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (and any tied with the k-th); the rest become -inf."""
    if k <= 0:
        return logits
    kth_largest = torch.topk(logits, k)[0][..., -1, None]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_keep(logits: torch.Tensor, p: float) -> torch.Tensor:
    """MiniMind's nucleus rule: a boolean mask of the tokens that survive top-p.

    Sort each row by logit, descending; a token is cut when the cumulative
    softmax probability *before it* already exceeds p. Equivalently: the mask
    "cumsum > p" is shifted right by one slot, so the token that first crosses p
    survives, and the top token always survives.

    logits: (batch, vocab) -> bool mask of the same shape, True = kept.
    """
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
    cut_sorted = torch.zeros_like(cumulative, dtype=torch.bool)
    cut_sorted[..., 1:] = cumulative[..., :-1] > p
    cut = cut_sorted.scatter(-1, sorted_indices, cut_sorted)
    return ~cut


def top_p_kept(logits: torch.Tensor, p: float) -> torch.Tensor:
    """What `generate` keeps at top-p `p`: every token when p >= 1 (it skips the rule there, as MiniMind
    does), else `top_p_keep`'s mask. Counting the rule's mask at p = 1 would cut the tail whose
    cumulative sum rounds past 1.0 in float, which `generate` never does."""
    if p >= 1.0:
        return torch.ones_like(logits, dtype=torch.bool)
    return top_p_keep(logits, p)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Set every logit that `top_p_kept` cuts to -inf (no-op when p >= 1)."""
    if p >= 1.0:
        return logits
    return logits.masked_fill(~top_p_kept(logits, p), float("-inf"))


def pick(logits: torch.Tensor, seen_ids: torch.Tensor | None, *, temperature: float, top_k: int, top_p: float,
         repetition_penalty: float, do_sample: bool, generator: torch.Generator | None = None,
         greedy: torch.Tensor | None = None) -> torch.Tensor:
    """`generate`'s next token of each row (batch, 1) from its last logits (batch, vocab), the knobs in
    MiniMind's order: temperature, repetition penalty, top-k, top-p, then a draw or the argmax. The one
    call every generation step makes (the model's, the compiled step's, the serving engine's).
    `seen_ids` (batch, length), each row's ids so far, is read only by a repetition penalty (None
    without one). `generator` is the one the draw uses (see draw_or_argmax). `greedy`: where the
    caller's step already took argmax(logits / temperature) itself (a compiled step), those ids, used
    where the knobs are `is_greedy`. Every step but the draw treats each row apart: rows picked
    together get what each would get alone."""
    if greedy is not None and is_greedy(temperature, top_k, top_p, repetition_penalty, do_sample):
        return greedy
    logits = apply_temperature(logits, temperature, do_sample)
    logits = apply_repetition_penalty(logits, seen_ids, repetition_penalty)
    logits = top_k_filter(logits, top_k)
    logits = top_p_filter(logits, top_p)
    return draw_or_argmax(logits, do_sample, generator)


def draw_or_argmax(logits: torch.Tensor, do_sample: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from softmax(logits), or take the argmax. Returns (batch, 1).

    The draw uses `generator`, or PyTorch's global one when None (as `generate` does, so
    `torch.manual_seed(s)` before it fixes its draws; a `torch.Generator().manual_seed(s)` gives the
    same stream). One call draws every row: on the CPU it consumes random numbers for each element of
    the (batch, vocab) tensor, so the rows drawn together decide what the next call sees."""
    if do_sample:
        return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1, generator=generator)
    if _numpy_picks(logits):
        # NumPy's argmax gives torch.argmax's index (the first largest; a NaN counts as the largest in
        # both) some ten times faster on a CPU: 11 us against 109 us for 64 rows of 1,884 (measured)
        return torch.from_numpy(logits.detach().numpy().argmax(axis=-1).astype(np.int64)[..., None])
    return torch.argmax(logits, dim=-1, keepdim=True)


def _numpy_picks(logits: torch.Tensor) -> bool:
    """Whether NumPy takes the greedy pick: logits on a CPU in float32 or float64."""
    return logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64)


def greedy_pick_rows(logits: torch.Tensor, temperatures: list[float]) -> list[int]:
    """Each row's argmax(logits / its temperature) (every temperature > 0): `pick`'s choice where
    the knobs are `is_greedy`, rows of other temperatures in one call. On a CPU in float32 or
    float64 by NumPy (its division rounds as torch's does; its argmax gives torch.argmax's index, see
    `draw_or_argmax`), into a buffer kept for the next call; elsewhere row by row, as
    `apply_temperature`."""
    if _numpy_picks(logits):
        values = logits.detach().numpy()
        quotients = _scratch(values.shape, values.dtype)
        np.divide(values, np.asarray(temperatures, dtype=values.dtype)[:, None], out=quotients)
        return quotients.argmax(axis=-1).tolist()
    return [int(torch.argmax(row / temperature)) for row, temperature in zip(logits, temperatures)]


def greedy_pick(logits: torch.Tensor, temperature: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """argmax(logits / temperature) per row, in torch, where a compiled step makes `is_greedy`'s choice
    itself (temperature a tensor of the logits' dtype: one for every row, or one per row (R, 1)). In
    float32 the quotients are `greedy_pick_rows`'s (one IEEE division each) and the argmax its index."""
    return torch.argmax(logits / temperature, dim=-1, keepdim=keepdim)


def greedy_pick_exact(dtype: torch.dtype) -> bool:
    """Whether `greedy_pick` in this dtype chooses as `greedy_pick_rows` does: float32 and float64; in a
    narrower type the temperature rounds to it before the division, where `greedy_pick_rows` divides by
    the Python float."""
    return dtype in (torch.float32, torch.float64)


_SCRATCH = threading.local()


def _scratch(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A buffer of `shape` this thread reuses: a fresh one each step (hundreds of kB) would be mapped
    and faulted in anew by the C library, which cost more than the division itself (measured)."""
    size = math.prod(shape)
    buffer = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.dtype != dtype or buffer.size < size:
        buffer = _SCRATCH.buffer = np.empty(size, dtype=dtype)
    return buffer[:size].reshape(shape)


def is_greedy(temperature: float, top_k: int, top_p: float, repetition_penalty: float, do_sample: bool) -> bool:
    """Whether `pick` under these knobs is `argmax(logits / temperature)`: no draw, no repetition
    penalty, top-k and top-p off (each keeps the largest logit, but at a tie top-p could keep another),
    a temperature above 0. A compiled step makes that choice itself (kvlab.engine.fast)."""
    return not do_sample and repetition_penalty == 1.0 and top_k <= 0 and top_p >= 1.0 and temperature > 0
