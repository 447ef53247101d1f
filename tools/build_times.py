"""Where a finished build spent its time: each job's seconds, sorted, and the total.

    python tools/build_times.py [WORKDIR]        (default: the current folder)

Reads the newest Snakemake log in WORKDIR/.snakemake/log/ (each job's start and finish, to the
second, and the run's "Elapsed time") and, where a rule has one, its benchmark file in
WORKDIR/results/benchmarks/ (the job's own run time, to the hundredth). The README's "Measured
here" table is this script's output for a cold `snakemake --cores 1`.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
START = re.compile(r"^(?:local)?rule (\w+):$")
FIELD = re.compile(r"^\s+(jobid|wildcards|benchmark): (.+)$")
FINISHED = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")
ELAPSED = re.compile(r"^Elapsed time: (\d+):(\d\d):(\d\d(?:\.\d+)?)$")


def parse_log(path: Path) -> tuple[list[dict], float | None]:
    """One dict per finished job (label: rule[wildcards], seconds from its start to its finish, its
    benchmark file or None), and the run's elapsed seconds."""
    stamp, job = None, None
    started: dict[str, dict] = {}
    jobs = []
    elapsed = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if match := STAMP.match(line):
            stamp = datetime.strptime(match.group(1), "%a %b %d %H:%M:%S %Y")
        elif match := START.match(line):
            job = {"label": match.group(1), "start": stamp, "benchmark": None}
        elif (match := FIELD.match(line)) and job is not None:
            key, value = match.groups()
            if key == "jobid":
                started[value] = job
            elif key == "wildcards":
                job["label"] += f"[{value}]"
            else:
                job["benchmark"] = value
        elif match := FINISHED.match(line):
            finished = started.pop(match.group(1), None)
            if finished is not None and finished["start"] is not None:
                finished["seconds"] = (stamp - finished["start"]).total_seconds()
                jobs.append(finished)
            job = None
        elif match := ELAPSED.match(line):
            hours, minutes, secs = match.groups()
            elapsed = int(hours) * 3600 + int(minutes) * 60 + float(secs)
    return jobs, elapsed


def benchmark_seconds(path: Path) -> float | None:
    """The first row's seconds of a Snakemake benchmark file, or None when it is missing or empty."""
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    return float(rows[0]["s"]) if rows else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", nargs="?", default=".", type=Path)
    args = parser.parse_args(argv)
    logs = sorted((args.workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        print(f"{args.workdir}: no Snakemake log in .snakemake/log/ (run the build first)", file=sys.stderr)
        return 1
    jobs, elapsed = parse_log(logs[-1])
    rows = [(job["label"], job["seconds"], job["benchmark"] and benchmark_seconds(args.workdir / job["benchmark"]))
            for job in jobs if job["label"] != "all"]
    rows.sort(key=lambda row: -(row[2] if row[2] is not None else row[1]))
    width = max([len(label) for label, _, _ in rows] + [4])
    print(f"{logs[-1].name}: {len(rows)} jobs")
    print(f"{'job':<{width}}  {'log s':>6}  {'benchmark s':>11}")
    for label, secs, bench in rows:
        print(f"{label:<{width}}  {secs:>6.0f}  {'' if bench is None else f'{bench:.1f}':>11}")
    total = sum(secs for _, secs, _ in rows)
    print(f"{'sum of jobs':<{width}}  {total:>6.0f}")
    if elapsed is not None:
        print(f"{'elapsed':<{width}}  {elapsed:>6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
