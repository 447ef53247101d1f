"""Marks beside disturbed timings (kvlab.present.marks): whatever timings a build disturbed and whatever
numbers a report shows, the list at the end is exactly the marks the numbers carry."""
import re

from hypothesis import given
from hypothesis import strategies as st

from kvlab.present.marks import SIGN, Marks, render_twice

PARTS = ("step3", "sweep", "batch", "serving")
MODES = (None, "with_cache", "without_cache", "shared", "distinct")
NAMES = (None, "static", "continuous")
SIZES = (None, 1, 8, 64)

keys = st.tuples(st.sampled_from(PARTS), st.sampled_from(MODES), st.sampled_from(NAMES), st.sampled_from(SIZES))


def timing_of(key) -> dict:
    what, mode, name, n = key
    return {"what": what, "mode": mode, "name": name, "n": n, "unstable": True, "share": 0.2, "contended": False,
            "runs": None, "waited": None, "cpu_share": None}


@given(disturbed=st.lists(keys, unique=True, max_size=8), shown=st.lists(keys, max_size=12),
       wildcard=st.lists(st.booleans(), min_size=12, max_size=12))
def test_the_list_is_the_marks_the_numbers_carry(disturbed, shown, wildcard):
    """A report shows some numbers (each asks for its timing's mark, some for a whole part's): every mark
    it gets names disturbed timings that match what it asked, the list holds each marked timing once under
    the number its mark gave, numbered 1, 2, ... in the order first shown, and a number whose timing was not
    disturbed gets no mark."""
    timings = [timing_of(key) for key in disturbed]
    marks = Marks(timings)
    given_marks = []
    for key, any_mode in zip(shown, wildcard):
        what, mode, name, n = key
        asked = (what, None if any_mode else mode, name, n)
        text = marks(*asked)
        matching = [t for t in timings if all(v is None or t[f] == v for f, v in zip(("what", "mode", "name", "n"), asked))]
        assert bool(text) == bool(matching)
        given_marks.append(text)
    carried = {int(number) for text in given_marks for number in re.findall(r"\d+", text)}
    listed = [point for group in marks.listed() for point in group["points"]]
    assert sorted(point["number"] for point in listed) == sorted(carried) == list(range(1, len(carried) + 1))
    assert len({(p["what"], p["mode"], p["name"], p["n"]) for p in listed}) == len(listed)  # each timing once
    assert all(text.startswith(SIGN) or text == "" for text in given_marks)


def test_two_passes_know_the_marks_before_the_first_line():
    """render_twice: the second pass knows every mark the first handed out (the report's opening note), and
    gives the same numbers in the same order."""
    timings = [timing_of(("step3", "with_cache", None, None)), timing_of(("batch", "shared", None, 8))]
    seen = []

    def render(marks):
        opening = "marked" if marks.planned else "clean"
        text = f"{opening}: {marks('batch', n=8)} {marks('step3')} {marks('sweep')}"
        seen.append(text)
        return text

    assert render_twice(render, timings) == f"marked: {SIGN}1 {SIGN}2 "
    assert seen[0] == f"clean: {SIGN}1 {SIGN}2 "
    assert render_twice(render, []) == "clean:   "
