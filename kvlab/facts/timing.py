"""How the lab times a piece of work and says how far to trust the number: every sample kept, the
median with its spread, and one stated rule for a timing too noisy to read.

The rule is torch.utils.benchmark's: a timing is *unstable* when its interquartile range (IQR) is
10% of its median or more. A measurement repeats until its spread is below that or its time is up,
so a quiet machine stays fast and a busy one measures longer. A ratio of two timings (the cache's
speedup) carries an interval from the quartiles of both: from the slow side's first quartile over
the fast side's third to the slow side's third quartile over the fast side's first. Two timings, or
two ratios, are told apart only when their intervals do not overlap.

Free of PyTorch: the report and `check` read these summaries; the timed steps call `repeat` with
the work to time.
"""

from __future__ import annotations

import math
import time

import numpy as np

# A timing is unstable when IQR / median reaches this.
UNSTABLE_IQR_SHARE = 0.10


def summary(samples) -> dict:
    """n, median, quartiles, IQR, mean, standard deviation (n - 1) and whether the spread makes the
    timing unstable, of seconds `samples`."""
    values = np.asarray(samples, dtype=float)
    q1, median, q3 = (float(x) for x in np.percentile(values, [25, 50, 75]))
    iqr = q3 - q1
    share = iqr / median if median > 0 else math.inf
    return {
        "n": int(values.size),
        "median_s": median,
        "q1_s": q1,
        "q3_s": q3,
        "iqr_s": iqr,
        "mean_s": float(values.mean()),
        "std_s": float(values.std(ddof=1)) if values.size > 1 else 0.0,
        "iqr_share": share,
        "unstable": bool(share >= UNSTABLE_IQR_SHARE),
    }


def ratio_interval(slow: dict, fast: dict) -> dict:
    """slow / fast (e.g. without the cache over with it) from two summaries: the ratio of the
    medians, and the interval from the ratio of their quartiles."""
    return {
        "ratio": slow["median_s"] / fast["median_s"],
        "low": slow["q1_s"] / fast["q3_s"],
        "high": slow["q3_s"] / fast["q1_s"],
    }


def spread_columns(summaries: dict[str, dict], speedup: dict) -> dict:
    """The columns that give a table's row of a speedup its spread (sweep.csv, compare.csv): the
    interval, each mode's number of runs and IQR share (`summaries` by mode), and whether either
    mode was unstable."""
    return {
        "speedup_low": speedup["low"],
        "speedup_high": speedup["high"],
        **{f"{mode}_n": summary["n"] for mode, summary in summaries.items()},
        **{f"{mode}_iqr_share": summary["iqr_share"] for mode, summary in summaries.items()},
        "unstable": any(summary["unstable"] for summary in summaries.values()),
    }


def overlap(first: tuple[float, float], second: tuple[float, float]) -> bool:
    """Whether two intervals (low, high) share any value."""
    return first[0] <= second[1] and second[0] <= first[1]


def repeat(run, repeats: int, max_seconds: float, clock=time.perf_counter) -> list[float]:
    """Seconds of `run()` timed again and again: at least `repeats` times, then until the spread is
    under the rule (IQR / median below 10%) or `max_seconds` of timing have passed. `run` does its
    own synchronisation (a GPU's) before returning."""
    samples: list[float] = []
    spent = 0.0
    while len(samples) < repeats or (summary(samples)["unstable"] and spent < max_seconds):
        start = clock()
        run()
        samples.append(clock() - start)
        spent += samples[-1]
    return samples
