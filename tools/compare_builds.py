"""Compare two builds' results folders file by file, as a refactoring must leave them.

    python tools/compare_builds.py BEFORE/results AFTER/results

Every JSON, JSONL, CSV, TSV, Markdown, checkpoint and tokenizer file of BEFORE (logs, benchmarks
and figures aside) is held against the same file of AFTER, byte for byte. A file that differs is
opened: for JSON, CSV and TSV the paths of the values that differ are listed, so a reader can see
whether only timings moved (a result of kvlab.facts.results marked `timed`, a training's seconds).
Exits 1 when a file is missing, or an untimed file differs anywhere but in such keys.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from kvlab.facts.results import RESULTS

TIMED_RESULTS = {result.path for result in RESULTS.values() if result.timed}

SKIPPED = ("logs", "benchmarks", "figures")
COMPARED = (".json", ".jsonl", ".csv", ".tsv", ".md", ".pth")
# Value paths that hold a wall-clock time, or what follows from one: a key of these names, suffixes or
# prefixes, or anything under a key that holds timing samples and their statistics.
TIME_KEYS = {"n", "seconds", "tokens_per_s", "unstable", "runs", "speedup", "ratio", "low", "high", "warnings",
             "ms_per_step", "iqr_share", "r2", "S t/s", "T s", "contended", "contended_runs", "load_1m"}
TIME_SUFFIXES = ("_s", "_ms", "_share", "_low", "_high", "_n", "_gain", "t/s", "_unstable")
TIME_PREFIXES = ("S_", "T_", "speedup", "fit", "fixed_share", "predicted", "measured")
TIMING_PARTS = {"runs_s", "summary", "by_mode_and_size", "fit_runs", "generate_samples_s", "anatomy", "curve",
                "predicted", "measured", "fit", "timings", "step", "per_token", "usage", "generate_usage", "step_usage",
                "fixed_usage"}


def flatten(value, path=()):
    """{path: leaf} of a JSON value, each path the tuple of keys and indices that leads to the leaf."""
    if isinstance(value, dict):
        return {key: leaf for name, item in value.items() for key, leaf in flatten(item, (*path, name)).items()}
    if isinstance(value, list):
        return {key: leaf for index, item in enumerate(value) for key, leaf in flatten(item, (*path, index)).items()}
    return {path: value}


def table(path: Path) -> list[dict]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))


def differing_paths(before: Path, after: Path) -> list[tuple] | None:
    """The value paths that differ between two JSON or table files; None for other kinds."""
    if before.suffix == ".json":
        old, new = flatten(json.loads(before.read_text("utf-8"))), flatten(json.loads(after.read_text("utf-8")))
    elif before.suffix in (".csv", ".tsv"):
        old, new = flatten(table(before)), flatten(table(after))
    else:
        return None
    return sorted(key for key in old.keys() | new.keys() if old.get(key) != new.get(key))


def timed_key(path: tuple) -> bool:
    """Whether a value path holds a time (TIME_KEYS and the rest above)."""
    parts = [part for part in path if isinstance(part, str)]
    last = parts[-1] if parts else ""
    return (last in TIME_KEYS or last.endswith(TIME_SUFFIXES) or last.startswith(TIME_PREFIXES)
            or bool(TIMING_PARTS & set(parts[:-1])))


def compared_files(folder: Path) -> list[Path]:
    return sorted(path.relative_to(folder) for path in folder.rglob("*")
                  if path.is_file() and path.suffix in COMPARED and path.relative_to(folder).parts[0] not in SKIPPED)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    failed = False
    for name in compared_files(args.before):
        before, after = args.before / name, args.after / name
        if not after.is_file():
            print(f"MISSING   {name}")
            failed = True
            continue
        if before.read_bytes() == after.read_bytes():
            print(f"same      {name}")
            continue
        paths = differing_paths(before, after)
        if paths is None:
            print(f"DIFFERS   {name} (not a table or JSON: compare by hand)")
            failed = failed or name.suffix != ".md"
            continue
        # a result the registry marks timed holds times (or what they decide) throughout
        untimed = [] if str(Path("results", name)) in TIMED_RESULTS else [path for path in paths if not timed_key(path)]
        verdict = "DIFFERS  " if untimed else "timings  "
        shown = untimed or paths
        print(f"{verdict} {name}: {len(paths)} values, e.g. {', '.join('/'.join(map(str, p)) for p in shown[:4])}")
        failed = failed or bool(untimed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
