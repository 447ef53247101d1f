"""The pages a person opens: templates rendered in a sandbox, and the report as one HTML page with
its figures embedded (for `snakemake --report`)."""

from __future__ import annotations

import base64
from pathlib import Path

import markdown
from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment
from markupsafe import Markup

from kvlab.present import i18n
from kvlab.present.fonts import EMBEDDED_FAMILY, embedded_font, font_face, font_family


def sandboxed_template(template_path, autoescape: bool = False, language: str = i18n.SOURCE_LANGUAGE):
    """The template at `template_path`, loaded in a sandbox (a template is untrusted input) that
    refuses undefined names; `autoescape` for HTML. Its messages (`_()`, `{% trans %}`) in `language`
    (kvlab.present.i18n), and Babel's numbers for it: filters `integer` (14880 -> 14,880, also as
    `thousands`), `decimal(digits)` and `percent(digits)`."""
    template_path = Path(template_path)
    env = SandboxedEnvironment(loader=FileSystemLoader(template_path.parent), undefined=StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                               autoescape=autoescape, extensions=["jinja2.ext.i18n"])
    env.install_gettext_translations(i18n.translations(language), newstyle=True)
    env.policies["ext.i18n.trimmed"] = True  # a {% trans %} block's lines join into one message
    env.filters["integer"] = env.filters["thousands"] = lambda n: i18n.integer(n, language)
    env.filters["decimal"] = lambda x, digits=2: i18n.decimal(x, digits, language)
    env.filters["percent"] = lambda x, digits=0, down=False: i18n.percent(x, digits, language, down)
    return env.get_template(template_path.name)


def report_page(template_path, report_paths, figure_paths, font_path, language: str) -> str:
    """The reports (results/report.md, then results/beyond.md) as one self-contained HTML page, for
    `snakemake --report` (which shows an HTML result in the page, a Markdown file only as a download):
    the Markdown rendered; each figure it links (figures/NAME.png, one of `figure_paths`) embedded, so
    that it still shows when the page is moved or downloaded; and the Hangul font the figures use
    (`font_path`), embedded with the glyphs the page needs. The page's title is the first report's
    heading."""
    texts = [Path(path).read_text(encoding="utf-8") for path in report_paths]
    title = next((line[2:].strip() for line in texts[0].splitlines() if line.startswith("# ")), "")
    font = embedded_font(font_path, "".join(texts))
    text = "\n\n---\n\n".join(texts)
    for path in map(Path, figure_paths):
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        text = text.replace(f"]({path.parent.name}/{path.name})", f"](data:image/png;base64,{data})")
    body = Markup(markdown.markdown(text, extensions=["tables"]))
    return sandboxed_template(template_path, autoescape=True, language=language).render(
        body=body, title=title, lang=language, font=font)


# The element of `snakemake --report`'s front page that holds workflow.rst, rendered by docutils.
FRONT_PAGE = ".document"


def front_page_font(front_page, values=(), font_path=None) -> str:
    """The HTML that gives `snakemake --report`'s front page (report/workflow.rst, which includes it with
    reStructuredText's `raw` directive) its Hangul font: a <style> with the face cut to the front page's
    characters (its text in both languages, and `values`, the config's strings it shows), set on the
    element docutils renders it into. Snakemake's page is its own: this is the one way into it."""
    text = Path(front_page).read_text(encoding="utf-8") + "".join(str(value) for value in values if value)
    return (f"<style>\n/* {EMBEDDED_FAMILY}: NanumGothic cut to the front page's characters, so that its Hangul "
            f"shows on a machine without a Korean font */\n{font_face(text, font_path)}\n"
            f"{FRONT_PAGE} {{ font-family: {font_family()}; }}\n</style>\n")
