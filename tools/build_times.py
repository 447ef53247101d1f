"""Where a finished build spent its time: each job's wall and CPU seconds, sorted, the jobs that
waited, and the total.

    python tools/build_times.py [WORKDIR] [--unit SECONDS]      (default: the current folder)

Reads the newest Snakemake log in WORKDIR/.snakemake/log/ (each job's start and finish, to the
second, its log file and benchmark file, and the run's "Elapsed time"); where a rule has a
benchmark file, its wall seconds (to the hundredth) replace the log's; and each job's own log's last
line (kvlab.workflow.clocks_line): its wall seconds since its process started and its CPU seconds,
its own and its children's (a compiler's run). A job whose wall exceeds its CPU by more than WAITS
seconds waited (for a compiler's worker, a sleep, another process): it is named. With `--unit`, the
seconds of tools/calib.py on the same machine, the elapsed time is also said in machine units.
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
FIELD = re.compile(r"^\s+(jobid|wildcards|benchmark|log): (.+)$")
CLOCKS = re.compile(r"the job's clocks: wall ([\d.]+) s, CPU ([\d.]+) s")
WAITS = 3.0  # seconds of wall above CPU that a job is named for
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
            job = {"label": match.group(1), "start": stamp, "benchmark": None, "log": None}
        elif (match := FIELD.match(line)) and job is not None:
            key, value = match.groups()
            if key == "jobid":
                started[value] = job
            elif key == "wildcards":
                job["label"] += f"[{value}]"
            else:
                job[key] = value
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


def job_clocks(path: Path) -> tuple[float, float] | None:
    """The wall and CPU seconds a job's log ends with (kvlab.workflow.clocks_line), or None."""
    if not path.is_file():
        return None
    found = None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if match := CLOCKS.search(line):
            found = float(match.group(1)), float(match.group(2))
    return found


def job_rows(workdir: Path, jobs: list[dict]) -> list[dict]:
    """Per job: its label, wall seconds (the benchmark's, else the log's stamps), and its CPU seconds and
    wall since its process started from its own log (None where it has none)."""
    rows = []
    for job in jobs:
        if job["label"] == "all":
            continue
        bench = job["benchmark"] and benchmark_seconds(workdir / job["benchmark"])
        clocks = job["log"] and job_clocks(workdir / job["log"].split(",")[0].strip())
        rows.append({"label": job["label"], "wall": bench if bench is not None else job["seconds"],
                     "cpu": clocks[1] if clocks else None, "process_wall": clocks[0] if clocks else None})
    rows.sort(key=lambda row: -row["wall"])
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", nargs="?", default=".", type=Path)
    parser.add_argument("--unit", type=float, help="seconds of tools/calib.py on this machine")
    parser.add_argument("--log", type=Path, help="the Snakemake log of the run to read (default: the latest)")
    args = parser.parse_args(argv)
    logs = [args.log] if args.log else sorted((args.workdir / ".snakemake" / "log").glob("*.snakemake.log"))
    if not logs:
        print(f"{args.workdir}: no Snakemake log in .snakemake/log/ (run the build first)", file=sys.stderr)
        return 1
    jobs, elapsed = parse_log(logs[-1])
    rows = job_rows(args.workdir, jobs)
    width = max([len(row["label"]) for row in rows] + [11])
    print(f"{logs[-1].name}: {len(rows)} jobs")
    print(f"{'job':<{width}}  {'wall s':>7}  {'CPU s':>7}  {'waited s':>8}")
    waited = []
    for row in rows:
        cpu = "" if row["cpu"] is None else f"{row['cpu']:.1f}"
        wait = "" if row["cpu"] is None else f"{max(0.0, row['process_wall'] - row['cpu']):.1f}"
        if row["cpu"] is not None and row["process_wall"] - row["cpu"] > WAITS:
            waited.append(f"{row['label']} ({row['process_wall'] - row['cpu']:.0f} s)")
        print(f"{row['label']:<{width}}  {row['wall']:>7.1f}  {cpu:>7}  {wait:>8}")
    print(f"{'sum of jobs':<{width}}  {sum(row['wall'] for row in rows):>7.1f}  "
          f"{sum(row['cpu'] or 0 for row in rows):>7.1f}")
    if elapsed is not None:
        units = f" ({elapsed / args.unit:.1f} machine units of {args.unit:.2f} s)" if args.unit else ""
        print(f"{'elapsed':<{width}}  {elapsed:>7.1f}{units}")
    print(f"waited more than {WAITS:.0f} s beyond their CPU: " + (", ".join(waited) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
