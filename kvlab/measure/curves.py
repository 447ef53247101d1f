"""Beyond the lab sheet: the lab's measurements repeated over a range of a knob.

Every curve calls the lab's own functions (kvlab.measure.steps) at each point, so a curve
and the lab step it extends can never disagree about the rule they measure:

  * cost_sweep        steps 1-3 (fed tokens, same ids, median time) for several N;
  * step_latency      step 3's generation, timed one forward call at a time;
  * topp_curve        step 6's survivors for a grid of p;
  * temp_curve        step 5's distinct answers for a grid of temperatures and the
                      sheet's own, with the entropy of the distribution each token
                      was drawn from.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from kvlab.engine import sampling
from kvlab.engine.device import timing_context
from kvlab.measure import steps
from kvlab.facts import timing
from kvlab.facts.budget import KEPT_RUNGS, Budget, scaled
from kvlab.facts.formulas import MODES, fed_formulas
from kvlab.facts.timing import fit_step_cost, predict_time  # noqa: F401  (the per-step fit, torch-free)

log = logging.getLogger("kvlab")


def grid(start: float, stop: float, step: float) -> list[float]:
    """start, start + step, ..., up to stop (included when the step lands on it), rounded so that
    0.1 * 3 prints as 0.3: the values become JSON/CSV keys the way the lab writes them."""
    if step <= 0 or stop < start:
        raise ValueError(f"empty grid: start={start}, stop={stop}, step={step}")
    count = int(np.floor((stop - start) / step + 1e-9)) + 1
    return [round(start + k * step, 6) for k in range(count)]


# ---------------------------------------------------------------------------
# Cost curves: steps 1-3 at every N
# ---------------------------------------------------------------------------


def repeats_for(new_tokens: int, repeats: int, long_from: int | None, long_repeats: int) -> int:
    """Timed runs at N: `repeats`, or `long_repeats` from N = long_from up (the long runs cost most)."""
    if long_from is not None and new_tokens >= long_from:
        return long_repeats
    return repeats


def cost_sweep(model, prompt_ids: list[int], new_tokens_list, warmup: int, repeats: int,
               long_from: int | None, long_repeats: int, max_seconds: float, device,
               budget: Budget | None = None) -> tuple[list[dict], dict]:
    """For each N: the lab's greedy pair (fed tokens counted, same ids) and its timing, step 3's own
    (`steps.time_generation`: repeated while unstable, for at most `max_seconds` a mode).

    The counted generations of steps 1-2 are the first warm-up of each mode; `warmup - 1`
    more untimed runs follow inside `time_generation`. The Ns are taken from the smallest up within
    `budget` (kvlab.facts.budget): each next N's seconds predicted from the last N measured, scaled by
    the tokens both modes feed in all its runs (the no-cache side's grow with N squared); an N that
    would not fit, and every larger one, is cut. Returns one row per N measured, and every timing's
    samples and summaries by N, with what the budget cut."""
    budget = budget or Budget(None)
    prompt_len = len(prompt_ids)
    runs: dict = {}
    new_tokens_list = sorted(new_tokens_list)

    def work(new_tokens: int) -> float:  # tokens fed by every run at N, both modes
        fed = fed_formulas(prompt_len, new_tokens)
        return (fed["with_cache"] + fed["without_cache"]) * (warmup + repeats_for(new_tokens, repeats, long_from,
                                                                                     long_repeats))

    def measure(new_tokens: int) -> tuple[dict, float]:
        began = time.perf_counter()
        row, runs[str(new_tokens)] = sweep_point(model, prompt_ids, new_tokens, warmup, repeats, long_from,
                                                 long_repeats, max_seconds, device)
        log.info("[%d/%d] N=%d: fed %d / %d (formulas %d / %d), median %.4f s / %.4f s over %d / %d runs; "
                 "%.1f s so far", new_tokens_list.index(new_tokens) + 1, len(new_tokens_list), new_tokens,
                 row["fed_with_cache"], row["fed_without_cache"], row["formula_with_cache"],
                 row["formula_without_cache"], row["with_cache_s"], row["without_cache_s"], row["with_cache_n"],
                 row["without_cache_n"], budget.spent())
        return row, time.perf_counter() - began

    def predict(new_tokens: int, done: list) -> float:
        last, _, seconds = done[-1]
        return scaled(seconds, work(last), work(new_tokens))

    rows = budget.take(new_tokens_list, measure, predict, name=lambda n: f"N={n}")
    timed = runs[str(rows[-1]["new_tokens"])] if rows else {}
    context = {key: timed[key] for key in ("device", "processor", "torch_threads")} if rows else {}
    return rows, {"by_new_tokens": {n: {key: run[key] for key in ("runs_s", "usage", "summary", "speedup")}
                                    for n, run in runs.items()},
                  "warmup": warmup, "max_seconds": max_seconds, "budget": budget.record(), **context}


def sweep_point(model, prompt_ids: list[int], new_tokens: int, warmup: int, repeats: int, long_from: int | None,
                long_repeats: int, max_seconds: float, device) -> tuple[dict, dict]:
    """Steps 1-3 at one N: its row of sweep.csv and its timing's samples and summaries."""
    same, count = steps.greedy_with_and_without_cache(model, prompt_ids, new_tokens, device)
    timed_runs = repeats_for(new_tokens, repeats, long_from, long_repeats)
    medians, timed = steps.time_generation(model, prompt_ids, new_tokens, max(warmup - 1, 0), timed_runs,
                                           max_seconds, device)
    formulas = fed_formulas(count["prompt_len"], new_tokens)
    row = {
        "new_tokens": new_tokens,
        "prompt_len": count["prompt_len"],
        "fed_with_cache": count["fed_with_cache"],
        "fed_without_cache": count["fed_without_cache"],
        "formula_with_cache": formulas["with_cache"],
        "formula_without_cache": formulas["without_cache"],
        "token_ratio": count["fed_without_cache"] / count["fed_with_cache"],
        "with_cache_s": medians["with_cache_s"],
        "without_cache_s": medians["without_cache_s"],
        "speedup": medians["speedup"],
        "timed_runs": timed_runs,
        **timing.spread_columns(timed["summary"], timed["speedup"]),
        "same_ids": same["same_ids"],
    }
    return row, timed


# ---------------------------------------------------------------------------
# Latency split: every forward call of step 3's generation
# ---------------------------------------------------------------------------


# The latency split's timed generations a mode whatever its budget: a median and a spread of two.
LATENCY_RUNS = 2
# The prefill alone, timed in both modes in alternation: pairs of calls (each mode first in turn).
PREFILL_PAIRS = 7


def prefill_alone(model, prompt: torch.Tensor) -> dict:
    """The prefill of `prompt` (the first forward call of a generation) in each mode on its own, the two
    in alternation (each first in turn), PREFILL_PAIRS times: whether the TTFTs of the generations
    differ because the work does (the cached prefill also keeps its K and V) or only because of what
    ran before them. Each mode's timing summary and `ratio` (without over with, with its interval)."""
    samples: dict[str, list[float]] = {label: [] for label, _ in MODES}
    usage = {label: timing.empty_usage() for label, _ in MODES}

    def call(use_cache: bool):
        with torch.inference_mode():
            model(prompt, use_cache=use_cache)
        steps.sync(prompt.device)

    for pair in range(PREFILL_PAIRS):
        for label, use_cache in (MODES if pair % 2 == 0 else MODES[::-1]):
            samples[label] += timing.repeat(lambda: call(use_cache), 1, 0, usage=usage[label])
    judged = timing.judged_on(prompt.device)
    summaries = {label: timing.summary(samples[label], usage[label], judged) for label, _ in MODES}
    return {**summaries, "pairs": PREFILL_PAIRS,
            "ratio": timing.ratio_interval(summaries["without_cache"], summaries["with_cache"])}


# Under a budget, each mode's first steps (a probe) predict its whole generation before it is run.
PROBE_STEPS = 8


def predicted_generation_s(model, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> float:
    """The seconds of the greedy generation of `new_tokens` after `prompt` in one mode, predicted from
    a probe (untimed work) that generates its first PROBE_STEPS tokens, each step timed: its first step
    (the prefill) as it took, every later step at the probe's later steps' seconds per token fed times
    what that step feeds (one token with the cache, everything so far without). Proportional, not a
    fitted line: a line through a few steps' narrow window of lengths can slope any way; the fixed cost
    scaled with the tokens makes the prediction, if anything, too high."""
    probe = min(PROBE_STEPS, new_tokens)
    with steps.recording_forward(model) as calls:
        model.generate(prompt, max_new_tokens=probe, use_cache=use_cache, **steps.GREEDY_NO_EOS)
    if probe == new_tokens or len(calls.seconds) < 2:
        return sum(calls.seconds) * new_tokens / max(len(calls.seconds), 1)
    per_fed = sum(calls.seconds[1:]) / sum(calls.fed_lengths[1:])
    prompt_len = prompt.shape[1]
    return calls.seconds[0] + sum(per_fed * (1 if use_cache else prompt_len + step) for step in range(1, new_tokens))


def step_latency(model, prompt_ids: list[int], new_tokens: int, warmup: int, repeats: int, max_seconds: float,
                 device, budget: Budget | None = None) -> dict:
    """Time every forward call of the greedy generation, in both modes.

    Each mode runs `warmup` untimed generations, then timed ones, `repeats` and more while the
    whole generations' times are unstable, for at most `max_seconds` (kvlab.facts.timing.repeat).
    Each step's time is the median over the timed generations; TTFT is the first step (the prefill
    of the whole prompt), TPOT the median of the later steps. Every step of both modes fits
    seconds = fixed + per_token * fed (the cached steps, one token each, pin the fixed cost; the
    no-cache steps alone span only P..P+N-1 tokens, and extrapolating that narrow window down to
    one token can even give a negative fixed cost); the fit then predicts both modes' total time
    from their fed tokens alone, beside the speedup these same generations measured. The fit is
    also made on each timed generation of both modes (the i-th of each), for its spread. The
    wrapper that times every step synchronises and records at each one, so these generations
    run a little slower than step 3's. Each generation's clocks (`usage`, kvlab.facts.timing) judge
    whether the machine took from it (`contended`), for the whole generation and its TTFT alike.

    Within `budget` (kvlab.facts.budget) each mode's timed generations are planned from its last
    warm-up's seconds: as many as fit its share of what is left (`repeats` at most, LATENCY_RUNS at
    least), none repeated past them; the generations left out are recorded. A probe of its first
    steps predicts each mode's generation first (`predicted_generation_s`); where `warmup` whole
    generations and LATENCY_RUNS timed ones would not fit the mode's share, the probe is its only
    warm-up and its prediction plans the runs (`warmups` records each mode's whole warm-ups)."""
    budget = budget or Budget(None)
    prompt = steps.prompt_tensor(model, prompt_ids, new_tokens, device)
    prompt_len = len(prompt_ids)
    result: dict = {"prompt_len": prompt_len, "new_tokens": new_tokens, "warmup": warmup, "repeats": repeats,
                    "max_seconds": max_seconds, **timing_context(device)}
    runs: dict[str, list] = {}
    judged = timing.judged_on(device)
    for index, (label, use_cache) in enumerate(MODES):
        warm_s, warmups = None, warmup
        if budget.seconds is not None:
            warm_s = predicted_generation_s(model, prompt, new_tokens, use_cache)
            share = max(0.0, budget.seconds - budget.spent()) / (len(MODES) - index)
            if warm_s * (warmup + LATENCY_RUNS) > share:
                warmups = 0
                log.info("%s: the whole generation predicted at %.1f s from its first %d steps; those steps its "
                         "only warm-up, to keep %d timed generations within the budget's share of %.0f s", label,
                         warm_s, PROBE_STEPS, LATENCY_RUNS, share)
        result.setdefault("warmups", {})[label] = warmups
        for _ in range(warmups):  # the last one's seconds plan the runs (or the probe's prediction, with none)
            began = time.perf_counter()
            model.generate(prompt, max_new_tokens=new_tokens, use_cache=use_cache, **steps.GREEDY_NO_EOS)
            warm_s = time.perf_counter() - began
        planned = repeats if warm_s is None else budget.runs(warm_s, repeats, LATENCY_RUNS,
                                                             f"{label} timed generations", len(MODES) - index)
        runs[label] = []

        def generate():
            with steps.recording_forward(model) as calls:
                model.generate(prompt, max_new_tokens=new_tokens, use_cache=use_cache, **steps.GREEDY_NO_EOS)
            runs[label].append(calls)

        usage = timing.empty_usage()
        generate_s = timing.repeat(generate, planned, max_seconds if planned == repeats else 0, usage=usage)
        log.info("%s: %d timed generations of %d steps, median %.4f s", label, len(generate_s),
                 len(runs[label][0].seconds), float(np.median(generate_s)))
        fed = runs[label][0].fed_lengths
        step_samples = [[run.seconds[step] for run in runs[label]] for step in range(len(fed))]
        step_s = [float(np.median(samples)) for samples in step_samples]
        result[label] = {
            "ttft_s": step_s[0],
            "ttft": timing.summary(step_samples[0], usage, judged),  # judged on its whole generations
            "tpot_s": float(np.median(step_s[1:])) if len(step_s) > 1 else None,
            "sum_steps_s": sum(step_s),
            "generate_s": float(np.median(generate_s)),
            "generate": timing.summary(generate_s, usage, judged),
            "generate_samples_s": generate_s,
            "usage": usage,
            "fed_tokens": fed,
            # tokens the step's forward attends over: the prompt plus what was generated before it
            "context_tokens": [prompt_len + step for step in range(len(fed))],
            "step_s": step_s,
            "step_samples_s": step_samples,
        }
    both_fed = [fed for label, _ in MODES for fed in result[label]["fed_tokens"]]
    fit = fit_step_cost(both_fed, [sec for label, _ in MODES for sec in result[label]["step_s"]])
    predicted = {label: predict_time(result[label]["fed_tokens"], fit) for label, _ in MODES}
    result["fit"] = {**fit, "on": "every step of both modes"}
    result["fit_runs"] = [
        {key: value for key, value in fit_step_cost(both_fed, list(with_run.seconds) + list(without_run.seconds)).items()
         if key in ("fixed_s", "per_token_s", "r2")}
        for with_run, without_run in zip(runs["with_cache"], runs["without_cache"])
    ]
    result["predicted"] = {
        "with_cache_s": predicted["with_cache"],
        "without_cache_s": predicted["without_cache"],
        "speedup": predicted["without_cache"] / predicted["with_cache"],
    }
    result["measured"] = timing.ratio_interval(result["without_cache"]["generate"], result["with_cache"]["generate"])
    # The prefill is the same work in both modes: TTFTs whose spreads do not meet are a timing artefact
    # (a first call after a switch of mode, the machine's speed changing), not a finding.
    result["prefill_alone"] = prefill_alone(model, prompt)
    result["budget"] = budget.record()
    result["ttft_agree"] = timing.overlap(*((result[label]["ttft"]["q1_s"], result[label]["ttft"]["q3_s"])
                                            for label, _ in MODES))
    return result


# ---------------------------------------------------------------------------
# Top-p curve: step 6 for a grid of p
# ---------------------------------------------------------------------------


def topp_curve(model, tokenizer, prefix: str, sharp_prefix: str, ps, lab_ps, device) -> list[dict]:
    """Survivors of MiniMind's top-p rule at every p of `ps` and of the lab sheet's `lab_ps`
    (so the curve passes through step 6's own points), after the flat and the sharp prefix."""
    ps = sorted(set(ps) | set(lab_ps))
    flat_logits = steps.next_token_logits(model, tokenizer, prefix, device)
    flat = steps.top_p_survivors(flat_logits, ps)
    sharp = steps.top_p_survivors(steps.next_token_logits(model, tokenizer, sharp_prefix, device), ps)
    return [{"p": p, "flat": flat[str(p)], "sharp": sharp[str(p)], "lab_p": p in lab_ps,
             "vocab_size": flat_logits.shape[-1], "flat_prefix": prefix, "sharp_prefix": sharp_prefix} for p in ps]


# ---------------------------------------------------------------------------
# Temperature curve: step 5 for a grid of temperatures, with entropy
# ---------------------------------------------------------------------------


class SampledEntropy:
    """An `observe` hook for `steps.recording_forward` during sampling with top_k=0, top_p=1.0:
    the distribution a token is drawn from is softmax(logits / temperature), and this adds up
    its entropy (nats) at every step of every row that has not finished yet.

    A row finishes when it draws eos; generate then feeds eos to it without sampling. The token
    a row drew at the previous step is the last id fed at this step, so no ids need returning."""

    def __init__(self, temperature: float, eos_id: int | None):
        self.temperature = temperature
        self.eos_id = eos_id
        self.finished = None
        self.total_nats = 0.0
        self.tokens = 0
        self.vocab_size = None

    def __call__(self, input_ids, output) -> None:
        if self.finished is None:  # the prefill: nothing drawn yet
            self.finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        elif self.eos_id is not None:
            self.finished |= input_ids[:, -1].eq(self.eos_id)
        self.vocab_size = output.logits.shape[-1]
        logits = sampling.apply_temperature(output.logits[:, -1, :].float(), self.temperature, do_sample=True)
        log_probs = torch.log_softmax(logits, dim=-1)
        entropy = -(log_probs.exp() * log_probs).nan_to_num().sum(dim=-1)  # 0 * log 0 = 0
        drawn = ~self.finished
        self.total_nats += float(entropy[drawn].sum())
        self.tokens += int(drawn.sum())

    @property
    def mean_nats(self) -> float:
        return self.total_nats / self.tokens if self.tokens else float("nan")


def temp_curve(model, tokenizer, question: str, temperatures, lab_temperatures, samples: int, max_new_tokens: int,
               seed: int, device, budget: Budget | None = None) -> tuple[list[dict], dict, dict]:
    """Step 5 at every temperature of `temperatures` and of the lab sheet's `lab_temperatures` (so the
    curve passes through step 5's own points; `lab_temperature` says which), each reseeded as the lab
    does: distinct answers of `samples` and the mean per-token entropy of the sampled distribution.
    Within `budget` (kvlab.facts.budget) the sheet's temperatures come first, then the grid coarse to
    fine (`coarse_first`), each next one predicted to take the mean of those measured; where one would
    not fit, the rest are cut and the curve is the coarser grid. Returns (rows by temperature, answers
    by key, what the budget recorded)."""
    budget = budget or Budget(None)
    lab = sorted(set(lab_temperatures))
    order = coarse_first(sorted(set(temperatures) | set(lab)), lab)
    answers = {}

    def measure(temperature: float) -> tuple[dict, float]:
        began = time.perf_counter()
        entropy = SampledEntropy(temperature, tokenizer.eos_id)
        with steps.recording_forward(model, observe=entropy):
            counts, side = steps.temperature_answers(model, tokenizer, question, [temperature], samples,
                                                   max_new_tokens, seed, device)
        key = str(temperature)
        answers[key] = side["answers"][key]
        log.info("T=%s: %d distinct of %d, mean entropy %.3f nats over %d tokens; %.1f s so far", key,
                 counts[key]["distinct"], samples, entropy.mean_nats, entropy.tokens, budget.spent())
        return ({"temperature": temperature, "distinct": counts[key]["distinct"], "samples": samples,
                 "mean_entropy_nats": entropy.mean_nats, "sampled_tokens": entropy.tokens,
                 "vocab_size": entropy.vocab_size, "lab_temperature": temperature in lab_temperatures},
                time.perf_counter() - began)

    def predict(temperature: float, done: list) -> float:
        return sum(seconds for *_, seconds in done) / len(done)

    rows = budget.take(order, measure, predict, name=lambda t: f"T={t}", keep=max(len(lab), KEPT_RUNGS))
    rows.sort(key=lambda row: row["temperature"])
    return rows, {key: answers[key] for key in sorted(answers, key=float)}, budget.record()


def coarse_first(temperatures: list[float], first: list[float]) -> list[float]:
    """`first`, then the rest of the sorted grid `temperatures` coarse to fine: its two ends, then every
    8th point, every 4th, every 2nd, every one; a prefix of it is an evenly thinned curve."""
    order = list(first)
    stride = 1
    while stride * 2 < len(temperatures):
        stride *= 2
    for index in (0, len(temperatures) - 1):
        if temperatures[index] not in order:
            order.append(temperatures[index])
    while stride >= 1:
        order += [t for t in temperatures[::stride] if t not in order]
        stride //= 2
    return order
