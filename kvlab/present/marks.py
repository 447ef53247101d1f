"""Marks beside the disturbed timings a report shows: the code that shows a timed number asks `mark`
for its timing's mark, and the list at the end of the report is the marks it handed out, so the two
cannot disagree (a timing the reports never show is neither marked nor listed).

A timing is what kvlab.facts.disturbed names one: (what, mode, name, n). `mark(what, mode, name, n)`
returns "" where no disturbed timing matches, else the sign and the number of each one that does
("†2", "†1,3"): a field left None matches every value (a ratio of step 3's two modes asks for "step3"
and is marked by either). Numbers go in the order the report first shows the timings.

Rendering is two passes (`render_twice`): the first hands out the marks, the second knows them before
its first line (`planned`: the opening note says whether anything is marked) and hands out the same
numbers, shown in the same order.

Free of PyTorch.
"""

from __future__ import annotations

from kvlab.facts.disturbed import KEY

SIGN = "†"


class Marks:
    def __init__(self, timings: list[dict], planned: list[dict] | None = None):
        self.timings = [dict(timing) for timing in timings]
        self.used: list[dict] = []  # {"number", "timing"}, in the order first marked
        self.planned = list(planned or [])

    def _number(self, timing: dict) -> int:
        for entry in self.used:
            if entry["timing"] is timing:
                return entry["number"]
        self.used.append({"number": len(self.used) + 1, "timing": timing})
        return len(self.used)

    def __call__(self, what: str, mode=None, name=None, n=None) -> str:
        """The mark of every disturbed timing that matches (None: any value; a list: any of its values), ""
        where none does."""
        asked = dict(zip(KEY, (what, mode, name, n)))
        numbers = [self._number(timing) for timing in self.timings
                   if all(_matches(timing.get(field), value) for field, value in asked.items())]
        return f"{SIGN}{','.join(str(number) for number in sorted(set(numbers)))}" if numbers else ""

    def listed(self) -> list[dict]:
        """The marks handed out, as the list's template (timing_name.md.j2) names them: one group the marks of one part, mode and name, {what, mode, name, points}, in the order
        their first mark came, each point the timing with its mark's `number`."""
        groups: dict = {}
        for entry in self.used:
            timing = entry["timing"]
            key = (timing["what"], timing.get("mode"), timing.get("name"))
            group = groups.setdefault(key, {"what": key[0], "mode": key[1], "name": key[2], "points": []})
            group["points"].append({**timing, "number": entry["number"]})
        return list(groups.values())


def _matches(found, asked) -> bool:
    if asked is None:
        return True
    if isinstance(asked, (list, tuple)):
        return found in asked
    return found == asked


def render_twice(render, timings: list[dict]) -> str:
    """`render(marks)` once to hand out the marks, then again with them planned (see the module)."""
    first = Marks(timings)
    render(first)
    return render(Marks(timings, planned=first.listed()))
