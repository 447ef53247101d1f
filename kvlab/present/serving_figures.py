"""The figures of serving over HTTP (results/serving/bench.csv): latency and goodput against the offered
request rate, each policy a line, drawn as kvlab.present.figures draws (its fonts, languages and PNG
metadata)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from kvlab.present.figures import drawing, save

POLICY_STYLES = {"continuous": ("tab:blue", "o"), "static": ("tab:orange", "s")}

TEXT = {
    "en": {
        "offered_rate": "offered request rate (requests/s)",
        "ttft_ms": "time to first token (ms, log scale)",
        "tpot_ms": "time per output token (ms)",
        "requests_per_s": "requests/s",
        "p50": "{policy} p50",
        "p99": "{policy} p99",
        "throughput": "{policy}: completed",
        "goodput": "{policy}: goodput (both SLOs met)",
        "offered": "offered",
        "saturation": "saturation ({rate:.2f} req/s)",
        "slo": "SLO ({ms:.0f} ms)",
        "slo_tpot": "SLO ({ms:.1f} ms)",
        "ttft_title": "TTFT",
        "tpot_title": "TPOT",
        "goodput_title": "Throughput and goodput",
        "serve_bench_title": "kvlab serve at rising request rates ({output_tokens} tokens per request, "
                             "Poisson arrivals, measured by an HTTP client)",
    },
    "ko": {
        "offered_rate": "들어오는 요청 속도 (요청/초)",
        "ttft_ms": "첫 토큰까지 시간 (ms, 로그 눈금)",
        "tpot_ms": "출력 토큰당 시간 (ms)",
        "requests_per_s": "요청/초",
        "p50": "{policy} p50",
        "p99": "{policy} p99",
        "throughput": "{policy}: 끝낸 요청",
        "goodput": "{policy}: goodput (두 SLO 모두 지킴)",
        "offered": "들어온 요청",
        "saturation": "포화 ({rate:.2f} 요청/초)",
        "slo": "SLO ({ms:.0f} ms)",
        "slo_tpot": "SLO ({ms:.1f} ms)",
        "ttft_title": "TTFT",
        "tpot_title": "TPOT",
        "goodput_title": "처리량과 goodput",
        "serve_bench_title": "요청 속도를 올리며 본 kvlab serve (요청마다 {output_tokens}토큰, 포아송 도착, "
                             "HTTP 클라이언트가 측정)",
    },
}


def serve_bench(rows: list[dict], path, language: str = "en") -> None:
    """Left: TTFT p50 and p99 against the offered rate; middle: TPOT; right: completed requests and
    goodput per second against the offered rate. A dashed line marks the saturation throughput, a
    dotted one each SLO."""
    saturation = next(row["rate_rps"] / row["rate_fraction"] for row in rows)
    with drawing(language, TEXT) as text:
        fig, (ttft_ax, tpot_ax, good_ax) = plt.subplots(1, 3, figsize=(14, 4.6))
        for policy, (color, marker) in POLICY_STYLES.items():
            mine = sorted((row for row in rows if row["policy"] == policy), key=lambda row: row["rate_rps"])
            if not mine:
                continue
            rate = np.array([row["rate_rps"] for row in mine])
            for ax, name in ((ttft_ax, "ttft"), (tpot_ax, "tpot")):
                ax.plot(rate, [row[f"{name}_p50_ms"] for row in mine], f"{marker}-", color=color,
                        label=text("p50", policy=policy))
                ax.plot(rate, [row[f"{name}_p99_ms"] for row in mine], f"{marker}--", color=color, alpha=0.6,
                        label=text("p99", policy=policy))
            good_ax.plot(rate, [row["throughput_rps"] for row in mine], f"{marker}-", color=color,
                         label=text("throughput", policy=policy))
            good_ax.plot(rate, [row["goodput_rps"] for row in mine], f"{marker}:", color=color,
                         label=text("goodput", policy=policy))
        top = max(row["rate_rps"] for row in rows)
        good_ax.plot([0, top], [0, top], color="grey", lw=0.8, label=text("offered"))
        ttft_ax.axhline(rows[0]["slo_ttft_ms"], color="grey", ls=":", label=text("slo", ms=rows[0]["slo_ttft_ms"]))
        tpot_ax.axhline(rows[0]["slo_tpot_ms"], color="grey", ls=":",
                        label=text("slo_tpot", ms=rows[0]["slo_tpot_ms"]))
        ttft_ax.set_yscale("log")
        for ax, ylabel, title in ((ttft_ax, "ttft_ms", "ttft_title"), (tpot_ax, "tpot_ms", "tpot_title"),
                                  (good_ax, "requests_per_s", "goodput_title")):
            ax.axvline(saturation, color="black", ls="--", lw=0.8, label=text("saturation", rate=saturation))
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
