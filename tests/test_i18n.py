"""The report's languages (kvlab.present.i18n): every message the code and templates mark has its
Korean in the catalog, the catalog holds nothing stale, numbers follow the language, and the
templates stay readable."""
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

from kvlab.present import i18n

from helpers import ROOT


@pytest.fixture(scope="module")
def catalog():
    with open(i18n.catalog_path("ko"), "rb") as handle:
        return read_po(handle, locale="ko")


def test_every_marked_message_has_its_korean(catalog):
    marked = i18n.messages()
    assert len(marked) > 100  # the figures', tables', class page's and report's messages
    translated = {}
    for message in catalog:  # a plural message's ids (singular, plural) share its Korean (one form)
        ids = message.id if isinstance(message.id, tuple) else (message.id,)
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        translated.update({id_: strings[0] for id_ in ids if id_})
    missing = sorted(message for message in marked if not translated.get(message))
    assert not missing, f"{len(missing)} messages have no Korean in {i18n.catalog_path('ko')}: {missing[:5]}"
    stale = sorted(set(translated) - marked)
    assert not stale, f"the catalog holds messages no source marks any more: {stale[:5]}"
    assert not [message.id for message in catalog if message.id and message.fuzzy], "fuzzy entries are not used"


def test_a_message_reads_in_each_language():
    assert i18n.gettext_for("ko")("with cache") == "캐시 사용"
    assert i18n.gettext_for("en")("with cache") == "with cache"
    with pytest.raises(ValueError, match="report.language: 'fr'"):
        i18n.translations("fr")


@pytest.mark.parametrize("language", i18n.LANGUAGES)
def test_numbers_follow_the_language(language):
    assert i18n.integer(409600, language) == "409,600"
    assert i18n.decimal(4.8249, 2, language) == "4.82"
    assert i18n.decimal(1234.5, 1, language) == "1,234.5"
    assert i18n.percent(0.1234, 1, language) == "12.3%"


def test_a_share_under_a_threshold_is_never_shown_at_it():
    """A contended run's CPU share (under 90% by the rule) rounds down: 89.7% reads "89%", not "90%"."""
    assert i18n.percent(0.897, 0, "en") == "90%" and i18n.percent(0.897, 0, "en", down=True) == "89%"
    assert [i18n.percent(share, 0, "en", down=True) for share in (0.29, 0.4, 0.0)] == ["29%", "40%", "0%"]
    assert i18n.percent(0.12349, 1, "ko", down=True) == "12.3%"


def test_templates_keep_their_lines_short():
    long = [(path.relative_to(ROOT), number) for path in Path(ROOT, "templates").rglob("*.j2")
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if len(line) > 200]
    assert not long, long
