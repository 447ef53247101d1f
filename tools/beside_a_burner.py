"""Issue 38's two checks that need a CPU burner on purpose, for a machine where nothing else runs:

    python tools/beside_a_burner.py build /tmp/busy          # a cold build beside a burner, then `read`
    python tools/beside_a_burner.py test tests/test_anatomy.py::test_fixed_cost_and_computation_add_up_to_each_step --times 10
    python tools/beside_a_burner.py read /tmp/busy/results   # any built results folder's two reports, read

`build` runs the whole workflow (`snakemake --cores 1`, config.yaml's defaults, from this checkout)
in WORKDIR, the build pinned to one core and `while True: pass` pinned to the same core all along
(tools/contention_probe.py's burner), then reads its reports as `read` does. `test` runs a test TIMES
times, pinned beside the burner, and says how many passed. Linux only (sched_setaffinity, taskset).

`read` is a careful reader's checks, each from the result files: every comparison the reports make
on a timing, judged on the clock kvlab.present.verdicts chooses (the CPU clock's when a side was
contended), appears with that clock's numbers, and a contended one's section names the CPU clock;
each disturbed timing shown carries a mark and the list at the end of beyond.md is those marks;
every value shown with an interval lies in it. It prints each check and exits 1 if one fails.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from contention_probe import BURN, pinned  # noqa: E402

from kvlab.facts.disturbed import disturbed_timings  # noqa: E402
from kvlab.facts.results import report_inputs  # noqa: E402
from kvlab.present import clocks  # noqa: E402
from kvlab.present.report import load_results  # noqa: E402
from kvlab.present.verdicts import on_clock, one_clock  # noqa: E402

CPU_WORDS = ("CPU clock", "CPU 시계")


def shown(value: dict, key: str = "ratio") -> list[str]:
    """The number and its interval as the reports write them, two decimals."""
    return [f"{value[key]:,.2f}", f"{value['low']:,.2f}–{value['high']:,.2f}"]


def section(text: str, *headings: str) -> str:
    """The text of the first of `headings` found (to the next ## heading), or ''."""
    for heading in headings:
        if heading in text:
            return text.split(heading, 1)[1].split("\n## ", 1)[0]
    return ""


def read(results: Path) -> list[tuple[bool, str]]:
    """(ok, what) for each check of the two reports in `results` against its result files."""
    paths = {name: results.parent / path for name, path in report_inputs((), "beyond").items()
             if (results.parent / path).exists()}
    data, _ = load_results(paths)
    report = (results / "report.md").read_text(encoding="utf-8")
    beyond = (results / "beyond.md").read_text(encoding="utf-8")
    checks = []

    def expect(ok: bool, what: str):
        checks.append((bool(ok), what))

    # step 3: the sheet's speedup judged on its clock
    judged = on_clock(*clocks.step3_speedup(data["time_runs"]).values())
    kv = section(report, "## KV 캐시")
    expect(all(text in kv for text in shown(judged)), f"step 3 on the {judged['clock']} clock: {shown(judged)}")
    expect((judged["clock"] == "cpu") == any(word in kv for word in CPU_WORDS), "step 3 names the clock it is judged on")
    # the sweep, the compared models: every value on one clock
    for name, rows, pair_of, headings in (
            ("the sweep", data.get("sweep", []), lambda row: clocks.sweep_speedup(row, data.get("sweep_runs")),
             ("## 비용 곡선", "## Cost curves")),
            ("the models", data.get("compare", []), clocks.compare_speedup, ("## 모델 크기에 따른 비교", "## Model sizes compared"))):
        if not rows:
            continue
        pairs = [pair_of(row) for row in rows]
        judged = one_clock([pair["wall"] for pair in pairs], [pair["cpu"] for pair in pairs])
        text = section(beyond, *headings)
        for row, value in zip(rows, judged["values"]):
            expect(all(part in text for part in shown(value)), f"{name}: {shown(value)} on the {judged['clock']} clock")
        expect((judged["clock"] == "cpu") == any(word in text for word in CPU_WORDS), f"{name} names its clock")
    # the batches: each mode's throughputs on one clock
    text = section(beyond, "## 여러 요청을 한꺼번에", "## Many requests at once")
    for mode in ("shared", "distinct"):
        rows = [row for row in data.get("batch", []) if row["mode"] == mode]
        if not rows:
            continue
        pairs = [clocks.batch_throughput(row, data.get("batch_runs")) for row in rows]
        judged = one_clock([pair["wall"] for pair in pairs], [pair["cpu"] for pair in pairs])
        for value in judged["values"]:
            number = f"{value['value']:,.0f} ({value['low']:,.0f}–{value['high']:,.0f})"
            expect(number in text, f"the batch of {mode}: {number} on the {judged['clock']} clock")
    # the caches at the longest context, the per-step timing's speedup
    if "step_anatomy" in data:
        judged = on_clock(*clocks.curve_ratio(data["step_anatomy"]["curve"], "cat", "static").values())
        text = section(beyond, "## 한 스텝의 해부", "## Anatomy of a step")
        expect(all(part in text for part in shown(judged)), f"cat / static on the {judged['clock']} clock")
    if "latency" in data:
        judged = on_clock(*clocks.latency_speedup(data["latency"]).values())
        text = section(beyond, "## 지연 시간 분해", "## Latency split")
        expect(all(part in text for part in shown(judged)), f"the per-step timing on the {judged['clock']} clock")
    # the numbers of disturbed timings carry a mark (kvlab.present.marks) and the list at the end of beyond.md is
    # those marks, none counted across kinds; report.md names step 3's alone
    found = disturbed_timings(data)
    heading = "## 흔들린 측정" if "## 흔들린 측정" in beyond else "## Disturbed timings"
    body, _, listed = beyond.split("\n## ", 1)[-1].partition(heading)
    marked = {number for group in re.findall(r"†(\d+(?:,\d+)*)", body) for number in group.split(",")}
    expect(marked == set(re.findall(r"†(\d+)", listed)) and len(marked) <= len(found),
           f"beyond.md's {len(marked)} marks are the list at its end ({len(found)} timings disturbed)")
    expect(not re.search(r"timings? beyond the sheet (was|were) disturbed|시트 너머의 측정 \d+개", report),
           "report.md counts no timing beyond the sheet")
    # every value shown with an interval lies in it
    for text in (report, beyond):
        for value, low, high in re.findall(r"\*\*([\d,.]+)×\*\* \(([\d,.]+)–([\d,.]+)×\)", text):
            number = [float(x.replace(",", "")) for x in (value, low, high)]
            expect(number[1] <= number[0] <= number[2], f"{value}× within ({low}–{high}×)")
        for value, low, high in re.findall(r"\| (\d+)% \((\d+)%–(\d+)%\) \|", text):
            expect(int(low) <= int(value) <= int(high), f"{value}% within ({low}%–{high}%)")
    return checks


def report_checks(checks) -> int:
    for ok, what in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    failed = sum(not ok for ok, _ in checks)
    print(f"{len(checks) - failed} of {len(checks)} checks hold")
    return 1 if failed else 0


def build(workdir: Path, core: int) -> int:
    workdir.mkdir(parents=True, exist_ok=True)
    burner = pinned(core, BURN)
    started = time.perf_counter()
    try:
        done = subprocess.run(["taskset", "-c", str(core), sys.executable, "-m", "snakemake", "--cores", "1",
                               "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir)])
    finally:
        burner.kill()
        burner.wait()
    print(f"the build beside a burner on core {core}: exit {done.returncode} after {time.perf_counter() - started:.0f} s")
    if not (workdir / "results" / "beyond.md").exists():
        return 1
    return report_checks(read(workdir / "results"))


def test(node: str, times: int, core: int) -> int:
    burner = pinned(core, BURN)
    passed = 0
    try:
        for index in range(times):
            done = subprocess.run(["taskset", "-c", str(core), sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                                   "no:cacheprovider", node], cwd=ROOT, capture_output=True, text=True)
            passed += done.returncode == 0
            print(f"run {index + 1}: {'passed' if done.returncode == 0 else 'FAILED'}")
            if done.returncode:
                print(done.stdout[-3000:])
    finally:
        burner.kill()
        burner.wait()
    print(f"{passed} of {times} runs passed beside a burner on core {core}")
    return 0 if passed == times else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "test"):
        command = commands.add_parser(name)
        command.add_argument("--core", type=int, default=0)
    commands.choices["build"].add_argument("workdir", type=Path)
    commands.choices["test"].add_argument("node")
    commands.choices["test"].add_argument("--times", type=int, default=10)
    commands.add_parser("read").add_argument("results", type=Path)
    args = parser.parse_args()
    if args.command == "build":
        sys.exit(build(args.workdir, args.core))
    if args.command == "test":
        sys.exit(test(args.node, args.times, args.core))
    sys.exit(report_checks(read(args.results)))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
