"""The lab sheet's figures: the KV cache's cost (the tokens fed and the time, each step's time), and
what top-p and the temperature do to the sampled answers. Drawn as kvlab.present.drawing draws every
figure; each function takes the rows a rule wrote and saves one PNG.

  cost_curves         tokens fed to forward and the median time against the new tokens N, both modes
  step_times          every step's time, both modes, against its context and against the tokens fed
  topp_survivors      the candidates MiniMind's top-p rule keeps against p, after two prefixes
  temperature_effect  distinct answers and the mean entropy against the temperature
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.legend_handler import HandlerTuple
import numpy as np

from kvlab.present.drawing import (WITH_CACHE_COLOR, WITHOUT_CACHE_COLOR, disturbed, drawing, mark_disturbed,
                                   one_two_five, plain_log_ticks, save)
from kvlab.present.marks import SIGN
from kvlab.present.i18n import N_

# the gid of what a test looks for: the lines marking the lab sheet's own p values or temperatures
LAB_VALUE = "lab_value"

# Every label drawn, by key, in English; its Korean is in the catalog (kvlab.present.i18n). {names} are
# filled in by the caller.
LABELS = {
    "with_cache": N_("with cache"),
    "without_cache": N_("without cache"),
    "formula_with": N_("formula P + N − 1 (linear)"),
    "formula_without": N_("formula P·N + N(N−1)/2 (quadratic)"),
    "measured_with": N_("measured, with cache"),
    "measured_without": N_("measured, without cache"),
    "new_tokens_log": N_("new tokens N (log scale)"),
    "fed_total_log": N_("tokens fed to forward, total (log scale)"),
    "work_title": N_("Work: tokens fed (prompt P = {prompt_len})"),
    "new_tokens": N_("new tokens N"),
    "median_time": N_("median generation time (s)"),
    "time_title": N_("Time: median of the timed runs"),
    "cost_title": N_("Greedy generation cost with and without the KV cache"),
    "decode_steps": N_("{mode}: decode steps (TPOT {tpot:.2f} ms)"),
    "prefill_step": N_("{mode}: first step = prefill (TTFT {ttft:.2f} ms)"),
    "fit_line": N_("fit (all steps): {fixed:.2f} ms + {per_token:.2f} µs × fed tokens (left: each step's prediction)"),
    "fed_tokens_axis": N_("tokens fed to the step's forward"),
    "steps_by_context": N_("Against the context the step attends over"),
    "steps_by_fed": N_("Against the tokens fed, what the fit is a function of"),
    "context_length": N_("context length: prompt + tokens generated before the step"),
    "step_time": N_("forward time per step (ms)"),
    "steps_title": N_("Time of each generation step ({new_tokens} new tokens; each step the median of its {with_runs} "
                      "runs with the cache, {without_runs} without)"),
    "after_prefix": N_("after \"{prefix}\""),
    "after_sharp_prefix": N_("after \"{prefix}\""),
    "whole_vocabulary": N_("whole vocabulary ({vocab_size:,} tokens)"),
    "lab_ps": N_("the lab sheet's p values"),
    "topp_threshold": N_("top-p threshold p"),
    "kept_log": N_("candidate tokens kept (log scale)"),
    "topp_title": N_("How many next-token candidates MiniMind's top-p rule keeps"),
    "distinct_of": N_("distinct answers of {samples}"),
    "all_different": N_("all {samples} different"),
    "temperature": N_("temperature"),
    "lab_temperatures": N_("the lab sheet's temperatures"),
    "distinct_count": N_("distinct answers (count)"),
    "distinct_title": N_("Distinct answers among {samples} samples"),
    "mean_entropy": N_("mean entropy per sampled token"),
    "uniform_entropy": N_("uniform pick over the vocabulary: ln {vocab_size:,} = {uniform:.2f}"),
    "entropy_nats": N_("entropy (nats)"),
    "entropy_title": N_("Entropy of the distribution each token was drawn from"),
    "temperature_title": N_("Sampling the SFT model's answer to the lab question at each temperature (same seed)"),
}


def cost_curves(rows: list[dict], path, language: str = "en") -> None:
    """Left: tokens fed to forward against N, measured points on both formulas (log-log, so
    the slopes read as growth orders). Right: median generation time against N."""
    n = np.array([row["new_tokens"] for row in rows])
    prompt_len = rows[0]["prompt_len"]
    fine = np.linspace(n.min(), n.max(), 200)
    with drawing(language, LABELS) as text:
        with_cache = {"color": WITH_CACHE_COLOR, "label": text("with_cache")}
        without_cache = {"color": WITHOUT_CACHE_COLOR, "label": text("without_cache")}
        fig, (tokens_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4.4))

        tokens_ax.plot(fine, prompt_len + fine - 1, color=WITH_CACHE_COLOR, lw=1.5, label=text("formula_with"))
        tokens_ax.plot(fine, prompt_len * fine + fine * (fine - 1) / 2, color=WITHOUT_CACHE_COLOR, lw=1.5,
                       label=text("formula_without"))
        tokens_ax.plot(n, [row["fed_with_cache"] for row in rows], "o", color=WITH_CACHE_COLOR,
                       label=text("measured_with"))
        tokens_ax.plot(n, [row["fed_without_cache"] for row in rows], "s", color=WITHOUT_CACHE_COLOR,
                       label=text("measured_without"))
        tokens_ax.set_xscale("log", base=2)
        tokens_ax.set_yscale("log")
        tokens_ax.set_xticks(n, [str(v) for v in n])
        # labelled at 1-2-5 steps: the cached points (a few hundred tokens) lie between powers of ten
        fed = [value for row in rows for value in (row["fed_with_cache"], row["fed_without_cache"])]
        ticks = one_two_five(min(fed), max(fed))
        plain_log_ticks(tokens_ax.yaxis, ticks)
        tokens_ax.set_ylim(min(ticks[0] / 1.1, min(fed) / 1.3), max(fed) * 1.3)  # the tick under the lowest in view
        tokens_ax.set_xlabel(text("new_tokens_log"))
        tokens_ax.set_ylabel(text("fed_total_log"))
        tokens_ax.set_title(text("work_title", prompt_len=prompt_len))
        tokens_ax.grid(True, which="both", alpha=0.3)
        tokens_ax.legend(fontsize=8)

        time_ax.plot(n, [row["with_cache_s"] for row in rows], "o-", **with_cache)
        time_ax.plot(n, [row["without_cache_s"] for row in rows], "s-", **without_cache)
        flagged = disturbed({"sweep": rows})
        mark_disturbed(time_ax, [(row["new_tokens"], row[f"{mode}_s"]) for row in rows
                                 if flagged("sweep", n=row["new_tokens"]) for mode in ("with_cache", "without_cache")],
                       text)
        time_ax.set_xlabel(text("new_tokens"))
        time_ax.set_ylabel(text("median_time"))
        time_ax.set_title(text("time_title"))
        time_ax.grid(True, alpha=0.3)
        time_ax.legend(fontsize=8)
        fig.suptitle(text("cost_title"))
        save(fig, path)


def step_times(latency: dict, path, language: str = "en") -> None:
    """Every step's time, both modes, the prefill marked. Left: against the context the step attends
    over, with the fit's prediction for each step drawn at its own context (from the tokens that step
    was fed). Right: against the tokens fed, what the fit is a function of, with the fit's line."""
    fit = latency["fit"]

    def predicted_ms(fed):
        return (fit["fixed_s"] + fit["per_token_s"] * np.asarray(fed, dtype=float)) * 1000

    # a mode whose timed generations the machine disturbed: its TTFT and TPOT carry the reports' mark
    flagged = disturbed({"latency": latency})
    marked = {label: SIGN if flagged("latency", label) else "" for label in ("with_cache", "without_cache")}
    with drawing(language, LABELS) as text:
        fig, (context_ax, fed_ax) = plt.subplots(1, 2, figsize=(12, 5.4))
        for label, color, marker in (("without_cache", WITHOUT_CACHE_COLOR, "s"),
                                     ("with_cache", WITH_CACHE_COLOR, "o")):
            mode = latency[label]
            ms = np.array(mode["step_s"]) * 1000
            for ax, x in ((context_ax, mode["context_tokens"]), (fed_ax, mode["fed_tokens"])):
                ax.plot(x[1:], ms[1:], marker, ms=4, color=color,
                        label=text("decode_steps", mode=text(label), tpot=mode["tpot_s"] * 1000) + marked[label])
                ax.plot(x[:1], ms[:1], marker, ms=11, mfc="none", mew=2, color=color,
                        label=text("prefill_step", mode=text(label), ttft=mode["ttft_s"] * 1000) + marked[label])
        mark_disturbed(context_ax, [], text, explained=any(marked.values()))
        # each step's prediction at its own context: one token fed with the cache, the context without
        predictions = [context_ax.plot(latency[label]["context_tokens"], predicted_ms(latency[label]["fed_tokens"]),
                                       "_", ms=4, mew=1.2, color="black")[0] for label in ("without_cache", "with_cache")]
        fed = np.linspace(0, max(max(latency[label]["fed_tokens"]) for label in ("with_cache", "without_cache")), 2)
        [fit_line] = fed_ax.plot(fed, predicted_ms(fed), "k--", lw=1)
        context_ax.set_xlabel(text("context_length"))
        context_ax.set_title(text("steps_by_context"))
        fed_ax.set_xlabel(text("fed_tokens_axis"))
        fed_ax.set_title(text("steps_by_fed"))
        top = max(context_ax.get_ylim()[1], fed_ax.get_ylim()[1])
        for ax in (context_ax, fed_ax):
            ax.set_ylabel(text("step_time"))
            ax.set_ylim(0, top)
            ax.grid(True, alpha=0.3)
        # one legend entry for the fit: its line (right) and its prediction at each step (left), one formula
        handles, labels = context_ax.get_legend_handles_labels()
        fig.legend(handles + [(fit_line, predictions[0])],
                   labels + [text("fit_line", fixed=fit["fixed_s"] * 1000, per_token=fit["per_token_s"] * 1e6)],
                   handler_map={tuple: HandlerTuple(ndivide=None)}, loc="lower center", ncol=3, fontsize=8,
                   frameon=False)
        # each mode's own number of runs: a timing repeats while it is unstable, so the two may differ
        fig.suptitle(text("steps_title", new_tokens=latency["new_tokens"],
                          with_runs=latency["with_cache"]["generate"]["n"],
                          without_runs=latency["without_cache"]["generate"]["n"]))
        save(fig, path, rect=(0, 0.1, 1, 1))


def mark_lab_values(ax, values, label: str) -> None:
    """Dashed vertical lines at the lab sheet's `values` (the first one carrying `label` in the legend),
    each named by a tick of its own on a top axis."""
    for index, value in enumerate(values):
        ax.axvline(value, color="grey", ls="--", lw=0.8, alpha=0.6, gid=LAB_VALUE, label=label if index == 0 else None)
    top = ax.secondary_xaxis("top")
    top.set_xticks(values, [str(float(value)) for value in values], fontsize=8, color="dimgrey")  # as the lab's keys
    top.tick_params(length=3, color="grey")


def topp_survivors(rows: list[dict], path, language: str = "en") -> None:
    """Survivors of top-p against p, after each of the two prefixes; the whole vocabulary as a
    ceiling, and the lab sheet's p values marked. The legend quotes the prefixes only: which of
    them leaves more candidates is for the data to show, not the label."""
    ps = [row["p"] for row in rows]
    vocab_size = rows[0]["vocab_size"]
    marked_ps = [row["p"] for row in rows if row["lab_p"]]
    with drawing(language, LABELS) as text:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        ax.plot(ps, [row["flat"] for row in rows], "o-", color="tab:green", ms=4,
                label=text("after_prefix", prefix=rows[0]["flat_prefix"]))
        ax.plot(ps, [row["sharp"] for row in rows], "s-", color="tab:purple", ms=4,
                label=text("after_sharp_prefix", prefix=rows[0]["sharp_prefix"]))
        ax.axhline(vocab_size, color="grey", ls=":", lw=1, label=text("whole_vocabulary", vocab_size=vocab_size))
        mark_lab_values(ax, marked_ps, text("lab_ps"))
        ax.set_yscale("log")
        counts = [row[column] for row in rows for column in ("flat", "sharp")] + [vocab_size]
        plain_log_ticks(ax.yaxis, one_two_five(min(counts), max(counts)))
        ax.set_ylim(min(counts) / 1.4, max(counts) * 1.4)
        ax.set_xlabel(text("topp_threshold"))
        ax.set_ylabel(text("kept_log"))
        ax.set_title(text("topp_title"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=9, loc="upper left")
        save(fig, path)


def temperature_effect(rows: list[dict], path, language: str = "en") -> None:
    """Left: distinct answers against temperature, up to all of them. Right: the mean entropy
    of the distributions the tokens were drawn from, up to that of a uniform pick. Both mark the lab
    sheet's temperatures (the rows' `lab_temperature`)."""
    temperatures = [row["temperature"] for row in rows]
    lab_temperatures = [row["temperature"] for row in rows if row["lab_temperature"]]
    samples = rows[0]["samples"]
    vocab_size = rows[0]["vocab_size"]
    uniform = float(np.log(vocab_size))
    with drawing(language, LABELS) as text:
        fig, (distinct_ax, entropy_ax) = plt.subplots(1, 2, figsize=(11, 4.2))

        distinct_ax.plot(temperatures, [row["distinct"] for row in rows], "o-", color="tab:orange",
                         label=text("distinct_of", samples=samples))
        distinct_ax.axhline(samples, color="grey", ls=":", lw=1, label=text("all_different", samples=samples))
        mark_lab_values(distinct_ax, lab_temperatures, text("lab_temperatures"))
        distinct_ax.set_ylim(0, samples * 1.1)
        distinct_ax.set_xlabel(text("temperature"))
        distinct_ax.set_ylabel(text("distinct_count"))
        distinct_ax.set_title(text("distinct_title", samples=samples))
        distinct_ax.grid(True, alpha=0.3)
        distinct_ax.legend(loc="lower right", fontsize=9)

        entropy_ax.plot(temperatures, [row["mean_entropy_nats"] for row in rows], "^-", color="tab:cyan",
                        label=text("mean_entropy"))
        entropy_ax.axhline(uniform, color="grey", ls=":", lw=1,
                           label=text("uniform_entropy", vocab_size=vocab_size, uniform=uniform))
        mark_lab_values(entropy_ax, lab_temperatures, text("lab_temperatures"))
        entropy_ax.set_ylim(0, uniform * 1.1)
        entropy_ax.set_xlabel(text("temperature"))
        entropy_ax.set_ylabel(text("entropy_nats"))
        entropy_ax.set_title(text("entropy_title"))
        entropy_ax.grid(True, alpha=0.3)
        entropy_ax.legend(loc="center left", fontsize=9)
        fig.suptitle(text("temperature_title"))
        save(fig, path)
