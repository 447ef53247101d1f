"""The pages a person opens: templates rendered in a sandbox, and the report as one HTML page with
its figures embedded (for `snakemake --report`)."""

from __future__ import annotations

import base64
from pathlib import Path

import markdown
from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment
from markupsafe import Markup


def sandboxed_template(template_path, autoescape: bool = False):
    """The template at `template_path`, loaded in a sandbox (a template is untrusted input) that
    refuses undefined names; `autoescape` for HTML. Filter `thousands`: 14880 -> 14,880."""
    template_path = Path(template_path)
    env = SandboxedEnvironment(loader=FileSystemLoader(template_path.parent), undefined=StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                               autoescape=autoescape)
    env.filters["thousands"] = lambda n: f"{n:,}"
    return env.get_template(template_path.name)


def report_page(template_path, report_path, figure_paths, language: str) -> str:
    """results/report.md as one self-contained HTML page, for `snakemake --report` (which shows an
    HTML result in the page, a Markdown file only as a download): the Markdown rendered, and each
    figure it links (figures/NAME.png, one of `figure_paths`) embedded in the page, so that it
    still shows when the page is moved or downloaded. The page's title is the report's heading."""
    text = Path(report_path).read_text(encoding="utf-8")
    for path in map(Path, figure_paths):
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        text = text.replace(f"]({path.parent.name}/{path.name})", f"](data:image/png;base64,{data})")
    title = next((line[2:].strip() for line in text.splitlines() if line.startswith("# ")), "")
    body = Markup(markdown.markdown(text, extensions=["tables"]))
    return sandboxed_template(template_path, autoescape=True).render(body=body, title=title, lang=language)
