"""The report's languages, the way Sphinx and Django keep theirs: every message is written once, in
English, where it is used (`_("...")` in Python, `{% trans %}` or `_()` in a template); its Korean
stands in one gettext catalog, kvlab/present/locale/ko/LC_MESSAGES/kvlab.po, read with Babel. Numbers
are formatted for the language by Babel (`decimal`, `percent`, `integer`).

The catalog is the source: it is compiled in memory when first used, so no binary file is kept beside
it. `messages()` lists every message the code and templates mark, which a test holds against the
catalog (a message without its Korean fails it). To add messages after changing the texts:

    pybabel extract -F babel.cfg -k N_ -o /tmp/kvlab.pot . && \\
    pybabel update -i /tmp/kvlab.pot -d kvlab/present/locale -D kvlab --no-fuzzy-matching
"""

from __future__ import annotations

import functools
import gettext
import io
import math
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.numbers import format_decimal, format_percent
from babel.support import Translations

LANGUAGES = ("ko", "en")
# English is the language the messages are written in; Korean, the lab's, is the default.
SOURCE_LANGUAGE = "en"
DOMAIN = "kvlab"
LOCALE_DIR = Path(__file__).parent / "locale"
ROOT = Path(__file__).resolve().parents[2]


def N_(message: str) -> str:
    """Mark `message` for the catalog where it is defined (a table of labels) and translate it where it
    is shown: gettext's no-op marker."""
    return message


def check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"report.language: {language!r} is not one of {', '.join(LANGUAGES)}")


def catalog_path(language: str) -> Path:
    return LOCALE_DIR / language / "LC_MESSAGES" / f"{DOMAIN}.po"


@functools.cache
def translations(language: str) -> gettext.NullTranslations:
    """The messages of `language`: the catalog compiled in memory, or English itself."""
    check_language(language)
    if language == SOURCE_LANGUAGE:
        return gettext.NullTranslations()
    with open(catalog_path(language), "rb") as handle:
        catalog = read_po(handle, locale=language, domain=DOMAIN)
    compiled = io.BytesIO()
    write_mo(compiled, catalog)
    compiled.seek(0)
    return Translations(compiled, domain=DOMAIN)


def gettext_for(language: str):
    """The `_` of `language`: a message in, its translation out."""
    return translations(language).gettext


# `snakemake --report`'s categories and subcategories (kvlab.facts.results), marked for the catalog:
# the HTML report's sidebar speaks the report's language (`category_name`).
REPORT_CATEGORIES = (N_("Lab sheet"), N_("Lab report"), N_("Beyond the lab"), N_("Class"), N_("Cost curves"),
                     N_("Latency split"), N_("Step anatomy"), N_("KV capacity"), N_("Top-p curve"),
                     N_("Temperature curve"), N_("Model comparison"), N_("Batching"), N_("KV reservation"),
                     N_("Continuous batching"), N_("Serving over HTTP"), N_("Fast decoding"),
                     N_("Fidelity to MiniMind"))


def category_name(name: str | None, language: str) -> str | None:
    """A report category (or subcategory) in `language`; None stays None."""
    return None if name is None else gettext_for(language)(name)


def decimal(value: float, digits: int, language: str) -> str:
    """`value` with `digits` decimals and the language's separators: 4.823 -> "4.82"."""
    pattern = "#,##0" + ("." + "0" * digits if digits else "")
    return format_decimal(value, format=pattern, locale=language)


def integer(value: int, language: str) -> str:
    """An integer with the language's thousands separator: 409600 -> "409,600"."""
    return format_decimal(value, format="#,##0", locale=language)


def percent(share: float, digits: int, language: str, down: bool = False) -> str:
    """A share as a percentage with `digits` decimals: 0.1234 -> "12.3%". `down` rounds toward zero, for a
    share that sits under a threshold and must not be shown at it (0.897 -> "89%", not "90%")."""
    if down:
        scale = 100 * 10 ** digits
        share = math.floor(share * scale + 1e-9) / scale  # (the 1e-9: 0.29 * 100 is 28.999...)
    pattern = "#,##0" + ("." + "0" * digits if digits else "") + "%"
    return format_percent(share, format=pattern, locale=language)


def messages() -> set[str]:
    """Every message the sources mark (babel.cfg says where), as Babel extracts them."""
    from babel.messages.extract import extract_from_dir
    from babel.messages.frontend import parse_mapping_cfg

    with open(ROOT / "babel.cfg", encoding="utf-8") as handle:
        method_map, options_map = parse_mapping_cfg(handle)
    keywords = {"_": None, "gettext": None, "ngettext": (1, 2), "N_": None}
    found = set()
    for _file, _line, message, _comments, _context in extract_from_dir(
            ROOT, method_map, options_map, keywords=keywords):
        found.update([message] if isinstance(message, str) else [part for part in message if part])
    return found
