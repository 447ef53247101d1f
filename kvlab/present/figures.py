"""The report's figures, drawn with matplotlib's Agg backend (no display needed).

Labels follow the report's language (config `report.language`): English, or Korean
set in NanumGothic, the Hangul font the `koreanize-matplotlib` package ships (read
from its folder, so nothing is downloaded and no system font is needed). Glyphs
NanumGothic lacks (−, µ, ×) fall back to matplotlib's own DejaVu Sans. Each
function takes the rows a rule wrote and saves one PNG atomically; the PNG's
Title and Description metadata hold the figure's title and every label drawn.
"""

from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from kvlab.io import atomic_path  # noqa: E402
from kvlab.present.i18n import N_, check_language, gettext_for  # noqa: E402
from kvlab.facts.compare import average_step_s, fixed_share  # noqa: E402
from kvlab.facts.formulas import VLLM_PAPER, fits_budgets  # noqa: E402

WITH_CACHE_COLOR = "tab:blue"
WITHOUT_CACHE_COLOR = "tab:red"
HANGUL_FONT = "NanumGothic"
FONT_PACKAGE = "koreanize-matplotlib"

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
    "fit_line": N_("fit (all steps): {fixed:.2f} ms + {per_token:.2f} µs × fed tokens"),
    "context_length": N_("context length: prompt + tokens generated before the step"),
    "step_time": N_("forward time per step (ms)"),
    "steps_title": N_("Time of each generation step ({new_tokens} new tokens, median of {repeats} runs)"),
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
    "distinct_count": N_("distinct answers (count)"),
    "distinct_title": N_("Distinct answers among {samples} samples"),
    "mean_entropy": N_("mean entropy per sampled token"),
    "uniform_entropy": N_("uniform pick over the vocabulary: ln {vocab_size:,} = {uniform:.2f}"),
    "entropy_nats": N_("entropy (nats)"),
    "entropy_title": N_("Entropy of the distribution each token was drawn from"),
    "temperature_title": N_("Sampling the SFT model's answer to the lab question at each temperature (same seed)"),
    "token_ratio": N_("token ratio {ratio:.1f}× (the ceiling)"),
    "measured_speedup": N_("measured speedup (median times, bars: its interval)"),
    "predicted_speedup": N_("predicted by each model's fixed-cost fit"),
    "parameters_log": N_("parameters (log scale)"),
    "speedup_log": N_("speedup from the cache (log scale)"),
    "speedup_title": N_("Speedup against model size (P = {prompt_len}, N = {new_tokens})"),
    "with": N_("with"),
    "without": N_("without"),
    "fixed_part": N_("fixed part (the fit's intercept)"),
    "per_token_part": N_("per-token part (× tokens fed)"),
    "step_share": N_("share of an average step's time (%)"),
    "average_step_title": N_("An average step with and without the cache (ms on top)"),
    "compare_title": N_("The same lab on several model sizes: speedup, and the fixed share of a step"),
    "batch_size_log": N_("batch size B (rows, log scale)"),
    "decode_throughput": N_("decode throughput S_TG (tokens/s)"),
    "throughput_title": N_("Tokens per second (bars: interval over the runs)"),
    "mode_shared": N_("shared: one prompt ({pp} tokens) in every row"),
    "mode_distinct": N_("distinct: B validation prompts, left-padded"),
    "step_ms": N_("one decode step (ms, median)"),
    "step_ms_title": N_("A decode step serves B rows"),
    "batch_title": N_("Many requests at once (TG = {tg} decode steps, as llama-batched-bench)"),
    "reserved_share": N_("share of the reserved cache (%)"),
    "token_states": N_("token states"),
    "reservation": N_("reservation (tokens still to come)"),
    "internal_fragmentation": N_("internal fragmentation (never used)"),
    "paper_existing": N_("vLLM paper (theirs): token states in existing systems {low:.1f}–{high:.1f}%"),
    "paper_vllm": N_("vLLM paper (theirs): token states with vLLM {share:.1f}%"),
    "fits_label": N_("{fits:,}\nfit in {budget} GiB"),
    "paper_existing_tick": N_("paper:\nexisting systems"),
    "paper_vllm_tick": N_("paper:\nvLLM"),
    "ideal_scaling": N_("if a step cost the same at every B"),
    "kv_waste_title": N_("What the reserved cache holds ({requests} real requests), by how it is reserved"),
    "part_matmul": N_("matrix products"),
    "part_attention": N_("attention"),
    "part_norm": N_("norms"),
    "part_rope": N_("RoPE"),
    "part_cache": N_("cache append"),
    "part_sampling": N_("sampling"),
    "part_other_operators": N_("other operators"),
    "part_fixed": N_("fixed cost (the shrunk copy's step, unprofiled)"),
    "step_cat": N_("with cache (torch.cat)"),
    "step_static": N_("with cache (preallocated)"),
    "step_uncached": N_("without cache"),
    "profiled_ms": N_("step time by part (ms): fixed cost + computation (profiled, the shrunk copy's taken off)"),
    "unprofiled_step": N_("the step timed without the profiler (median, quartiles)"),
    "anatomy_label": N_("sum {sum:.2f} ms: fixed {fixed:.0f}%, {off:+.0f}% off the mark"),
    "anatomy_title": N_("The lab's last step ({context} tokens of context), opened"),
    "cache_cat": N_("MiniMind's cache (torch.cat every step)"),
    "cache_static": N_("preallocated, written in place"),
    "cache_compiled": N_("preallocated, forward compiled ({mode})"),
    "curve_title": N_("One decode step as the cache fills"),
    "cache_context": N_("context: tokens in the cache + the one fed"),
    "decode_step_ms": N_("decode step (ms)"),
    "step_anatomy_title": N_("Where a generation step's time goes"),
}


def hangul_font_path() -> Path:
    """NanumGothic.ttf from the koreanize-matplotlib package's folder. The package is found, not
    imported: importing it would change matplotlib's global settings."""
    spec = importlib.util.find_spec("koreanize_matplotlib")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the figures draw Hangul (report.language 'ko', and the lab's Korean prefixes) with "
                         f"the {FONT_PACKAGE} package: pip install {FONT_PACKAGE}")
    path = Path(spec.submodule_search_locations[0]) / "fonts" / f"{HANGUL_FONT}.ttf"
    if not path.is_file():
        raise ValueError(f"{path}: the {FONT_PACKAGE} package holds no {HANGUL_FONT}.ttf")
    return path


def font_families(language: str) -> list[str]:
    """The font list for `language`, first choice first (matplotlib falls back glyph by glyph: an
    English figure still sets the Korean text it quotes, such as a top-p prefix, in NanumGothic)."""
    check_language(language)
    path = str(hangul_font_path())
    if path not in {entry.fname for entry in font_manager.fontManager.ttflist}:
        font_manager.fontManager.addfont(path)
    return ["DejaVu Sans", HANGUL_FONT] if language == "en" else [HANGUL_FONT, "DejaVu Sans"]


@contextmanager
def drawing(language: str, labels: dict | None = None):
    """Draw in `language`'s fonts; yields the function that looks up a label by its key (in `labels`,
    LABELS by default), in `language` (kvlab.present.i18n), with its {names} filled in."""
    labels = labels or LABELS
    translate = gettext_for(language)

    def text(key: str, **values) -> str:
        return translate(labels[key]).format(**values)

    with plt.rc_context({"font.family": font_families(language), "axes.unicode_minus": True}):
        yield text


def drawn_text(fig) -> tuple[str, list[str]]:
    """The figure's title (its suptitle, else its first axes' title) and every title, axis label
    and legend entry drawn on it, in order."""
    title = fig.get_suptitle()
    labels = []
    for ax in fig.axes:
        labels += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        if legend is not None:
            labels += [entry.get_text() for entry in legend.get_texts()]
    labels = [label for label in labels if label]
    return title or (labels[0] if labels else ""), labels


def save(fig, path) -> None:
    """Lay out and save `fig` as a PNG whose Title and Description metadata hold its text."""
    fig.tight_layout()
    title, labels = drawn_text(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata={"Title": title, "Description": "\n".join(labels)})
    plt.close(fig)


def cost_curves(rows: list[dict], path, language: str = "en") -> None:
    """Left: tokens fed to forward against N, measured points on both formulas (log-log, so
    the slopes read as growth orders). Right: median generation time against N."""
    n = np.array([row["new_tokens"] for row in rows])
    prompt_len = rows[0]["prompt_len"]
    fine = np.linspace(n.min(), n.max(), 200)
    with drawing(language) as text:
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
        tokens_ax.set_xlabel(text("new_tokens_log"))
        tokens_ax.set_ylabel(text("fed_total_log"))
        tokens_ax.set_title(text("work_title", prompt_len=prompt_len))
        tokens_ax.grid(True, which="both", alpha=0.3)
        tokens_ax.legend(fontsize=8)

        time_ax.plot(n, [row["with_cache_s"] for row in rows], "o-", **with_cache)
        time_ax.plot(n, [row["without_cache_s"] for row in rows], "s-", **without_cache)
        time_ax.set_xlabel(text("new_tokens"))
        time_ax.set_ylabel(text("median_time"))
        time_ax.set_title(text("time_title"))
        time_ax.grid(True, alpha=0.3)
        time_ax.legend(fontsize=8)
        fig.suptitle(text("cost_title"))
        save(fig, path)


def step_times(latency: dict, path, language: str = "en") -> None:
    """Step time against the context the step attends over, both modes, with the fitted line."""
    with drawing(language) as text:
        fig, ax = plt.subplots(figsize=(11, 4.8))
        for label, color, marker in (("without_cache", WITHOUT_CACHE_COLOR, "s"),
                                     ("with_cache", WITH_CACHE_COLOR, "o")):
            mode = latency[label]
            ms = np.array(mode["step_s"]) * 1000
            ax.plot(mode["context_tokens"][1:], ms[1:], marker, ms=4, color=color,
                    label=text("decode_steps", mode=text(label), tpot=mode["tpot_s"] * 1000))
            ax.plot(mode["context_tokens"][:1], ms[:1], marker, ms=11, mfc="none", mew=2, color=color,
                    label=text("prefill_step", mode=text(label), ttft=mode["ttft_s"] * 1000))
        fit = latency["fit"]
        context = np.array(latency["without_cache"]["context_tokens"])
        ax.plot(context, (fit["fixed_s"] + fit["per_token_s"] * context) * 1000, "k--", lw=1,
                label=text("fit_line", fixed=fit["fixed_s"] * 1000, per_token=fit["per_token_s"] * 1e6))
        ax.set_xlabel(text("context_length"))
        ax.set_ylabel(text("step_time"))
        ax.set_ylim(bottom=0)
        ax.set_title(text("steps_title", new_tokens=latency["new_tokens"], repeats=latency["repeats"]))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        save(fig, path)


def topp_survivors(rows: list[dict], path, language: str = "en") -> None:
    """Survivors of top-p against p, after each of the two prefixes; the whole vocabulary as a
    ceiling, and the lab sheet's p values marked. The legend quotes the prefixes only: which of
    them leaves more candidates is for the data to show, not the label."""
    ps = [row["p"] for row in rows]
    vocab_size = rows[0]["vocab_size"]
    marked_ps = [row["p"] for row in rows if row["lab_p"]]
    with drawing(language) as text:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        ax.plot(ps, [row["flat"] for row in rows], "o-", color="tab:green", ms=4,
                label=text("after_prefix", prefix=rows[0]["flat_prefix"]))
        ax.plot(ps, [row["sharp"] for row in rows], "s-", color="tab:purple", ms=4,
                label=text("after_sharp_prefix", prefix=rows[0]["sharp_prefix"]))
        ax.axhline(vocab_size, color="grey", ls=":", lw=1, label=text("whole_vocabulary", vocab_size=vocab_size))
        for index, p in enumerate(marked_ps):
            ax.axvline(p, color="grey", ls="--", lw=0.8, alpha=0.6, label=text("lab_ps") if index == 0 else None)
        ax.set_yscale("log")
        ax.set_xlabel(text("topp_threshold"))
        ax.set_ylabel(text("kept_log"))
        ax.set_title(text("topp_title"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=9, loc="upper left")
        save(fig, path)


def temperature_effect(rows: list[dict], path, language: str = "en") -> None:
    """Left: distinct answers against temperature, up to all of them. Right: the mean entropy
    of the distributions the tokens were drawn from, up to that of a uniform pick."""
    temperatures = [row["temperature"] for row in rows]
    samples = rows[0]["samples"]
    vocab_size = rows[0]["vocab_size"]
    uniform = float(np.log(vocab_size))
    with drawing(language) as text:
        fig, (distinct_ax, entropy_ax) = plt.subplots(1, 2, figsize=(11, 4.2))

        distinct_ax.plot(temperatures, [row["distinct"] for row in rows], "o-", color="tab:orange",
                         label=text("distinct_of", samples=samples))
        distinct_ax.axhline(samples, color="grey", ls=":", lw=1, label=text("all_different", samples=samples))
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
        entropy_ax.set_ylim(0, uniform * 1.1)
        entropy_ax.set_xlabel(text("temperature"))
        entropy_ax.set_ylabel(text("entropy_nats"))
        entropy_ax.set_title(text("entropy_title"))
        entropy_ax.grid(True, alpha=0.3)
        entropy_ax.legend(loc="center left", fontsize=9)
        fig.suptitle(text("temperature_title"))
        save(fig, path)


def compare(rows: list[dict], path, language: str = "en") -> None:
    """Left: measured and predicted speedup against parameter count (log x), under the token ratio.
    Right: an average step of each mode (one token fed with the cache, P + (N-1)/2 without) split into
    the fit's fixed and per-token parts, as shares of the step's time (total in ms on top)."""
    params = np.array([row["parameters"] for row in rows], dtype=float)
    names = [row["name"] for row in rows]
    with drawing(language) as text:
        fig, (speed_ax, split_ax) = plt.subplots(1, 2, figsize=(11.5, 4.6))

        ratios = sorted({round(row["token_ratio"], 6) for row in rows})
        for index, ratio in enumerate(ratios):
            speed_ax.axhline(ratio, color="grey", ls=":", lw=1.2,
                             label=text("token_ratio", ratio=ratio) if index == 0 else None)
        speedups = np.array([row["speedup"] for row in rows])
        speed_ax.errorbar(params, speedups, yerr=[speedups - [row["speedup_low"] for row in rows],
                                                  [row["speedup_high"] for row in rows] - speedups],
                          fmt="o-", color="tab:blue", ms=7, capsize=4, label=text("measured_speedup"))
        speed_ax.plot(params, [row["predicted_speedup"] for row in rows], "D", color="tab:orange", ms=6, mfc="none",
                      mew=1.5, label=text("predicted_speedup"))
        for x, y, name in zip(params, [row["speedup"] for row in rows], names):
            speed_ax.annotate(name, (x, y), textcoords="offset points", xytext=(0, 9), ha="center", fontsize=8)
        speed_ax.set_xscale("log")
        speed_ax.set_yscale("log")
        speed_ax.set_xlim(params.min() / 2.5, params.max() * 2.5)
        speed_ax.set_ylim(1, max(ratios) * 1.6)
        ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if t <= max(ratios) * 1.6]
        speed_ax.set_yticks(ticks, [f"{t}×" for t in ticks])
        speed_ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        speed_ax.set_xlabel(text("parameters_log"))
        speed_ax.set_ylabel(text("speedup_log"))
        speed_ax.set_title(text("speedup_title", prompt_len=rows[0]["prompt_len"], new_tokens=rows[0]["new_tokens"]))
        speed_ax.grid(True, which="both", alpha=0.3)
        speed_ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.84))

        # an average step of each mode: one token fed with the cache, P + (N - 1) / 2 without
        positions = np.arange(len(rows))
        width = 0.38
        modes = ((-width / 2, text("with"), True), (width / 2, text("without"), False))
        for offset, label, use_cache in modes:
            total = np.array([sum(average_step_s(row, use_cache)) for row in rows]) * 1000
            shares = np.array([fixed_share(row, use_cache) for row in rows]) * 100
            split_ax.bar(positions + offset, shares, width, color="tab:grey",
                         label=text("fixed_part") if offset < 0 else None)
            split_ax.bar(positions + offset, 100 - shares, width, bottom=shares, color="tab:green",
                         label=text("per_token_part") if offset < 0 else None)
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
        split_ax.set_ylabel(text("step_share"))
        split_ax.set_title(text("average_step_title"))
        split_ax.grid(True, axis="y", alpha=0.3)
        split_ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
        fig.suptitle(text("compare_title"))
        save(fig, path)


def batch(rows: list[dict], path, language: str = "en") -> None:
    """Left: decode throughput against B, both modes, with each point's interval. Right: a decode
    step's median time against B: flat while the step's fixed cost dominates, rising once rows do."""
    styles = {"shared": ("tab:blue", "o"), "distinct": ("tab:orange", "s")}
    with drawing(language) as text:
        fig, (speed_ax, step_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
        top = max(row["S_TG_high"] for row in rows)
        for mode, (color, marker) in styles.items():
            mode_rows = [row for row in rows if row["mode"] == mode]
            if not mode_rows:
                continue
            sizes = np.array([row["B"] for row in mode_rows])
            speed = np.array([row["S_TG t/s"] for row in mode_rows])
            label = text(f"mode_{mode}", pp=mode_rows[0]["PP"])
            speed_ax.errorbar(sizes, speed, yerr=[speed - [row["S_TG_low"] for row in mode_rows],
                                                  [row["S_TG_high"] for row in mode_rows] - speed],
                              fmt=f"{marker}-", color=color, capsize=3, label=label)
            step_ax.plot(sizes, [row["ms_per_step"] for row in mode_rows], f"{marker}-", color=color, label=label)
            if mode == "shared":
                # the ceiling: every row for the price of the smallest B's step
                speed_ax.plot(sizes, speed[0] * sizes / sizes[0], ":", color="grey", label=text("ideal_scaling"))
        sizes = sorted({row["B"] for row in rows})
        for ax in (speed_ax, step_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sizes, [str(size) for size in sizes])
            ax.set_xlabel(text("batch_size_log"))
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8, loc="upper left")
        speed_ax.set_ylim(0, top * 1.15)  # the ideal line may run far above the measured points
        speed_ax.set_ylabel(text("decode_throughput"))
        speed_ax.set_title(text("throughput_title"))
        step_ax.set_ylabel(text("step_ms"))
        step_ax.set_title(text("step_ms_title"))
        fig.suptitle(text("batch_title", tg=rows[0]["TG"]))
        save(fig, path)


def kv_waste(rows: list[dict], path, language: str = "en") -> None:
    """One stacked bar per reservation policy: the shares of its reserved bytes that hold token states,
    are held for tokens still to come, and are never used; how many requests fit on top; the vLLM
    paper's token-state shares drawn beside, labelled as theirs."""
    parts = (("token_share", "token_states", "tab:green"), ("reservation_share", "reservation", "tab:olive"),
             ("internal_fragmentation_share", "internal_fragmentation", "tab:red"))
    budget, column = next(iter(fits_budgets(rows[0]).items()))
    with drawing(language) as text:
        fig, ax = plt.subplots(figsize=(12, 5))
        positions = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for key, label, color in parts:
            shares = np.array([row[key] for row in rows]) * 100
            ax.bar(positions, shares, 0.6, bottom=bottom, color=color, label=text(label))
            bottom += shares
        for x, row in zip(positions, rows):
            ax.annotate(text("fits_label", fits=row[column], budget=budget), (x, 100),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
        # the paper's token-state shares, apart on the right, hatched: theirs, not measured here
        low, high = VLLM_PAPER["existing_token_share"]
        theirs = len(rows) + 0.5 + np.arange(2)
        ax.bar(theirs[0], high * 100, 0.6, color="none", edgecolor="tab:green", hatch="//",
               label=text("paper_existing", low=low * 100, high=high * 100))
        ax.errorbar(theirs[0], (low + high) / 2 * 100, yerr=(high - low) / 2 * 100, fmt="none", color="black",
                    capsize=5)
        ax.bar(theirs[1], VLLM_PAPER["vllm_token_share"] * 100, 0.6, color="none", edgecolor="tab:green",
               hatch="xx", label=text("paper_vllm", share=VLLM_PAPER["vllm_token_share"] * 100))
        ax.set_xticks([*positions, *theirs], [row["policy"] for row in rows] + [text("paper_existing_tick"),
                                                                               text("paper_vllm_tick")],
                      fontsize=8)
        ax.set_ylim(0, 118)
        ax.set_yticks([0, 25, 50, 75, 100])
        ax.set_ylabel(text("reserved_share"))
        ax.set_title(text("kv_waste_title", requests=rows[0]["requests"]))
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        save(fig, path)


ANATOMY_COLORS = {"fixed": "lightgray", "matmul": "tab:blue", "attention": "tab:orange", "norm": "tab:green",
                  "rope": "tab:purple", "cache": "tab:red", "sampling": "tab:brown", "other_operators": "tab:gray"}
CURVE_STYLES = {"cat": (WITH_CACHE_COLOR, "o"), "static": ("tab:green", "s"), "compiled": ("tab:purple", "^")}


def step_anatomy(data: dict, path, language: str = "en") -> None:
    """Left: the lab's last step, three ways, as stacked bars of milliseconds by part (fixed cost, then
    the computation by what it does), each with the step timed without the profiler as a black mark
    and its quartiles: where the bar ends by the mark, the parts add up. Right: one decode step
    against its context length, with each cache (and compiled, when it ran)."""
    anatomy, curve = data["anatomy"], data["curve"]
    labels = {"with_cache_cat": "step_cat", "with_cache_static": "step_static", "without_cache": "step_uncached"}
    names = anatomy["steps"]
    with drawing(language) as text:
        fig, (left, right) = plt.subplots(1, 2, figsize=(14, 6.5), gridspec_kw={"width_ratios": [1.2, 1]})
        positions = np.arange(len(names))[::-1]
        ends = np.zeros(len(names))
        for part in anatomy["parts"]:
            widths = np.array([anatomy[name]["ms"][part] for name in names])
            left.barh(positions, widths, 0.6, left=ends, color=ANATOMY_COLORS[part], label=text(f"part_{part}"))
            ends += widths
        measured = np.array([anatomy[name]["step_ms"] for name in names])
        spread = [measured - [anatomy[name]["step"]["q1_s"] * 1e3 for name in names],
                  [anatomy[name]["step"]["q3_s"] * 1e3 for name in names] - measured]
        left.errorbar(measured, positions + 0.4, xerr=spread, fmt="v", color="black", capsize=3, ms=6,
                      label=text("unprofiled_step"))
        for y, end, name in zip(positions, ends, names):
            step = anatomy[name]
            left.annotate(text("anatomy_label", sum=end, fixed=100 * step["shares"]["fixed"],
                               off=100 * step["sum_of_parts_off"]),
                          (max(end, step["step"]["q3_s"] * 1e3), y), textcoords="offset points", xytext=(4, 0),
                          va="center", fontsize=8)
        left.set_yticks(positions, [text(labels[name]) for name in names], fontsize=8)
        left.set_xlim(0, max(ends.max(), measured.max()) * 1.9)
        left.set_xlabel(text("profiled_ms"), fontsize=8)
        left.set_title(text("anatomy_title", context=anatomy["context_tokens"]))
        left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3)
        for kind in curve["kinds"]:
            color, marker = CURVE_STYLES[kind]
            row = curve[kind]
            median = np.array(row["step_ms"])
            right.errorbar(curve["contexts"], median, yerr=[median - np.array(row["q1_ms"]), np.array(row["q3_ms"]) - median],
                           color=color, marker=marker, capsize=3, lw=1,
                           label=text(f"cache_{kind}", mode=row.get("mode")))
        right.set_xlabel(text("cache_context"))
        right.set_ylabel(text("decode_step_ms"))
        right.set_title(text("curve_title"))
        right.legend(fontsize=8)
        fig.suptitle(text("step_anatomy_title"))
        save(fig, path)
