"""The verdicts the reports' sentences are chosen by. Each is a word computed from the numbers (and
their spreads), tested on thousands of drawn cases (tests/test_verdicts.py): a template never states
a comparison of its own, it picks the sentence that belongs to the verdict.

Intervals are (low, high) pairs, e.g. a speedup's interval from both timings' quartiles
(kvlab.facts.timing.ratio_interval). Two intervals are told apart only when they do not meet.
"""

from __future__ import annotations

import numpy as np

# How consistently a sequence of counts must move for the report to call it a trend (Kendall's tau).
TREND_TAU = 0.6


def direction(values) -> str:
    """How a sequence of exact counts moves with its index: "flat" (all equal), "up" or "down" when
    Kendall's tau with the index is at least TREND_TAU in size and the ends agree, else "mixed". A
    noisy but clearly rising curve is "up"; a curve that goes up and comes back is not."""
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
    """For (a, b) pairs of exact counts: "first" if a is at least b in every pair and above it in one,
    "second" the other way round, "equal" if every pair ties, else "mixed" (the order changes)."""
    pairs = list(pairs)
    if not pairs or all(a == b for a, b in pairs):
        return "equal"
    if all(a >= b for a, b in pairs):
        return "first"
    if all(a <= b for a, b in pairs):
        return "second"
    return "mixed"


# Exact counts this close (a share of the larger) are "about the same": 1,847 against 1,845 candidates
# tells no distribution flatter than the other.
CLOSE_COUNTS = 0.05


def close_counts(pairs, share: float = CLOSE_COUNTS) -> bool:
    """Whether every (a, b) pair of exact counts differs by at most `share` of the larger."""
    return all(abs(a - b) <= share * max(a, b) for a, b in pairs)


def against(interval: tuple[float, float], value: float) -> str:
    """Where a measured interval lies against a value: "above" (wholly above it), "below" (wholly
    below), or "within" (it holds the value: this machine cannot tell them apart)."""
    low, high = interval
    if low > value:
        return "above"
    if high < value:
        return "below"
    return "within"


def value_against(value: float, interval: tuple[float, float]) -> str:
    """Where a value (a prediction, a bound) lies against a measured interval: "above", "below" or
    "within". The mirror of `against`, named for the value, so a sentence about the value reads it."""
    return {"above": "below", "below": "above", "within": "within"}[against(interval, value)]


def order(first: tuple[float, float], second: tuple[float, float]) -> str:
    """The first interval against the second: "above" (its low above the other's high), "below", or
    "overlap" (they meet: the spreads cannot tell them apart)."""
    if first[0] > second[1]:
        return "above"
    if first[1] < second[0]:
        return "below"
    return "overlap"


def steps(intervals) -> list[str]:
    """Each neighbour's verdict in a sequence of intervals: "rises", "falls" or "unclear" (they
    meet), one word per step from one interval to the next. The report says a trend step by step:
    "rises from lab to mid, then cannot tell"."""
    intervals = list(intervals)
    words = {"above": "rises", "below": "falls", "overlap": "unclear"}
    return [words[order(after, before)] for before, after in zip(intervals, intervals[1:])]


def trend(intervals) -> str:
    """The whole sequence's verdict: "up" or "down" when every step rises or every step falls,
    "single" for fewer than two, else "mixed" (some steps unclear or the way changes)."""
    words = steps(intervals)
    if not words:
        return "single"
    if all(word == "rises" for word in words):
        return "up"
    if all(word == "falls" for word in words):
        return "down"
    return "mixed"


def agreement(intervals) -> dict:
    """Whether measurements of one quantity agree: "agree" when every pair of intervals meets,
    else "disagree", with the index pairs that are apart."""
    intervals = list(intervals)
    apart = [(i, j) for i in range(len(intervals)) for j in range(i + 1, len(intervals))
             if order(intervals[i], intervals[j]) != "overlap"]
    return {"verdict": "disagree" if apart else "agree", "apart": apart}


def on_clock(wall: dict, cpu: dict | None) -> dict:
    """A timed ratio judged on the clock that tells the truth: `wall` and `cpu` are the same comparison
    on the wall clock (what a person waited) and on the timing thread's CPU clock (what the work cost),
    each a dict with ratio, low, high and `contended` (either side's runs waited for the CPU). The wall
    clock's when neither side waited; the CPU clock's when one did, since the wall then counts another
    program's time as this one's (a result written before the CPU clock was read, `cpu` None, keeps
    the wall's). Returns the chosen ratio, its interval, its verdict against 1 (`against`) and `clock`
    ("wall" or "cpu"), and the chosen one's other keys (what names its timings, for their marks)."""
    chosen, clock = (cpu, "cpu") if wall["contended"] and cpu is not None else (wall, "wall")
    return {**chosen, "verdict": against((chosen["low"], chosen["high"]), 1.0), "clock": clock}


def one_clock(walls, cpus) -> dict:
    """A comparison over several timed values (a throughput at each batch size, a speedup at each model
    size) judged on one clock, so that no two values are read on different clocks: the CPU clock's
    when any of them waited for its CPU (a wall value's `contended`) and every one has a CPU value,
    else the wall clock's. `walls` and `cpus`: dicts of value, low, high (and `contended` for the
    wall's; a cpu entry may be None). Returns {clock, values: the chosen dicts, intervals: their
    (low, high)}."""
    walls, cpus = list(walls), list(cpus)
    on_cpu = any(wall.get("contended") for wall in walls) and len(cpus) == len(walls) and all(
        cpu is not None for cpu in cpus)
    chosen = cpus if on_cpu else walls
    return {"clock": "cpu" if on_cpu else "wall", "values": chosen,
            "intervals": [(value["low"], value["high"]) for value in chosen]}


def growth(early, late) -> str:
    """Whether a quantity measured at many points grows from the first points to the last (a cached
    step's time from short contexts to long ones): "grows" when the quartiles of the `late` values lie
    wholly above those of the `early` ones, "shrinks" when wholly below, else "flat" (they meet)."""
    quartiles = [(float(np.percentile(values, 25)), float(np.percentile(values, 75))) for values in (early, late)]
    return {"above": "grows", "below": "shrinks", "overlap": "flat"}[order(quartiles[1], quartiles[0])]


def gap_cause(predicted: dict, outside: dict, measured: tuple[float, float], cached_growth: str) -> str:
    """Why a per-step fit's predicted speedup misses the speedup measured on whole generations: the fit
    models only the forward calls, so each mode's generation also spends `outside` seconds between them
    (the loop, sampling: its whole time less its steps'). `predicted`: each mode's time by the fit
    ({"with_cache", "without_cache"} seconds). "outside" when counting that time brings the prediction
    into the `measured` interval; else "context" when the cached steps grow with the context they
    attend over (`cached_growth`, `growth`): attention over a longer cache, which the line (a cost per
    token fed) cannot see; else "unexplained"."""
    with_cache = predicted["with_cache"] + outside["with_cache"]
    if with_cache > 0:
        counted = (predicted["without_cache"] + outside["without_cache"]) / with_cache
        if value_against(counted, measured) == "within":
            return "outside"
    return "context" if cached_growth == "grows" else "unexplained"
