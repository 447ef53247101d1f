"""The Hangul font every page a person opens carries: NanumGothic, the face the `koreanize-matplotlib`
package ships (found in its folder, not imported, so nothing is downloaded and no system font is
needed), under a family name of its own, EMBEDDED_FAMILY, that no installed font has: a page names it
first, so its Hangul is drawn in the face it carries whatever the machine has, and a test can tell that
face from a system NanumGothic.

A page written once (the reports' page, the lab tables, the class page, the HTML report's front page)
embeds the face cut to its own characters (`font_face`: fontTools' subsetter, a few tens of KB against
the whole face's 4.7 MB); `kvlab serve`'s page, whose answers are not known in advance, loads the
whole face from the server (FONT_ROUTE, `web_font`).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import io
import logging
from pathlib import Path

HANGUL_FONT = "NanumGothic"
FONT_PACKAGE = "koreanize-matplotlib"
# The family name the pages give the face they carry (a system NanumGothic is "NanumGothic").
EMBEDDED_FAMILY = "kvlab NanumGothic"
# Where `kvlab serve` serves the whole face.
FONT_ROUTE = f"/fonts/{HANGUL_FONT}.ttf"
# What follows the embedded face in a page's font list: the Korean faces a machine may have, then any.
FALLBACK = '"Noto Sans CJK KR", "NanumGothic", "Malgun Gothic", "Apple SD Gothic Neo", sans-serif'


def hangul_font_path() -> Path:
    """NanumGothic.ttf from the koreanize-matplotlib package's folder. The package is found, not
    imported: importing it would change matplotlib's global settings."""
    spec = importlib.util.find_spec("koreanize_matplotlib")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"the figures and pages draw Hangul (report.language 'ko', and the lab's Korean prefixes) "
                         f"with the {FONT_PACKAGE} package: pip install {FONT_PACKAGE}")
    path = Path(spec.submodule_search_locations[0]) / "fonts" / f"{HANGUL_FONT}.ttf"
    if not path.is_file():
        raise ValueError(f"{path}: the {FONT_PACKAGE} package holds no {HANGUL_FONT}.ttf")
    return path


def embedded_font(font_path, text: str) -> str:
    """The font at `font_path` cut down to the characters of `text` (fontTools' subsetter), as base64 for
    a CSS @font-face: the page then shows its Hangul on a machine without a Korean font, in a few tens of
    KB instead of the whole 4.7 MB face."""
    from fontTools import subset

    logging.getLogger("fontTools").setLevel(logging.ERROR)  # it names every table it drops
    options = subset.Options()
    options.layout_features = ["*"]
    font = subset.load_font(str(font_path), options)
    subsetter = subset.Subsetter(options)
    subsetter.populate(text=text)
    subsetter.subset(font)
    buffer = io.BytesIO()
    subset.save_font(font, buffer, options)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def uncovered(font_path, texts) -> list[str]:
    """The characters of `texts` (strings) the font at `font_path` has no glyph for, whitespace and
    controls aside, each once in order of first appearance: what a page embedding only that font
    cannot draw itself (a Chinese tokenizer's simplified characters, for NanumGothic)."""
    from fontTools.ttLib import TTFont

    cmap = TTFont(str(font_path), lazy=True).getBestCmap()
    return list(dict.fromkeys(char for text in texts for char in text
                              if char.isprintable() and not char.isspace() and ord(char) not in cmap))


def font_face(text: str, font_path=None) -> str:
    """A CSS @font-face of EMBEDDED_FAMILY holding the glyphs of `text` (the face at `font_path`, or the
    package's NanumGothic), as a data: URL."""
    data = embedded_font(font_path or hangul_font_path(), text)
    return f'@font-face {{ font-family: "{EMBEDDED_FAMILY}"; src: url(data:font/ttf;base64,{data}) format("truetype"); }}'


@functools.cache
def web_font() -> bytes:
    """The whole NanumGothic face as a browser takes it from a server: the package's file less its
    TSI* tables (VTT's hinting sources, which a browser's font checker, OTS, refuses as zero-length,
    and then the face with them)."""
    from fontTools.ttLib import TTFont

    font = TTFont(str(hangul_font_path()))
    for tag in [tag for tag in font.keys() if tag.startswith("TSI")]:
        del font[tag]
    buffer = io.BytesIO()
    font.save(buffer)
    return buffer.getvalue()


def served_font_face() -> str:
    """The @font-face of EMBEDDED_FAMILY for `kvlab serve`'s page: the whole face, from FONT_ROUTE."""
    return f'@font-face {{ font-family: "{EMBEDDED_FAMILY}"; src: url("{FONT_ROUTE}") format("truetype"); }}'


def font_family() -> str:
    """A page's font list: the face it carries first."""
    return f'"{EMBEDDED_FAMILY}", {FALLBACK}'


def with_font(render, font_path=None) -> str:
    """A page whose font must hold its own characters: `render(font_face=...)` once without a face, to
    learn its text, then again with the face cut to that text."""
    return render(font_face=font_face(render(font_face=""), font_path))
