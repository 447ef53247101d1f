"""Requests arriving at random, as a serving benchmark sends them: a Poisson process, exponential gaps
at a rate, seeded. One home for the trace rule (on the engine's step clock), serve_bench (in seconds,
over HTTP) and tools/serve_demo.py."""

from __future__ import annotations

import math
import random


def poisson_arrivals(count: int, rate: float, seed, until: float = math.inf) -> list[float]:
    """Up to `count` arrival times of a Poisson process of `rate` per unit of time (gaps drawn by
    `random.Random(seed).expovariate(rate)`), the first at 0, none after `until`. An infinite rate
    sends all `count` at 0."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(seed)
    clock, arrivals = 0.0, []
    for index in range(count):
        if index:
            clock += rng.expovariate(rate)
        if clock > until:
            break
        arrivals.append(clock)
    return arrivals
