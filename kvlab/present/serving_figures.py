"""The continuous-batching figures (rules/serving.smk's results), drawn as kvlab.present.drawing draws
every figure: matplotlib's Agg backend, labels in the report's language, a PNG saved atomically with its
text in its metadata.

  serve_timeline  the trace served twice, static above continuous: each request a row (waiting, its
                  prompt fed, decoding), the blocks in use beneath, on the engine's step clock
  serve_latency   latency against the request rate, both policies, the rates as fractions of the
                  saturation throughput measured first (the PagedAttention paper's Fig. 12 shape), in
                  engine steps (exact) and in seconds (this machine)
  serve_bench     `kvlab serve` measured over HTTP (results/serving/bench.csv): latency and goodput
                  against the offered request rate, each server a line
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.transforms import ScaledTranslation

from kvlab.present.drawing import drawing, save
from kvlab.present.i18n import N_

POLICY_STYLES = {"static": ("tab:red", "s"), "continuous": ("tab:blue", "o")}
# serve_bench's servers (kvlab.measure.serving_bench.SERVERS)
SERVER_STYLES = {**POLICY_STYLES, "eager": ("tab:gray", "^")}
# A run whose process had the CPU for less of its steps' time than this waited for it (pyperf warns so).
WAITED_BELOW = 0.9
PHASE_COLORS = {"waiting": "#d9d9d9", "prefill": "tab:orange", "decoding": "tab:blue"}

LABELS = {
    "timeline_title": N_("One trace of {requests} requests served twice (each row a request, {slots} slots)"),
    "panel_static": N_("static batching: a batch of up to {slots} starts together and waits for its longest request; {steps} forward steps, slot utilisation {utilisation:.0%}"),
    "panel_continuous": N_("continuous batching: a request joins at the first free slot and leaves when done; {steps} forward steps, slot utilisation {utilisation:.0%}"),
    "waiting": N_("waiting (arrived, not admitted)"),
    "prefill": N_("prompt fed (first token drawn)"),
    "decoding": N_("decoding (one token a step)"),
    "preempted": N_("preempted (blocks taken back)"),
    "request": N_("request (by arrival)"),
    "blocks": N_("blocks in use"),
    "done_at": N_("last step {step}"),
    "engine_step": N_("engine step (a forward step, or a tick waiting for the next arrival: the same on every machine)"),
    "latency_title": N_("Latency against the request rate ({requests} requests a run, arriving at Poisson steps; as the PagedAttention paper's Fig. 12)"),
    "rate_fraction": N_("request rate / continuous batching's saturation throughput ({saturation:.3f} requests a step)"),
    "normalized_steps": N_("forward steps per output token (mean over requests)"),
    "normalized_seconds": N_("seconds per output token (mean over requests)"),
    "steps_title": N_("normalized latency in engine steps (exact, any machine)"),
    "seconds_title": N_("normalized latency in seconds (this machine)"),
    "never_waiting": N_("1 step a token: never kept waiting"),
    "policy_static": N_("static batching"),
    "policy_continuous": N_("continuous batching"),
    "saturation_continuous": N_("continuous saturates"),
    "saturation_static": N_("static saturates ({fraction:.2f})"),
    "cut_note": N_("open marker: cut at rate_max_seconds, only finished requests counted"),
    "waited_note": N_("in some runs the process had the CPU for only {share:.0%} of its steps' time:\nother work shared the machine, so these seconds are noisy"),
    "offered_rate": N_("offered request rate (requests/s)"),
    "ttft_ms": N_("time to first token (ms, log scale)"),
    "tpot_ms": N_("time per output token (ms)"),
    "requests_per_s": N_("requests/s"),
    "p50": N_("{policy} p50"),
    "p99": N_("{policy} p99"),
    "throughput": N_("{policy}: completed"),
    "goodput": N_("{policy}: goodput (both SLOs met)"),
    "offered": N_("offered"),
    "saturation": N_("{policy} saturates ({rate:.2f} req/s)"),
    "server_continuous": N_("continuous, compiled"),
    "server_static": N_("static, compiled"),
    "server_eager": N_("continuous, eager"),
    "slo": N_("SLO ({ms:.0f} ms)"),
    "slo_tpot": N_("SLO ({ms:.1f} ms)"),
    "ttft_title": N_("TTFT"),
    "tpot_title": N_("TPOT"),
    "goodput_title": N_("Throughput and goodput"),
    "serve_bench_title": N_("kvlab serve at rising request rates ({output_tokens} tokens per request, Poisson arrivals, measured by an HTTP client)"),
}


def phases(request: dict) -> list[tuple[str, int, int]]:
    """A request's life as (phase, first step, end step): waiting from its arrival (and again after each
    preemption) to an admission, its prompt (or what it computes again) fed at the admission's step, then
    decoding until its finish or the next preemption."""
    spans = []
    admissions = sorted(request["admissions"])
    preemptions = sorted(request["preemptions"])
    waiting_from = request["arrival"]
    for index, admitted in enumerate(admissions):
        spans.append(("waiting", waiting_from, admitted))
        spans.append(("prefill", admitted, admitted + 1))
        stopped = preemptions[index] if index < len(preemptions) else None
        end = stopped if stopped is not None else (request["finish"] + 1 if request["finish"] is not None
                                                   else admitted + 1)
        spans.append(("decoding", admitted + 1, end))
        waiting_from = stopped
    return [span for span in spans if span[2] > span[1]]


def serve_timeline(data: dict, path, language: str = "en") -> None:
    """Static above continuous on one shared step axis: each request a row, coloured by phase, the
    blocks in use at every forward step beneath each."""
    timelines, summaries = data["timelines"], data["summaries"]
    policies = ("static", "continuous")
    requests = len(timelines["static"]["requests"])
    slots = timelines["static"]["slots"]
    with drawing(language, LABELS) as text:
        fig, axes = plt.subplots(4, 1, figsize=(13, 3.2 + 0.42 * requests), sharex=True,
                                 gridspec_kw={"height_ratios": [requests, 4, requests, 4]})
        last = max(max(t["steps"]) for t in timelines.values() if t["steps"])
        top_blocks = max(max(timelines[policy]["blocks_in_use"]) for policy in policies)
        for number, policy in enumerate(policies):
            line = timelines[policy]
            rows_ax, blocks_ax = axes[2 * number], axes[2 * number + 1]
            for y, request in enumerate(line["requests"]):
                for phase, start, end in phases(request):
                    rows_ax.barh(y, end - start, left=start, height=0.7, color=PHASE_COLORS[phase],
                                 edgecolor="white", linewidth=0.3)
                for step in request["preemptions"]:
                    rows_ax.plot(step, y, "x", color="black", markersize=6)
            rows_ax.set_ylim(requests - 0.5, -0.5)
            rows_ax.set_yticks(range(requests))
            rows_ax.tick_params(axis="y", labelsize=7)
            rows_ax.set_ylabel(text("request"), fontsize=8)
            summary = summaries[policy]
            rows_ax.set_title(text(f"panel_{policy}", slots=slots, steps=summary["forward_steps"],
                                   utilisation=summary["slot_utilisation"]), fontsize=9, loc="left")
            finished = max(line["steps"])
            for ax in (rows_ax, blocks_ax):
                ax.axvline(finished + 1, color="black", linestyle="--", linewidth=0.8)
            rows_ax.annotate(text("done_at", step=finished), (finished + 1, requests - 0.5), xytext=(3, 3),
                             textcoords="offset points", fontsize=7, va="bottom")
            # each step's blocks held through that step: the last one to the end of its step
            steps = np.array([*line["steps"], finished + 1])
            blocks = [*line["blocks_in_use"], line["blocks_in_use"][-1]]
            blocks_ax.step(steps, blocks, where="post", color="tab:green")
            blocks_ax.fill_between(steps, blocks, step="post", color="tab:green", alpha=0.25)
            blocks_ax.set_ylim(0, top_blocks * 1.15)
            blocks_ax.set_ylabel(text("blocks"), fontsize=7)
            blocks_ax.grid(True, axis="y", alpha=0.3)
        handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLORS[phase]) for phase in PHASE_COLORS]
        labels = [text(phase) for phase in PHASE_COLORS]
        if any(r["preemptions"] for policy in policies for r in timelines[policy]["requests"]):
            handles.append(plt.Line2D([], [], marker="x", color="black", linestyle=""))
            labels.append(text("preempted"))
        # over the first panel's title by a fixed 16 points, whatever the panel's height (an offset in
        # axes fractions grows with the requests and met the figure's title at 24)
        above = axes[0].transAxes + ScaledTranslation(0, 16 / 72, fig.dpi_scale_trans)
        axes[0].legend(handles, labels, fontsize=8, loc="lower right", ncol=len(labels), framealpha=0.9,
                       bbox_to_anchor=(1.0, 1.0), bbox_transform=above)
        axes[-1].set_xlim(-0.5, last + 2 + 0.08 * last)  # room for the last step's label
        axes[-1].set_xlabel(text("engine_step"))
        # the title in a band of its own, fixed in inches: the figure grows with the requests
        height = fig.get_figheight()
        fig.suptitle(text("timeline_title", requests=requests, slots=slots), y=1 - 0.12 / height, va="top")
        save(fig, path, rect=(0, 0, 1, 1 - 0.3 / height))


# The gid of serve_latency's note on its times (tests find it by it).
NOTE = "times_note"


def serve_latency(rows: list[dict], path, language: str = "en") -> None:
    """The paper's normalized latency (each request's end-to-end latency over its output tokens, averaged)
    against the request rate, both policies, the rates as fractions of continuous batching's saturation
    throughput, each policy's saturation marked. Left: in forward steps, exact (1: never kept waiting);
    right: in seconds, on this machine."""
    saturation = next(row["rate_per_step"] / row["fraction"] for row in rows)
    static_saturates = rows[0]["saturation_fraction_static"]
    with drawing(language, LABELS) as text:
        fig, (steps_ax, seconds_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
        for policy, (color, marker) in POLICY_STYLES.items():
            points = sorted((row for row in rows if row["policy"] == policy), key=lambda row: row["fraction"])
            fractions = [row["fraction"] for row in points]
            for ax, key in ((steps_ax, "normalized_latency_steps"), (seconds_ax, "normalized_latency_s")):
                values = [row[key] for row in points]
                ax.plot(fractions, values, f"{marker}-", color=color, label=text(f"policy_{policy}"))
                cut = [(x, v) for x, v, row in zip(fractions, values, points) if row["cut"] and not math.isnan(v)]
                if cut:
                    ax.plot(*zip(*cut), marker, color="white", markeredgecolor=color, markersize=9)
        steps_ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8, label=text("never_waiting"))
        for ax in (steps_ax, seconds_ax):
            ax.axvline(1.0, color="tab:blue", linestyle=":", linewidth=1, label=text("saturation_continuous"))
            ax.axvline(static_saturates, color="tab:red", linestyle=":", linewidth=1,
                       label=text("saturation_static", fraction=static_saturates))
            ax.set_xlabel(text("rate_fraction", saturation=saturation), fontsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
        steps_ax.set_ylabel(text("normalized_steps"))
        steps_ax.set_title(text("steps_title"))
        seconds_ax.set_ylabel(text("normalized_seconds"))
        seconds_ax.set_title(text("seconds_title"))
        steps_ax.legend(fontsize=8, loc="lower right")
        notes = [text("cut_note")] if any(row["cut"] for row in rows) else []
        least = min((row["cpu_share"] for row in rows if not math.isnan(row["cpu_share"])), default=1.0)
        if least < WAITED_BELOW:
            notes.append(text("waited_note", share=least))
        note = "\n".join(notes)
        if note:  # about the times: under the panels, where no line or point of theirs runs
            fig.text(0.5, 0.01, note, ha="center", va="bottom", fontsize=7, color="dimgray", gid=NOTE)
        fig.suptitle(text("latency_title", requests=rows[0]["requests"]))
        save(fig, path, rect=(0, 0.02 + 0.03 * (note.count("\n") + 1), 1, 1) if note else None)


def serve_bench(rows: list[dict], path, language: str = "en") -> None:
    """Left: TTFT p50 and p99 against the offered rate; middle: TPOT; right: completed requests and
    goodput per second against the offered rate. A dashed line of its colour marks each server's
    saturation throughput, a dotted one each SLO."""
    with drawing(language, LABELS) as text:
        fig, (ttft_ax, tpot_ax, good_ax) = plt.subplots(1, 3, figsize=(14, 4.6))
        for server, (color, marker) in SERVER_STYLES.items():
            mine = sorted((row for row in rows if row["server"] == server), key=lambda row: row["rate_rps"])
            if not mine:
                continue
            name = text(f"server_{server}")
            rate = np.array([row["rate_rps"] for row in mine])
            for ax, quantity in ((ttft_ax, "ttft"), (tpot_ax, "tpot")):
                ax.plot(rate, [row[f"{quantity}_p50_ms"] for row in mine], f"{marker}-", color=color,
                        label=text("p50", policy=name))
                ax.plot(rate, [row[f"{quantity}_p99_ms"] for row in mine], f"{marker}--", color=color, alpha=0.6,
                        label=text("p99", policy=name))
            good_ax.plot(rate, [row["throughput_rps"] for row in mine], f"{marker}-", color=color,
                         label=text("throughput", policy=name))
            good_ax.plot(rate, [row["goodput_rps"] for row in mine], f"{marker}:", color=color,
                         label=text("goodput", policy=name))
            for ax in (ttft_ax, tpot_ax, good_ax):
                ax.axvline(mine[0]["saturation_rps"], color=color, ls="--", lw=0.8,
                           label=text("saturation", policy=name, rate=mine[0]["saturation_rps"]))
        top = max(row["rate_rps"] for row in rows)
        good_ax.plot([0, top], [0, top], color="grey", lw=0.8, label=text("offered"))
        ttft_ax.axhline(rows[0]["slo_ttft_ms"], color="grey", ls=":", label=text("slo", ms=rows[0]["slo_ttft_ms"]))
        tpot_ax.axhline(rows[0]["slo_tpot_ms"], color="grey", ls=":",
                        label=text("slo_tpot", ms=rows[0]["slo_tpot_ms"]))
        ttft_ax.set_yscale("log")
        for ax, ylabel, title in ((ttft_ax, "ttft_ms", "ttft_title"), (tpot_ax, "tpot_ms", "tpot_title"),
                                  (good_ax, "requests_per_s", "goodput_title")):
            ax.set_xlabel(text("offered_rate"))
            ax.set_ylabel(text(ylabel))
            ax.set_title(text(title))
            ax.set_xlim(left=0)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        tpot_ax.set_ylim(bottom=0)
        good_ax.set_ylim(bottom=0)
        fig.suptitle(text("serve_bench_title", output_tokens=rows[0]["output_tokens"]))
        save(fig, path)
