"""What every figure is drawn with: matplotlib's Agg backend (no display needed), the fonts of the
report's language, the label lookup, the PNG saved atomically with its text in its metadata, and the
ticks of a log axis. The lab's figures are in kvlab.present.sheet_figures and beyond_figures, the
serving's in serving_figures, the class's in kvlab.grade.class_page; each holds its own labels.

Labels follow the report's language (config `report.language`): English, or Korean
set in NanumGothic, the Hangul font the `koreanize-matplotlib` package ships (read
from its folder, so nothing is downloaded and no system font is needed). Glyphs
NanumGothic lacks (−, µ, ×) fall back to matplotlib's own DejaVu Sans. Each
figure function takes the rows a rule wrote and saves one PNG atomically; the PNG's
Title and Description metadata hold the figure's title and every label drawn.
"""

from __future__ import annotations

from contextlib import contextmanager

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import font_manager  # noqa: E402

from kvlab.facts.disturbed import KEY, disturbed_timings  # noqa: E402
from kvlab.io import atomic_path  # noqa: E402
from kvlab.present.fonts import HANGUL_FONT, hangul_font_path  # noqa: E402  (the figures' face)
from kvlab.present.i18n import N_, check_language, gettext_for  # noqa: E402
from kvlab.present.marks import SIGN  # noqa: E402

# the two modes' colours in every figure that shows them
WITH_CACHE_COLOR = "tab:blue"
WITHOUT_CACHE_COLOR = "tab:red"
# the gid of the reports' mark drawn beside a disturbed timing's point (tests find it by it)
DISTURBED = "disturbed_mark"
DISTURBED_COLOR = "crimson"
# labels every figure may draw, beside its module's own
COMMON_LABELS = {
    "disturbed": N_("the machine disturbed this timing (too wide a spread, or its CPU taken): "
                    "listed at the end of beyond.md"),
}


def font_families(language: str) -> list[str]:
    """The font list for `language`, first choice first (matplotlib falls back glyph by glyph: an
    English figure still sets the Korean text it quotes, such as a top-p prefix, in NanumGothic)."""
    check_language(language)
    path = str(hangul_font_path())
    if path not in {entry.fname for entry in font_manager.fontManager.ttflist}:
        font_manager.fontManager.addfont(path)
    return ["DejaVu Sans", HANGUL_FONT] if language == "en" else [HANGUL_FONT, "DejaVu Sans"]


@contextmanager
def drawing(language: str, labels: dict):
    """Draw in `language`'s fonts; yields the function that looks up a label by its key in `labels`
    (a figure module's own), in `language` (kvlab.present.i18n), with its {names} filled in."""
    translate = gettext_for(language)

    def text(key: str, **values) -> str:
        return translate({**COMMON_LABELS, **labels}[key]).format(**values)

    with plt.rc_context({"font.family": font_families(language), "axes.unicode_minus": True}):
        yield text


def disturbed(results: dict):
    """Whether a timing of `results` (named as kvlab.facts.disturbed reads them) is disturbed: a function
    of (what, mode, name, n), the fields as the reports' marks name a timing."""
    keys = {tuple(timing[field] for field in KEY) for timing in disturbed_timings(results)}
    return lambda what, mode=None, name=None, n=None: (what, mode, name, n) in keys


def mark_disturbed(ax, points, text, explained: bool = False) -> None:
    """The reports' mark (kvlab.present.marks' sign) beside each point (x, y) whose timing the machine
    disturbed, and one legend entry saying what it means (also where a label of the caller's carries
    the sign: `explained`); nothing where neither. Before the axes' legend is made."""
    for x, y in points:
        ax.annotate(SIGN, (x, y), textcoords="offset points", xytext=(5, 3), color=DISTURBED_COLOR, fontsize=12,
                    gid=DISTURBED)
    if points or explained:
        ax.plot([], [], ls="none", marker=f"${SIGN}$", color=DISTURBED_COLOR, label=text("disturbed"))


def drawn_text(fig) -> tuple[str, list[str]]:
    """The figure's title (its suptitle, else its first axes' title) and every title, axis label
    and legend entry drawn on it (the axes' legends, then the figure's), in order."""
    title = fig.get_suptitle()
    labels = []
    for ax in fig.axes:
        labels += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        if legend is not None:
            labels += [entry.get_text() for entry in legend.get_texts()]
    for legend in fig.legends:
        labels += [entry.get_text() for entry in legend.get_texts()]
    labels = [label for label in labels if label]
    return title or (labels[0] if labels else ""), labels


def save(fig, path, rect=None) -> None:
    """Lay out and save `fig` as a PNG whose Title and Description metadata hold its text. `rect`
    (left, bottom, right, top, in figure fractions) keeps the axes inside it, leaving the rest to a
    figure legend."""
    fig.tight_layout(rect=rect)
    title, labels = drawn_text(fig)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata={"Title": title, "Description": "\n".join(labels)})
    plt.close(fig)


def one_two_five(low: float, high: float) -> list[float]:
    """The ticks 1, 2, 5, 10, 20, 50, ... from the last one at or under `low` to the first at or over
    `high`: a log axis labelled at every 1-2-5 step, so points between two powers of ten read off it."""
    ticks = []
    power = 10 ** int(np.floor(np.log10(low)))
    while not ticks or ticks[-1] < high:
        ticks += [power * mantissa for mantissa in (1, 2, 5)]
        power *= 10
    first = max(index for index, tick in enumerate(ticks) if tick <= low)
    last = min(index for index, tick in enumerate(ticks) if tick >= high)
    return ticks[first:last + 1]


def plain_log_ticks(axis, ticks) -> None:
    """Label a log axis at `ticks` with plain numbers (1,000, not 10³) and no minor labels."""
    axis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
