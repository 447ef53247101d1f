"""The figures beyond the lab sheet: the cache's speedup across model sizes, many requests at once,
how a cache is reserved, where a step's time goes, and decoding path against path. Drawn as
kvlab.present.drawing draws every figure; each function takes the rows a rule wrote and saves one PNG.

  compare       the speedup against model size, and an average step split into its fixed and per-token parts
  batch         decode throughput and a step's time against the batch size B (llama-batched-bench)
  kv_waste      what each reservation policy's reserved cache holds, beside the vLLM paper's shares
  step_anatomy  the lab's last step opened by part, and one decode step as the cache fills
  decode_bench  ms per new token of each decoding path, above the core's arithmetic limit and read floor
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from kvlab.facts.compare import average_step_s, fixed_share
from kvlab.facts.formulas import VLLM_PAPER, fits_budgets
from kvlab.present.drawing import WITH_CACHE_COLOR, disturbed, drawing, mark_disturbed, save
from kvlab.present.i18n import N_

# the gid of what a test looks for: the band of the vLLM paper's existing systems
PAPER_RANGE = "paper_range"

# Every label drawn, by key, in English; its Korean is in the catalog (kvlab.present.i18n). {names} are
# filled in by the caller.
LABELS = {
    "token_ratio": N_("token ratio {ratio:.1f}×: the speedup if time were proportional to tokens fed"),
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
    "batch_size": N_("batch size B (rows)"),
    "decode_throughput": N_("decode throughput S_TG (tokens/s)"),
    "throughput_title": N_("Tokens per second (bars: interval over the runs)"),
    "mode_shared": N_("shared prompt: one prompt ({pp} tokens) in every row"),
    "mode_distinct": N_("distinct prompts: B validation prompts, left-padded"),
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
    # the policies as the report names them (kv_waste.csv keeps their code names)
    "policy_max_length": N_("the longest\nrequest allowed"),
    "policy_power_of_two": N_("doubling\nas it grows"),
    "policy_exact": N_("the final length,\nknown in advance"),
    "policy_blocks": N_("blocks\n(paging)"),
    "paper_existing_tick": N_("paper:\nexisting systems"),
    "paper_vllm_tick": N_("paper:\nvLLM"),
    "ideal_scaling": N_("if a step cost the same at every B"),
    "kv_waste_title": N_("What the reserved cache holds ({requests} real requests), by how it is reserved"),
    "bytes_per_token": N_("bytes a token keeps in the cache"),
    "fits_requests": N_("{fits:,} requests\nfit {budget} GiB"),
    "dtype_bytes_title": N_("What the cache costs: bytes a token (requests of {context} tokens that fit)"),
    "first_change": N_("new tokens the same as float32's"),
    "same_through": N_("the same through {n}"),
    "differs_at": N_("new token {at} differs\n(KL at most {kl:.1e})"),
    "dtype_tokens_title": N_("What it changes: greedy new tokens before the first that differs"),
    "kv_dtype_title": N_("The KV cache in fewer bits, on the lab's model and prompt"),
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
    "cached_ms": N_("ms, on an axis of their own: the cached steps' parts"),
    "cached_axis": N_("the upper panel's whole axis (0–{end:.1f} ms)"),
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
    "decode_title": N_("Decoding path against path ({prompt_len}-token prompt, one thread, median of alternating rounds)"),
    "ms_per_token": N_("ms per new token (log scale; bars: quartiles)"),
    "decode_new_tokens": N_("new tokens generated"),
    "path_cat": N_("MiniMind's torch.cat cache (kvlab, as MiniMind)"),
    "path_static": N_("preallocated cache, eager"),
    "path_compiled": N_("preallocated cache, compiled step"),
    "path_minimind": N_("MiniMind's own generate"),
    "arithmetic_limit": N_("this core's arithmetic limit (FLOPs / measured GFLOP/s)"),
    "read_floor": N_("this core's read floor (bytes a step reads / measured GB/s)"),
}


def compare(rows: list[dict], path, language: str = "en") -> None:
    """Left: measured and predicted speedup against parameter count (log x), and the token ratio: the
    speedup if time were proportional to the tokens fed (not a bound: time is not proportional).
    Right: an average step of each mode (one token fed with the cache, P + (N-1)/2 without) split into
    the fit's fixed and per-token parts, as shares of the step's time (total in ms on top)."""
    params = np.array([row["parameters"] for row in rows], dtype=float)
    names = [row["name"] for row in rows]
    with drawing(language, LABELS) as text:
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
        flagged = disturbed({"compare": rows})
        mark_disturbed(speed_ax, [(x, row["speedup"]) for x, row in zip(params, rows)
                                  if flagged("compare", name=row["name"])], text)
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
        split_ax.set_ylim(0, 125)  # room above the bars for their milliseconds and the legend
        split_ax.set_yticks([0, 25, 50, 75, 100])
        split_ax.set_ylabel(text("step_share"))
        split_ax.set_title(text("average_step_title"))
        split_ax.grid(True, axis="y", alpha=0.3)
        split_ax.legend(fontsize=8, loc="upper center", ncol=2, frameon=False, borderaxespad=0.2)
        fig.suptitle(text("compare_title"))
        save(fig, path)


def batch(rows: list[dict], path, language: str = "en") -> None:
    """Left: decode throughput against B, both modes, with each point's interval. Right: a decode
    step's median time against B: flat while the step's fixed cost dominates, rising once rows do.
    Both axes linear, so that growing in proportion to B reads as a straight line."""
    styles = {"shared": ("tab:blue", "o"), "distinct": ("tab:orange", "s")}
    with drawing(language, LABELS) as text:
        fig, (speed_ax, step_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
        top = max(row["S_TG_high"] for row in rows)
        flagged = disturbed({"batch": rows})
        marks = {speed_ax: [], step_ax: []}
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
            for ax, key in ((speed_ax, "S_TG t/s"), (step_ax, "ms_per_step")):
                marks[ax] += [(row["B"], row[key]) for row in mode_rows if flagged("batch", mode, n=row["B"])]
            if mode == "shared":
                # every row for the price of the smallest B's step
                speed_ax.plot(sizes, speed[0] * sizes / sizes[0], ":", color="grey", label=text("ideal_scaling"))
        for ax, points in marks.items():
            mark_disturbed(ax, points, text)
        # B on a linear axis, as both quantities: a step costing fixed + per row × B is a straight line;
        # every B measured has its tick and label, smaller where neighbours crowd (1, 2, 4 on a long axis)
        sizes = sorted({row["B"] for row in rows})
        crowded = any(b - a < 0.04 * (sizes[-1] - sizes[0]) for a, b in zip(sizes, sizes[1:]))
        for ax in (speed_ax, step_ax):
            ax.set_xticks(sizes, [str(size) for size in sizes], fontsize=7 if crowded else None)
            ax.set_xlim(0, sizes[-1] * 1.04)
            ax.set_xlabel(text("batch_size"))
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        # throughput levels off to the right, below its top; the step's time is low on the left
        speed_ax.legend(fontsize=8, loc="lower right")
        step_ax.legend(fontsize=8, loc="upper left")
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
    with drawing(language, LABELS) as text:
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
        # the paper's token-state shares, apart on the right, hatched: theirs, not measured here. Existing
        # systems are a range (20.4-38.2%), drawn as a band from its low end to its high end, not a bar.
        low, high = VLLM_PAPER["existing_token_share"]
        vllm_share = VLLM_PAPER["vllm_token_share"]
        theirs = len(rows) + 0.5 + np.arange(2)
        ax.bar(theirs[0], (high - low) * 100, 0.6, bottom=low * 100, color="none", edgecolor="tab:green", hatch="//",
               gid=PAPER_RANGE, label=text("paper_existing", low=low * 100, high=high * 100))
        ax.bar(theirs[1], vllm_share * 100, 0.6, color="none", edgecolor="tab:green",
               hatch="xx", label=text("paper_vllm", share=vllm_share * 100))
        # each end of the band and the vLLM bar carry their value: above the top, below the bottom
        for x, share, above in ((theirs[0], high, True), (theirs[0], low, False), (theirs[1], vllm_share, True)):
            ax.annotate(f"{share * 100:.1f}%", (x, share * 100), textcoords="offset points", xytext=(0, 3 if above else -3),
                        ha="center", va="bottom" if above else "top", fontsize=8)
        ax.set_xticks([*positions, *theirs], [text(f"policy_{row['policy']}") for row in rows]
                      + [text("paper_existing_tick"), text("paper_vllm_tick")], fontsize=8)
        ax.set_ylim(0, 118)
        ax.set_yticks([0, 25, 50, 75, 100])
        ax.set_ylabel(text("reserved_share"))
        ax.set_title(text("kv_waste_title", requests=rows[0]["requests"]))
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        save(fig, path)


def kv_dtype(rows: list[dict], path, language: str = "en") -> None:
    """Per dtype of the cache (kv_dtype.csv): left, the bytes a token keeps, with the requests of the
    sheet's length that fit the budget on top; right, how many greedy new tokens stay float32's before
    the first that differs (the longest N compared where none does), with the largest KL."""
    longest = max(int(key.split("_")[1]) for key in rows[0] if key.startswith("same_"))
    names = [row["kv_dtype"] for row in rows]
    positions = np.arange(len(rows))
    with drawing(language, LABELS) as text:
        fig, (bytes_ax, tokens_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
        bytes_ax.bar(positions, [row["bytes_per_token"] for row in rows], 0.6, color="tab:blue")
        for x, row in zip(positions, rows):
            bytes_ax.annotate(text("fits_requests", fits=row["fits_lab"], budget=row["budget_gib"]),
                              (x, row["bytes_per_token"]), textcoords="offset points", xytext=(0, 3), ha="center",
                              fontsize=7)
        bytes_ax.set_ylim(0, max(row["bytes_per_token"] for row in rows) * 1.3)
        bytes_ax.set_ylabel(text("bytes_per_token"))
        bytes_ax.set_title(text("dtype_bytes_title", context=rows[0]["lab_context"]), fontsize=10)
        kept = [longest if row[f"same_{longest}"] else int(row[f"first_diff_{longest}"]) for row in rows]
        colors = ["tab:green" if row[f"same_{longest}"] else "tab:orange" for row in rows]
        tokens_ax.bar(positions, kept, 0.6, color=colors)
        for x, row, height in zip(positions, rows, kept):
            label = (text("same_through", n=longest) if row[f"same_{longest}"]
                     else text("differs_at", at=height + 1, kl=row["max_kl"]))
            tokens_ax.annotate(label, (x, height), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
        tokens_ax.set_ylim(0, longest * 1.3)
        tokens_ax.set_ylabel(text("first_change"))
        tokens_ax.set_title(text("dtype_tokens_title"), fontsize=10)
        for ax in (bytes_ax, tokens_ax):
            ax.set_xticks(positions, names)
            ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(text("kv_dtype_title"))
        save(fig, path)


ANATOMY_COLORS = {"fixed": "lightgray", "matmul": "tab:blue", "attention": "tab:orange", "norm": "tab:green",
                  "rope": "tab:purple", "cache": "tab:red", "sampling": "tab:brown", "other_operators": "tab:gray"}
CURVE_STYLES = {"cat": (WITH_CACHE_COLOR, "o"), "static": ("tab:green", "s"), "compiled": ("tab:purple", "^")}


def anatomy_bars(ax, anatomy: dict, names: list[str], text, labels: dict, flagged) -> float:
    """The steps `names` of `anatomy` as stacked bars of milliseconds by part on `ax`, each with the
    step timed without the profiler as a black mark and its quartiles, and its sum, fixed share and
    how far it is off the mark beside it; the axis runs to 1.9 times the longest, leaving the words
    room; the mark of a step whose timing the machine disturbed (`flagged`, drawing.disturbed) beside
    its black mark. Returns the axis' end (ms)."""
    positions = np.arange(len(names))[::-1]
    ends = np.zeros(len(names))
    for part in anatomy["parts"]:
        widths = np.array([anatomy[name]["ms"][part] for name in names])
        ax.barh(positions, widths, 0.6, left=ends, color=ANATOMY_COLORS[part], label=text(f"part_{part}"))
        ends += widths
    measured = np.array([anatomy[name]["step_ms"] for name in names])
    q1 = np.array([anatomy[name]["step"]["q1_s"] * 1e3 for name in names])
    q3 = np.array([anatomy[name]["step"]["q3_s"] * 1e3 for name in names])
    ax.errorbar(measured, positions + 0.4, xerr=[measured - q1, q3 - measured], fmt="v", color="black", capsize=3, ms=6,
                label=text("unprofiled_step"))
    for y, end, top, name in zip(positions, ends, q3, names):
        step = anatomy[name]
        ax.annotate(text("anatomy_label", sum=end, fixed=100 * step["shares"]["fixed"], off=100 * step["sum_of_parts_off"]),
                    (max(end, top), y), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
    mark_disturbed(ax, [(step_ms, y + 0.4) for step_ms, y, name in zip(measured, positions, names)
                        if flagged("anatomy", name)], text)
    ax.set_yticks(positions, [text(labels[name]) for name in names], fontsize=8)
    ax.set_ylim(-0.5, len(names) - 0.5 + 0.25)
    right = max(ends.max(), q3.max()) * 1.9
    ax.set_xlim(0, right)
    return right


def step_anatomy(data: dict, path, language: str = "en") -> None:
    """Left: the lab's last step, three ways, as stacked bars of milliseconds by part (fixed cost, then
    the computation by what it does), each with the step timed without the profiler as a black mark
    and its quartiles: where the bar ends by the mark, the parts add up. The cached steps have an axis
    of their own, above the uncached step's (several times longer), so that their parts can be read;
    the uncached panel shades the cached panel's whole axis. Right: one decode step against its context
    length, with each cache (and compiled, when it ran)."""
    anatomy, curve = data["anatomy"], data["curve"]
    labels = {"with_cache_cat": "step_cat", "with_cache_static": "step_static", "without_cache": "step_uncached"}
    cached = [name for name in anatomy["steps"] if name != "without_cache"]
    with drawing(language, LABELS) as text:
        fig = plt.figure(figsize=(14, 7))
        grid = fig.add_gridspec(2, 2, width_ratios=[1.2, 1], height_ratios=[len(cached), 1])
        cached_ax, uncached_ax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0])
        right = fig.add_subplot(grid[:, 1])
        flagged = disturbed({"step_anatomy": data})
        cached_end = anatomy_bars(cached_ax, anatomy, cached, text, labels, flagged)
        cached_ax.set_title(text("anatomy_title", context=anatomy["context_tokens"]))
        cached_ax.set_xlabel(text("cached_ms"), fontsize=8)
        anatomy_bars(uncached_ax, anatomy, ["without_cache"], text, labels, flagged)
        uncached_ax.axvspan(0, cached_end, color="gold", alpha=0.18, zorder=0, label=text("cached_axis", end=cached_end))
        uncached_ax.set_xlabel(text("profiled_ms"), fontsize=8)
        # one legend for both panels, under them: the parts, the mark, the shaded span
        handles, names = cached_ax.get_legend_handles_labels()
        extra_handles, extra_names = uncached_ax.get_legend_handles_labels()
        span = [(handle, name) for handle, name in zip(extra_handles, extra_names) if name not in names]
        uncached_ax.legend(handles + [handle for handle, _ in span], names + [name for _, name in span], fontsize=7,
                           loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=3)
        marked = []
        for kind in curve["kinds"]:
            color, marker = CURVE_STYLES[kind]
            row = curve[kind]
            median = np.array(row["step_ms"])
            right.errorbar(curve["contexts"], median, yerr=[median - np.array(row["q1_ms"]), np.array(row["q3_ms"]) - median],
                           color=color, marker=marker, capsize=3, lw=1,
                           label=text(f"cache_{kind}", mode=row.get("mode")))
            marked += [(context, ms) for context, ms in zip(curve["contexts"], median) if flagged("curve", kind, n=context)]
        mark_disturbed(right, marked, text)
        right.set_xlabel(text("cache_context"))
        right.set_ylabel(text("decode_step_ms"))
        right.set_ylim(bottom=0)  # from zero: the step's fixed part is most of it
        right.set_title(text("curve_title"))
        right.grid(True, alpha=0.3)
        right.legend(fontsize=8, loc="upper left")
        fig.suptitle(text("step_anatomy_title"))
        save(fig, path)


DECODE_STYLES = {"cat": (WITH_CACHE_COLOR, "o"), "static": ("tab:green", "s"), "compiled": ("tab:purple", "^"),
                 "minimind": ("black", "x")}


def decode_bench(rows: list[dict], path, language: str = "en") -> None:
    """ms per new token of each path at each length (decode_bench.csv), on a log axis, with the core's
    arithmetic limit and read floor beneath: how far each path is from what its arithmetic and its
    reading of the weights need."""
    lengths = sorted({row["new_tokens"] for row in rows})
    with drawing(language, LABELS) as text:
        fig, ax = plt.subplots(figsize=(8, 5.6))
        for name, (color, marker) in DECODE_STYLES.items():
            mine = sorted((row for row in rows if row["path"] == name), key=lambda row: row["new_tokens"])
            if not mine:
                continue
            x = [row["new_tokens"] for row in mine]
            y = np.array([row["ms_per_token"] for row in mine])
            spread = np.array([[row["ms_per_token"] - row["q1_ms"] for row in mine],
                               [row["q3_ms"] - row["ms_per_token"] for row in mine]])
            ax.errorbar(x, y, yerr=spread, fmt=f"{marker}-", color=color, capsize=3, label=text(f"path_{name}"))
        limit = sorted(((row["new_tokens"], row["ms_per_token"] / row["times_limit"]) for row in rows
                        if row["path"] == "cat"))
        ax.plot([n for n, _ in limit], [ms for _, ms in limit], "k:", label=text("arithmetic_limit"))
        floor = sorted(((row["new_tokens"], row["ms_per_token"] / row["times_floor"]) for row in rows
                        if row["path"] == "cat" and row.get("times_floor")))
        if floor:
            ax.plot([n for n, _ in floor], [ms for _, ms in floor], "k--", label=text("read_floor"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))
        ax.set_xlabel(text("decode_new_tokens"))
        ax.set_ylabel(text("ms_per_token"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)  # under the axes: no line or marker hidden
        ax.set_title(text("decode_title", prompt_len=rows[0].get("prompt_len", "?")), fontsize=10)
        save(fig, path)
