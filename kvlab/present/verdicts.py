"""The verdicts the report's sentences are chosen by: how a sequence moves, which of two sides is
larger, where a measured interval lies against a value, how a sequence of intervals moves. Each is a
word computed from the numbers, so that no sentence claims what the numbers do not show."""

from __future__ import annotations

# How consistently a sequence must move for the report to call it a trend (Kendall's tau).
TREND_TAU = 0.6


def direction(values) -> str:
    """How a sequence moves with its index: "flat" (all equal), "up" or "down" when Kendall's tau
    with the index is at least TREND_TAU in size and the ends agree, else "mixed". A noisy but
    clearly rising curve is "up"; a curve that goes up and comes back is not."""
    values = list(values)
    if len(set(values)) <= 1:
        return "flat"
    pairs = [(a, b) for i, a in enumerate(values) for b in values[i + 1:]]
    tau = sum((b > a) - (b < a) for a, b in pairs) / len(pairs)
    if tau >= TREND_TAU and values[-1] > values[0]:
        return "up"
    if tau <= -TREND_TAU and values[-1] < values[0]:
        return "down"
    return "mixed"


def comparison(pairs) -> str:
    """For (a, b) pairs: "first" if a is at least b in every pair and above it in one, "second" the
    other way round, "equal" if every pair ties, else "mixed" (the order changes)."""
    pairs = list(pairs)
    if not pairs or all(a == b for a, b in pairs):
        return "equal"
    if all(a >= b for a, b in pairs):
        return "first"
    if all(a <= b for a, b in pairs):
        return "second"
    return "mixed"


def against(interval: tuple[float, float], value: float) -> str:
    """Where a measured interval (low, high) lies against a value: "below", "above", or "within"
    (this machine cannot tell them apart)."""
    low, high = interval
    if high < value:
        return "below"
    if low > value:
        return "above"
    return "within"


def interval_direction(intervals) -> str:
    """How a sequence of intervals (low, high) moves: "up" when each lies wholly above the one before,
    "down" wholly below, "unclear" when some neighbours overlap (the spreads cannot tell them apart),
    "single" for one."""
    intervals = list(intervals)
    if len(intervals) < 2:
        return "single"
    pairs = list(zip(intervals, intervals[1:]))
    if all(after[0] > before[1] for before, after in pairs):
        return "up"
    if all(after[1] < before[0] for before, after in pairs):
        return "down"
    return "unclear"
