"""The report's figures, drawn with matplotlib's Agg backend (no display needed).

Labels are in English: matplotlib's default font has no Hangul glyphs, and a
figure with empty boxes for letters confuses more than it helps. Each function
takes the rows a rule wrote and saves one PNG atomically.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from kvlab.io import atomic_path  # noqa: E402

WITH_CACHE = {"color": "tab:blue", "label": "with cache"}
WITHOUT_CACHE = {"color": "tab:red", "label": "without cache"}


def _save(fig, path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def cost_curve(rows: list[dict], path) -> None:
    """Left: tokens fed to forward against N, measured points on both formulas (log-log, so
    the slopes read as growth orders). Right: median generation time against N."""
    n = np.array([row["new_tokens"] for row in rows])
    prompt_len = rows[0]["prompt_len"]
    fine = np.linspace(n.min(), n.max(), 200)
    fig, (tokens_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4.4))

    tokens_ax.plot(fine, prompt_len + fine - 1, color=WITH_CACHE["color"], lw=1.5,
                   label="formula P + N − 1 (linear)")
    tokens_ax.plot(fine, prompt_len * fine + fine * (fine - 1) / 2, color=WITHOUT_CACHE["color"], lw=1.5,
                   label="formula P·N + N(N−1)/2 (quadratic)")
    tokens_ax.plot(n, [row["fed_with_cache"] for row in rows], "o", color=WITH_CACHE["color"],
                   label="measured, with cache")
    tokens_ax.plot(n, [row["fed_without_cache"] for row in rows], "s", color=WITHOUT_CACHE["color"],
                   label="measured, without cache")
    tokens_ax.set_xscale("log", base=2)
    tokens_ax.set_yscale("log")
    tokens_ax.set_xticks(n, [str(v) for v in n])
    tokens_ax.set_xlabel("new tokens N (log scale)")
    tokens_ax.set_ylabel("tokens fed to forward, total (log scale)")
    tokens_ax.set_title(f"Work: tokens fed (prompt P = {prompt_len})")
    tokens_ax.grid(True, which="both", alpha=0.3)
    tokens_ax.legend(fontsize=8)

    time_ax.plot(n, [row["with_cache_s"] for row in rows], "o-", **WITH_CACHE)
    time_ax.plot(n, [row["without_cache_s"] for row in rows], "s-", **WITHOUT_CACHE)
    time_ax.set_xlabel("new tokens N")
    time_ax.set_ylabel("median generation time (s)")
    time_ax.set_title("Time: median of the timed runs")
    time_ax.grid(True, alpha=0.3)
    time_ax.legend(fontsize=8)
    fig.suptitle("Greedy generation cost with and without the KV cache")
    _save(fig, path)


def latency_curve(latency: dict, path) -> None:
    """Step time against the context the step attends over, both modes, with the fitted line."""
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for label, style, marker in (("without_cache", WITHOUT_CACHE, "s"), ("with_cache", WITH_CACHE, "o")):
        mode = latency[label]
        ms = np.array(mode["step_s"]) * 1000
        ax.plot(mode["context_tokens"][1:], ms[1:], marker, ms=4, color=style["color"],
                label=f"{style['label']}: decode steps (TPOT {mode['tpot_s'] * 1000:.2f} ms)")
        ax.plot(mode["context_tokens"][:1], ms[:1], marker, ms=11, mfc="none", mew=2, color=style["color"],
                label=f"{style['label']}: first step = prefill (TTFT {mode['ttft_s'] * 1000:.2f} ms)")
    fit = latency["fit"]
    context = np.array(latency["without_cache"]["context_tokens"])
    ax.plot(context, (fit["fixed_s"] + fit["per_token_s"] * context) * 1000, "k--", lw=1,
            label=f"fit (all steps): {fit['fixed_s'] * 1000:.2f} ms + {fit['per_token_s'] * 1e6:.2f} µs × fed tokens")
    ax.set_xlabel("context length: prompt + tokens generated before the step")
    ax.set_ylabel("forward time per step (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Time of each generation step ({latency['new_tokens']} new tokens, "
                 f"median of {latency['repeats']} runs)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    _save(fig, path)


def topp_curve(rows: list[dict], path) -> None:
    """Survivors of top-p against p, after each of the two prefixes; the whole vocabulary as a
    ceiling, and the lab sheet's p values marked. The legend names the prefixes by their config
    keys only: which of them leaves more candidates is for the data to show, not the label."""
    ps = [row["p"] for row in rows]
    vocab_size = rows[0]["vocab_size"]
    marked_ps = [row["p"] for row in rows if row["lab_p"]]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.plot(ps, [row["flat"] for row in rows], "o-", color="tab:green", ms=4,
            label="after lab.topp.prefix")
    ax.plot(ps, [row["sharp"] for row in rows], "s-", color="tab:purple", ms=4,
            label="after lab.topp.sharp_prefix")
    ax.axhline(vocab_size, color="grey", ls=":", lw=1, label=f"whole vocabulary ({vocab_size:,} tokens)")
    for index, p in enumerate(marked_ps):
        ax.axvline(p, color="grey", ls="--", lw=0.8, alpha=0.6, label="the lab sheet's p values" if index == 0 else None)
    ax.set_yscale("log")
    ax.set_xlabel("top-p threshold p")
    ax.set_ylabel("candidate tokens kept (log scale)")
    ax.set_title("How many next-token candidates MiniMind's top-p rule keeps")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    _save(fig, path)


def temperature_curve(rows: list[dict], path) -> None:
    """Left: distinct answers against temperature, up to all of them. Right: the mean entropy
    of the distributions the tokens were drawn from, up to that of a uniform pick."""
    temperatures = [row["temperature"] for row in rows]
    samples = rows[0]["samples"]
    vocab_size = rows[0]["vocab_size"]
    uniform = float(np.log(vocab_size))
    fig, (distinct_ax, entropy_ax) = plt.subplots(1, 2, figsize=(11, 4.2))

    distinct_ax.plot(temperatures, [row["distinct"] for row in rows], "o-", color="tab:orange",
                     label=f"distinct answers of {samples}")
    distinct_ax.axhline(samples, color="grey", ls=":", lw=1, label=f"all {samples} different")
    distinct_ax.set_ylim(0, samples * 1.1)
    distinct_ax.set_xlabel("temperature")
    distinct_ax.set_ylabel("distinct answers (count)")
    distinct_ax.set_title(f"Distinct answers among {samples} samples")
    distinct_ax.grid(True, alpha=0.3)
    distinct_ax.legend(loc="lower right", fontsize=9)

    entropy_ax.plot(temperatures, [row["mean_entropy_nats"] for row in rows], "^-", color="tab:cyan",
                    label="mean entropy per sampled token")
    entropy_ax.axhline(uniform, color="grey", ls=":", lw=1,
                       label=f"uniform pick over the vocabulary: ln {vocab_size:,} = {uniform:.2f}")
    entropy_ax.set_ylim(0, uniform * 1.1)
    entropy_ax.set_xlabel("temperature")
    entropy_ax.set_ylabel("entropy (nats)")
    entropy_ax.set_title("Entropy of the distribution each token was drawn from")
    entropy_ax.grid(True, alpha=0.3)
    entropy_ax.legend(loc="center left", fontsize=9)
    fig.suptitle("Sampling the SFT model's answer to the lab question at each temperature (same seed)")
    _save(fig, path)


def compare_curve(rows: list[dict], path) -> None:
    """Left: measured and predicted speedup against parameter count (log x), under the token ratio.
    Right: an average step of each mode (one token fed with the cache, P + (N-1)/2 without) split into
    the fit's fixed and per-token parts, as shares of the step's time (total in ms on top)."""
    params = np.array([row["parameters"] for row in rows], dtype=float)
    names = [row["name"] for row in rows]
    fig, (speed_ax, split_ax) = plt.subplots(1, 2, figsize=(11.5, 4.6))

    ratios = sorted({round(row["token_ratio"], 6) for row in rows})
    for index, ratio in enumerate(ratios):
        speed_ax.axhline(ratio, color="grey", ls=":", lw=1.2,
                         label=f"token ratio {ratio:.1f}× (the ceiling)" if index == 0 else None)
    speed_ax.plot(params, [row["speedup"] for row in rows], "o-", color="tab:blue", ms=7,
                  label="measured speedup (median times)")
    speed_ax.plot(params, [row["predicted_speedup"] for row in rows], "D", color="tab:orange", ms=6, mfc="none",
                  mew=1.5, label="predicted by each model's fixed-cost fit")
    for x, y, name in zip(params, [row["speedup"] for row in rows], names):
        speed_ax.annotate(name, (x, y), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=8)
    speed_ax.set_xscale("log")
    speed_ax.set_yscale("log")
    speed_ax.set_xlim(params.min() / 2.5, params.max() * 2.5)
    speed_ax.set_ylim(1, max(ratios) * 1.6)
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= max(ratios) * 1.6]
    speed_ax.set_yticks(ticks, [f"{t}×" for t in ticks])
    speed_ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    speed_ax.set_xlabel("parameters (log scale)")
    speed_ax.set_ylabel("speedup from the cache (log scale)")
    speed_ax.set_title(f"Speedup against model size (P = {rows[0]['prompt_len']}, N = {rows[0]['new_tokens']})")
    speed_ax.grid(True, which="both", alpha=0.3)
    speed_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.84))

    # an average step of each mode: one token fed with the cache, P + (N - 1) / 2 without
    positions = np.arange(len(rows))
    width = 0.38
    modes = ((-width / 2, "with", lambda row: 1.0),
             (width / 2, "without", lambda row: row["prompt_len"] + (row["new_tokens"] - 1) / 2))
    for offset, label, fed_of in modes:
        fixed = np.array([row["fit_fixed_s"] for row in rows]) * 1000
        per_token = np.array([row["fit_per_token_s"] * fed_of(row) for row in rows]) * 1000
        total = fixed + per_token
        fixed_share = np.where(total > 0, fixed / total, np.nan) * 100
        split_ax.bar(positions + offset, fixed_share, width, color="tab:grey",
                     label="fixed part (the fit's intercept)" if offset < 0 else None)
        split_ax.bar(positions + offset, 100 - fixed_share, width, bottom=fixed_share, color="tab:green",
                     label="per-token part (× tokens fed)" if offset < 0 else None)
        for x, ms in zip(positions + offset, total):
            split_ax.annotate(f"{ms:.1f} ms", (x, 100), textcoords="offset points", xytext=(0, 3),
                              ha="center", fontsize=7)
    bar_positions = [x + offset for x in positions for offset, _, _ in modes]
    split_ax.set_xticks(bar_positions, [label for _ in positions for _, label, _ in modes], fontsize=7)
    for x, name in zip(positions, names):
        split_ax.annotate(name, (x, 0), xycoords=("data", "axes fraction"), textcoords="offset points",
                          xytext=(0, -24), ha="center", fontsize=8)
    split_ax.set_ylim(0, 112)
    split_ax.set_yticks([0, 25, 50, 75, 100])
    split_ax.set_ylabel("share of an average step's time (%)")
    split_ax.set_title("An average step with and without the cache (ms on top)")
    split_ax.grid(True, axis="y", alpha=0.3)
    split_ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    fig.suptitle("The same lab, several model sizes: why the speedup grows with size")
    _save(fig, path)
