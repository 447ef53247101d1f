"""How the lab times a piece of work and says how far to trust the number: every sample kept, the
median with its spread, and one stated rule for a timing too noisy to read.

The rule is torch.utils.benchmark's: a timing is *unstable* when its interquartile range (IQR) is
10% of its median or more. A measurement repeats until its spread is below that or its time is up,
so a quiet machine stays fast and a busy one measures longer. A ratio of two timings (the cache's
speedup) carries an interval from the quartiles of both: from the slow side's first quartile over
the fast side's third to the slow side's third quartile over the fast side's first. Two timings, or
two ratios, are told apart only when their intervals do not overlap.

A small spread is not a quiet machine: a neighbour on the timed core slows every run alike and the
IQR stays small. So each run also reads the process's own clocks (`read_usage`): the CPU time of the
thread that times it, the CPU time of the whole process, its involuntary context switches
(getrusage) and the 1-minute load average. A run is *contended* when the timing thread was on a CPU
for less than CONTENDED_CPU_SHARE of the run's wall time: it was ready to run and waited, or slept.
The rule reads the timing thread and not the process's CPU time over wall time x threads: with
more than one thread the process's share depends on how much of the work is parallel and on how
long idle workers spin, while the timing thread (the one that runs Python and hands out torch's
parallel work) runs the whole run on a machine that gives it its core. A timing is contended when
CONTENDED_RUNS_SHARE of its runs or more were: then its quartiles, which the speedup's interval is
read from, may be contended runs. On a GPU the CPU waits for the device by design, so its share says
nothing about the machine: such a timing is "not judged" (its numbers are kept).

Two clocks, two questions. The wall clock (perf_counter) is what a person waited: the sheet's
time.json keeps its medians. The timing thread's CPU clock is what the work cost: a run that waited
for its CPU counts another program's time on the wall, not on the CPU (`cpu_seconds`). A comparison
of two timings is judged on the CPU clock when either was contended, on the wall clock when neither
was (kvlab.present.verdicts.on_clock). The CPU clock is closer to the truth, not exact: a neighbour
on the same physical core still slows the work's own cycles, so a CPU-clock value keeps its interval
and is this run's.

Free of PyTorch: the report and `check` read these summaries; the timed steps call `repeat` with
the work to time (and a `usage` dict, from `empty_usage`, to read the clocks of every run).
"""

from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

import numpy as np

try:
    import resource
except ImportError:  # Windows has no getrusage: no context switches to count there
    resource = None

# A timing is unstable when IQR / median reaches this.
UNSTABLE_IQR_SHARE = 0.10
# A run is contended when its timing thread was on a CPU for less than this share of its wall time
# (measured in docs/results.md, "Reading a timing's spread": 1.00 in runs nothing took from, half
# or less beside one busy neighbour on the core).
CONTENDED_CPU_SHARE = 0.90
# A timing is contended when this share of its runs or more were contended.
CONTENDED_RUNS_SHARE = 0.25
# What each run records of the process's own clocks (`repeat`'s `usage`), one list a key: the wall
# seconds the clocks were read over (the sample and the few microseconds of reading them), the CPU
# seconds of the thread that timed the run and of the whole process (user + system, every thread),
# the involuntary context switches of the process, and the 1-minute load average after the run.
USAGE_KEYS = ("wall_s", "thread_cpu_s", "cpu_s", "switches", "load_1m")


class Reading(NamedTuple):
    """The process's clocks at one moment (`read_usage`)."""

    wall: float
    thread_cpu: float
    cpu: float
    switches: int
    load_1m: float


def read_usage() -> Reading:
    """Now: perf_counter, this thread's and this process's CPU seconds, the process's involuntary
    context switches so far (getrusage's ru_nivcsw; 0 where there is no getrusage) and the 1-minute
    load average (NaN where the system has none)."""
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw if resource is not None else 0
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = math.nan
    return Reading(time.perf_counter(), time.thread_time(), time.process_time(), switches, load)


def clocks() -> tuple[float, float]:
    """Now on the two clocks a timing reads: the wall clock (perf_counter) and this thread's CPU clock."""
    return time.perf_counter(), time.thread_time()


def elapsed(began: tuple[float, float]) -> tuple[float, float]:
    """Wall and this thread's CPU seconds since `began` (a `clocks()`)."""
    wall, cpu = clocks()
    return wall - began[0], cpu - began[1]


def empty_usage() -> dict[str, list]:
    """A `usage` for `repeat` to fill: one list a key of USAGE_KEYS."""
    return {key: [] for key in USAGE_KEYS}


def judged_on(device) -> bool:
    """Whether a timing on `device` ("cpu", "cuda:0", a torch.device) is judged for contention: not on
    a GPU, where the CPU waits for the device by design and its share of the wall time says nothing."""
    return not str(device).startswith("cuda")


def run_contended(wall_s: float, thread_cpu_s: float) -> bool:
    """The rule for one run: its timing thread was on a CPU for less than CONTENDED_CPU_SHARE of it."""
    return thread_cpu_s < CONTENDED_CPU_SHARE * wall_s


def contention(usage: dict | None, judged: bool = True) -> dict:
    """What a timing's `usage` (per-run clocks, USAGE_KEYS) says about the machine: `contended` (a
    bool: CONTENDED_RUNS_SHARE of the runs or more contended; False when not judged), `contention`
    ("judged", "not judged" on a GPU, "not measured" without usage), `contended_runs` (the share of
    runs contended), the medians of the runs' `cpu_share` (timing thread's CPU over wall) and
    `process_cpu_share` (every thread's, which can pass 1 with several threads), the median CPU share
    of the contended runs alone (`contended_cpu_share`: under the rule by definition; None when no run
    was), `switches_per_s` (involuntary context switches per second over all runs) and `load_1m` (the
    highest 1-minute load average after a run). The numbers are None without usage."""
    if not usage or not usage.get("wall_s"):
        return {"contended": False, "contention": "not measured", "contended_runs": None, "cpu_share": None,
                "process_cpu_share": None, "contended_cpu_share": None, "switches_per_s": None, "load_1m": None}
    wall = np.asarray(usage["wall_s"], dtype=float)
    thread_cpu = np.asarray(usage["thread_cpu_s"], dtype=float)
    per_wall = np.where(wall > 0, wall, 1.0)  # a run too short for the clock took nothing from anyone
    flags = [run_contended(w, c) for w, c in zip(wall, thread_cpu)]
    share = sum(flags) / len(flags)
    shares = np.where(wall > 0, thread_cpu / per_wall, 1.0)
    waited = [float(x) for x, flag in zip(shares, flags) if flag]
    loads = [load for load in usage["load_1m"] if not math.isnan(load)]
    total = float(wall.sum())
    return {
        "contended": bool(judged and share >= CONTENDED_RUNS_SHARE),
        "contention": "judged" if judged else "not judged",
        "contended_runs": share,
        "cpu_share": float(np.median(shares)),
        "process_cpu_share": float(np.median(np.where(wall > 0, np.asarray(usage["cpu_s"], dtype=float) / per_wall,
                                                      1.0))),
        "contended_cpu_share": float(np.median(waited)) if waited else None,
        "switches_per_s": float(sum(usage["switches"])) / total if total > 0 else 0.0,
        "load_1m": max(loads) if loads else None,
    }


def summary(samples, usage: dict | None = None, judged: bool = True) -> dict:
    """n, median, quartiles, IQR, mean, standard deviation (n - 1) and whether the spread makes the
    timing unstable, of seconds `samples`; and what the runs' `usage` (filled by `repeat`) says of the
    machine (`contention`: contended or not; judged only where `judged`, see `judged_on`)."""
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
        **contention(usage, judged),
    }


def ratio_interval(slow: dict, fast: dict) -> dict:
    """slow / fast (e.g. without the cache over with it) from two summaries: the ratio of the
    medians, the interval from the ratio of their quartiles, and `contended` when either timing was
    (a ratio of contended runs is not the machine's)."""
    return {
        "ratio": slow["median_s"] / fast["median_s"],
        "low": slow["q1_s"] / fast["q3_s"],
        "high": slow["q3_s"] / fast["q1_s"],
        "contended": bool(slow.get("contended") or fast.get("contended")),
    }


def spread_columns(summaries: dict[str, dict], speedup: dict) -> dict:
    """The columns that give a table's row of a speedup its spread (sweep.csv, compare.csv): the
    interval, each mode's number of runs, IQR share, median CPU share, share of contended runs and
    those runs' median CPU share (`summaries` by mode), whether either mode was unstable, whether
    either was contended, and how contention was judged (the first mode's `contention`: both run on
    one device)."""
    modes = list(summaries.values())
    return {
        "speedup_low": speedup["low"],
        "speedup_high": speedup["high"],
        **{f"{mode}_n": summary["n"] for mode, summary in summaries.items()},
        **{f"{mode}_iqr_share": summary["iqr_share"] for mode, summary in summaries.items()},
        "unstable": any(summary["unstable"] for summary in modes),
        **{f"{mode}_cpu_share": summary.get("cpu_share") for mode, summary in summaries.items()},
        **{f"{mode}_contended_runs": summary.get("contended_runs") for mode, summary in summaries.items()},
        **{f"{mode}_contended_cpu_share": summary.get("contended_cpu_share") for mode, summary in summaries.items()},
        "contended": any(summary.get("contended", False) for summary in modes),
        "contention": modes[0].get("contention", "not measured") if modes else "not measured",
    }


def cpu_seconds(usage: dict | None, samples=None) -> list[float] | None:
    """Each run's seconds on the timing thread's CPU clock, from the run's `usage` (USAGE_KEYS): its
    thread CPU seconds; or, for `samples` timed inside the runs (a decode within a generation, a step
    within it), each sample times its run's CPU share (thread CPU over wall, at most 1: the part of the
    run's wall time the thread was on a CPU). None without usage for every run (or sample)."""
    if not usage or not usage.get("wall_s") or not usage.get("thread_cpu_s"):
        return None
    wall = np.asarray(usage["wall_s"], dtype=float)
    thread_cpu = np.asarray(usage["thread_cpu_s"], dtype=float)
    if samples is None:
        return [float(x) for x in thread_cpu]
    samples = np.asarray(samples, dtype=float)
    if samples.size != wall.size:
        return None
    share = np.minimum(np.where(wall > 0, thread_cpu / np.where(wall > 0, wall, 1.0), 1.0), 1.0)
    return [float(x) for x in samples * share]


def cpu_summary(usage: dict | None, samples=None) -> dict | None:
    """`summary` of a timing on the CPU clock (`cpu_seconds`), or None without usage."""
    seconds = cpu_seconds(usage, samples)
    return summary(seconds) if seconds else None


def clocked_ratio(slow: dict, fast: dict, slow_usage: dict | None, fast_usage: dict | None,
                  slow_samples=None, fast_samples=None) -> dict:
    """slow / fast on both clocks: {"wall": ratio_interval of the summaries (its `contended` when
    either was), "cpu": the same on the CPU clock (`cpu_summary` of each side's usage, and samples
    when they are parts of the runs), or None without usage}."""
    wall = ratio_interval(slow, fast)
    slow_cpu, fast_cpu = cpu_summary(slow_usage, slow_samples), cpu_summary(fast_usage, fast_samples)
    cpu = None
    if slow_cpu and fast_cpu and slow_cpu["median_s"] > 0 and fast_cpu["median_s"] > 0 and fast_cpu["q1_s"] > 0:
        cpu = {**ratio_interval(slow_cpu, fast_cpu), "contended": wall["contended"]}
    return {"wall": wall, "cpu": cpu}


def fit_step_cost(fed_tokens, seconds) -> dict:
    """Least squares: seconds = fixed + per_token * fed_tokens. Returns both and R²."""
    x = np.asarray(fed_tokens, dtype=float)
    y = np.asarray(seconds, dtype=float)
    design = np.column_stack([np.ones_like(x), x])
    (fixed, per_token), *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - (fixed + per_token * x)
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / spread if spread > 0 else 1.0
    return {"fixed_s": float(fixed), "per_token_s": float(per_token), "r2": r2,
            "fed_min": int(x.min()), "fed_max": int(x.max()), "points": len(x)}


def predict_time(fed_tokens, fit: dict) -> float:
    """The fitted model's time for a generation that feeds `fed_tokens` (one entry per step)."""
    return sum(fit["fixed_s"] + fit["per_token_s"] * fed for fed in fed_tokens)


def overlap(first: tuple[float, float], second: tuple[float, float]) -> bool:
    """Whether two intervals (low, high) share any value."""
    return first[0] <= second[1] and second[0] <= first[1]


def repeat(run, repeats: int, max_seconds: float, clock=time.perf_counter, usage: dict | None = None,
           read=read_usage) -> list[float]:
    """Seconds of `run()` timed again and again: at least `repeats` times, then until the spread is
    under the rule (IQR / median below 10%) or `max_seconds` of timing have passed. `run` does its
    own synchronisation (a GPU's) before returning. With a `usage` (from `empty_usage`), each run
    appends to it what `read` (`read_usage`) saw change around it: USAGE_KEYS."""
    samples: list[float] = []
    spent = 0.0
    while len(samples) < repeats or (summary(samples)["unstable"] and spent < max_seconds):
        before = read() if usage is not None else None
        start = clock()
        run()
        samples.append(clock() - start)
        if usage is not None:
            after = read()
            usage["wall_s"].append(after.wall - before.wall)
            usage["thread_cpu_s"].append(after.thread_cpu - before.thread_cpu)
            usage["cpu_s"].append(after.cpu - before.cpu)
            usage["switches"].append(after.switches - before.switches)
            usage["load_1m"].append(after.load_1m)
        spent += samples[-1]
    return samples

