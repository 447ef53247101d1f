"""Work sized to the model: a measurement beyond the lab sheet walks its ladder (N new tokens, batch
sizes B, ...) from the cheapest rung up, predicts each next rung's seconds from the rungs it has
measured, and stops where the prediction no longer fits what is left of its time budget. The lab's
own values are kept wherever they fit; every rung left out is recorded with its predicted seconds
and the budget it would have broken, and the result and the report say so.

Torch-free: the measurements (kvlab.measure) use it, the presentation reads what it recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("kvlab")

# The fewest rungs a ladder keeps whatever the budget: a curve needs two points.
KEPT_RUNGS = 2


@dataclass
class Budget:
    """A measurement's seconds: `seconds` in all (None: no budget, every rung measured), counted from
    when it was made. `cut` holds each rung left out (its name, predicted seconds, what was left)."""

    seconds: float | None
    clock: Callable[[], float] = time.perf_counter
    cut: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.began = self.clock()

    def spent(self) -> float:
        return self.clock() - self.began

    def fits(self, predicted_s: float) -> bool:
        """Whether a rung predicted to take `predicted_s` fits what is left."""
        return self.seconds is None or self.spent() + predicted_s <= self.seconds

    def take(self, rungs: list, measure, predict, name=str, keep: int = KEPT_RUNGS) -> list:
        """Measure `rungs` in order (`measure(rung)` returns its result and its seconds) while each next
        one is predicted to fit (`predict(rung, done)`, from the [(rung, result, seconds)] measured so
        far); the first `keep` are always measured. Once one does not fit, it and every later rung
        (each costlier) are cut. Returns the measured results in order."""
        done = []
        for index, rung in enumerate(rungs):
            if index >= keep and done:
                predicted = predict(rung, done)
                if not self.fits(predicted):
                    left = None if self.seconds is None else max(0.0, self.seconds - self.spent())
                    self.cut.extend({"rung": name(later), "predicted_s": predict(later, done), "left_s": left}
                                    for later in rungs[index:])
                    log.info("not measured, over the budget of %.0f s with %.0f s left: %s", self.seconds, left,
                             ", ".join(f"{cut['rung']} (predicted {cut['predicted_s']:.0f} s)" for cut in self.cut))
                    break
            result, seconds = measure(rung)
            done.append((rung, result, seconds))
        return [result for _, result, _ in done]

    def runs(self, run_s: float, asked: int, least: int, name: str, sharing: int = 1) -> int:
        """How many runs of `run_s` seconds each (a first one measured) fit what is left of the budget,
        shared evenly with `sharing - 1` measurements still to come: `asked` at most, `least` at least.
        The runs left out are recorded as cut, each predicted to take `run_s`."""
        if self.seconds is None:
            return asked
        left = max(0.0, self.seconds - self.spent())
        planned = max(least, min(asked, int(left / sharing // max(run_s, 1e-9))))
        if planned < asked:
            self.cut.append({"rung": f"{name} {planned + 1}-{asked}", "predicted_s": run_s, "left_s": left})
            log.info("%s: %d of %d runs, each some %.1f s, within the budget's %.0f s left", name, planned, asked,
                     run_s, left)
        return planned

    def runs_after_first(self, first_s: float, asked: int, least: int, name: str) -> int:
        """How many runs in all (`asked` at most, `least` at least), a first one already timed in
        `first_s` seconds and each later one predicted to take as long, fit what is left of the budget.
        The runs left out are recorded as cut."""
        if self.seconds is None:
            return asked
        left = max(0.0, self.seconds - self.spent())
        planned = max(least, min(asked, 1 + int(left // max(first_s, 1e-9))))
        if planned < asked:
            self.cut.append({"rung": f"{name} {planned + 1}-{asked}", "predicted_s": first_s, "left_s": left})
            log.info("%s: %d of %d, each some %.1f s, within the budget's %.0f s left", name, planned, asked,
                     first_s, left)
        return planned

    def record(self) -> dict:
        """What the result keeps: the budget and every rung cut (the seconds spent are the job's log's)."""
        return {"budget_s": self.seconds, "cut": list(self.cut)}


def scaled(cost: float, measured_work: float, next_work: float) -> float:
    """A rung's predicted seconds: a measured rung's `cost` scaled by the work each does (tokens fed,
    rows decoded): a prediction that errs high where the fixed cost per step is large."""
    return cost * next_work / measured_work if measured_work > 0 else cost
