"""Issue 38: the CPU clock as the work's cost. Each run's timing-thread CPU seconds, kept in the results,
give every timed comparison a second clock (kvlab.facts.timing, kvlab.present.clocks); a count of
disturbed timings counts timings (kvlab.facts.disturbed); an interval holds its value. Held on drawn
runs (hypothesis), then on the tests' build slowed as a neighbour on its core slows a build (tests/slowed.py):
every comparison the reports make on the CPU clock comes out as the quiet build's."""
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvlab.facts import timing
from kvlab.facts.compare import share_with_spread
from kvlab.facts.disturbed import disturbed_timings
from kvlab.facts.results import report_inputs
from kvlab.present import clocks
from kvlab.present.report import disturbed, load_results, render_report

from helpers import ROOT
from slowed import slowed

seconds = st.floats(min_value=1e-4, max_value=10.0, allow_nan=False, allow_infinity=False)
share = st.floats(min_value=0.05, max_value=1.2, allow_nan=False)  # a thread's CPU over wall (a clock's grain above 1)
runs = st.lists(st.tuples(seconds, share), min_size=1, max_size=12)


def usage_of(pairs) -> dict:
    """A timing's usage: each run's wall seconds and its thread's CPU seconds at the given share."""
    return {"wall_s": [wall for wall, _ in pairs], "thread_cpu_s": [wall * part for wall, part in pairs],
            "cpu_s": [wall * part for wall, part in pairs], "switches": [0] * len(pairs), "load_1m": [0.5] * len(pairs)}


@given(runs, st.floats(min_value=0.1, max_value=1.0))
def test_a_runs_cpu_seconds_are_its_threads_or_its_part_at_the_runs_share(pairs, part):
    usage = usage_of(pairs)
    assert timing.cpu_seconds(usage) == usage["thread_cpu_s"]
    # a part of each run (a decode within a generation) at its run's share, never more than its wall time
    parts = [wall * part for wall, _ in pairs]
    scaled = timing.cpu_seconds(usage, parts)
    for piece, cpu, (wall, fraction) in zip(parts, scaled, pairs):
        assert cpu == pytest.approx(piece * min(fraction, 1.0)) and cpu <= piece * (1 + 1e-12)
    assert timing.cpu_seconds(usage, parts + [1.0]) is None  # one sample a run, or none
    assert timing.cpu_seconds(None) is None and timing.cpu_summary({"wall_s": []}) is None


@given(runs, runs)
def test_a_ratio_holds_its_value_in_its_interval_on_both_clocks(slow, fast):
    slow_summary = timing.summary([wall for wall, _ in slow], usage_of(slow))
    fast_summary = timing.summary([wall for wall, _ in fast], usage_of(fast))
    pair = timing.clocked_ratio(slow_summary, fast_summary, usage_of(slow), usage_of(fast))
    for clock in ("wall", "cpu"):
        value = pair[clock]
        assert value["low"] <= value["ratio"] * (1 + 1e-12) and value["ratio"] <= value["high"] * (1 + 1e-12), value
    assert pair["cpu"]["contended"] == pair["wall"]["contended"] == (slow_summary["contended"] or fast_summary["contended"])
    # the CPU clock's ratio is the ratio of the threads' CPU medians
    cpu = [timing.summary(timing.cpu_seconds(usage_of(side)))["median_s"] for side in (slow, fast)]
    assert pair["cpu"]["ratio"] == pytest.approx(cpu[0] / cpu[1])


@given(runs, st.floats(min_value=1.5, max_value=5.0))
def test_a_neighbour_that_only_takes_wall_time_leaves_the_cpu_clock_as_it_was(pairs, factor):
    quiet = usage_of([(wall, 1.0) for wall, _ in pairs])
    busy = {**quiet, "wall_s": [wall * factor for wall in quiet["wall_s"]]}
    assert timing.cpu_seconds(busy) == timing.cpu_seconds(quiet)
    assert timing.contention(busy)["contended"] and not timing.contention(quiet)["contended"]
    # the waiting runs' CPU share, the one the reports print, is under the rule by definition
    assert timing.contention(busy)["contended_cpu_share"] == pytest.approx(1 / factor)
    assert timing.contention(quiet)["contended_cpu_share"] is None


@given(st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=12))
def test_a_fixed_share_sits_inside_its_interval(shares):
    value, low, high = share_with_spread(shares)
    assert low <= value <= high


flags = st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=10)


@given(flags)
def test_disturbed_timings_count_timings_not_flags(rows):
    """Issue 38's report counted a batch size flagged both ways twice."""
    calm = timing.summary([1.0] * 3, usage_of([(1.0, 1.0)] * 3))
    batch, batch_runs = [], {}
    for index, (unstable, contended) in enumerate(rows):
        size = 2 ** index
        batch.append({"mode": "distinct", "B": size, "unstable": unstable, "contended": contended, "iqr_share": 0.2,
                      "cpu_share": 0.4 if contended else 1.0, "runs": 3})
        usage = usage_of([(1.0, 0.4 if contended else 1.0)] * 3)
        batch_runs[f"distinct {size}"] = {"decode": timing.summary([1.0] * 3, usage), "usage": usage}
    results = {"time_runs": {"summary": {"with_cache": calm, "without_cache": calm}}, "batch": batch,
               "batch_runs": {"by_mode_and_size": batch_runs}}
    found = disturbed_timings(results)
    assert len(found) == sum(unstable or contended for unstable, contended in rows)
    assert len({(item["what"], item["mode"], item["n"]) for item in found}) == len(found)
    assert [item["contended"] for item in found] == [contended for unstable, contended in rows if unstable or contended]
    assert all(item["cpu_share"] == pytest.approx(0.4) and item["waited"] == 3 for item in found if item["contended"])
    summary = disturbed(results)
    assert summary["count"] == len(found) and summary["sheet"] == []  # step 3 was calm
    assert summary["unstable"] == sum(u for u, _ in rows) and summary["contended"] == sum(c for _, c in rows)


# --- the tests' build, slowed as a neighbour slows it ------------------------------------------------


@pytest.fixture(scope="module")
def quiet_and_slowed(course_build, tmp_path_factory):
    """The shared build's results, and a copy whose chosen runs took 2.5 times their wall time, their CPU
    time unchanged (tests/slowed.py), each as the reports load them."""
    results = course_build / "results"
    slow = slowed(results, tmp_path_factory.mktemp("slowed") / "results")
    paths = report_inputs((), "beyond")
    loaded = {which: load_results({name: folder.parent / path for name, path in paths.items()})[0]
              for which, folder in (("quiet", results), ("slowed", slow))}
    return results, slow, loaded


def render(folder, which, language="en"):
    paths = {name: folder.parent / path for name, path in report_inputs((), which).items()}
    template = "beyond.md.j2" if which == "beyond" else "report.md.j2"
    return render_report(ROOT / "templates" / "report" / template, paths, language)


def test_the_slowed_runs_are_flagged_and_their_cpu_clock_is_the_quiet_builds(quiet_and_slowed):
    _, _, loaded = quiet_and_slowed
    quiet, slow = loaded["quiet"], loaded["slowed"]
    assert slow["time_runs"]["summary"]["with_cache"]["contended"]
    step3 = [clocks.step3_speedup(data["time_runs"])["cpu"] for data in (quiet, slow)]
    assert step3[0]["ratio"] == pytest.approx(step3[1]["ratio"]) and step3[0]["low"] == pytest.approx(step3[1]["low"])
    for quiet_row, slow_row in zip(quiet["sweep"], slow["sweep"]):
        assert slow_row["contended"]
        a, b = (clocks.sweep_speedup(row, data["sweep_runs"])["cpu"] for row, data in ((quiet_row, quiet), (slow_row, slow)))
        assert a["ratio"] == pytest.approx(b["ratio"])
    first = [next(row for row in data["batch"] if row["mode"] == "distinct") for data in (quiet, slow)]
    assert first[1]["contended"]
    a, b = (clocks.batch_throughput(row, data["batch_runs"])["cpu"] for row, data in zip(first, (quiet, slow)))
    # (a run's CPU share, capped at 1 against a clock's grain, may lose that grain once slowed: rel 1e-3)
    assert a["value"] == pytest.approx(b["value"], rel=1e-3)


def test_every_comparison_of_the_slowed_build_is_judged_on_its_cpu_clock(quiet_and_slowed):
    """The issue's sentences, on a build a neighbour slowed: step 3's speedup, the sweep, the batches'
    steps and gain, the model's speedup, each read on the CPU clock and saying so; the counts of
    disturbed timings agree between the two reports."""
    _, slow, loaded = quiet_and_slowed
    data = loaded["slowed"]
    report, beyond = render(slow, "report"), render(slow, "beyond")
    kv = report.split("## KV 캐시")[1].split("## 온도")[0]
    cpu = clocks.step3_speedup(data["time_runs"])["cpu"]
    assert "so the comparison is judged on the timing thread's CPU clock" in kv or "on the timing thread's CPU clock" in kv
    assert f"{cpu['ratio']:.2f}× ({cpu['low']:.2f}–{cpu['high']:.2f}×)" in kv
    wall = data["time_runs"]["speedup"]
    assert f"**{wall['ratio']:.2f}×** ({wall['low']:.2f}–{wall['high']:.2f}×)" in kv  # time.json's, in the table
    # the sweep: its table on the CPU clock, each N's value the CPU clock's
    sweep = beyond.split("## Cost curves")[1].split("\n## ")[0]
    assert "speedup, CPU clock" in sweep
    for row in data["sweep"]:
        value = clocks.sweep_speedup(row, data["sweep_runs"])["cpu"]
        assert f"**{value['ratio']:.2f}×** ({value['low']:.2f}–{value['high']:.2f}×)" in sweep
    # the batches: both modes read on the CPU clock (their smallest batch was slowed)
    batch = beyond.split("## Many requests at once")[1].split("\n## ")[0]
    assert batch.count("(on the CPU clock: a batch was contended)") == 2 and "CPU clock |" in batch
    # no count: the numbers of disturbed timings carry a mark, and the list at the end is those marks
    found = disturbed_timings(data)
    head, body = beyond.split("\n## ", 1)
    assert "**Disturbed timings:** a number marked †" in head and f"{len(found)} of this build's timings" not in head
    assert "## Disturbed timings" in beyond
    shown, listed = body.split("## Disturbed timings")
    marked = {int(number) for group in re.findall(r"†(\d+(?:,\d+)*)", shown) for number in group.split(",")}
    assert marked and marked == {int(number) for number in re.findall(r"†(\d+)", listed)}
    assert marked == set(range(1, len(marked) + 1))
    assert "beyond the sheet was disturbed" not in report and "beyond the sheet were disturbed" not in report
    # the list at the end gives each contended timing's waiting runs under the rule, never a median above it
    shares = [float(share) for share in re.findall(r"runs at (\d+)% CPU", beyond.split("## Disturbed timings")[1])]
    assert shares and all(share < 100 * timing.CONTENDED_CPU_SHARE for share in shares), shares


def test_a_careful_readers_checks_hold_on_the_slowed_build_and_catch_a_wall_clock_verdict(quiet_and_slowed):
    """tools/beside_a_burner.py's `read` (what the integrator runs after a build beside a burner) passes the
    slowed build's reports, and fails them once step 3 is judged on the wall clock."""
    import subprocess
    import sys

    _, slow, loaded = quiet_and_slowed
    for name in ("report", "beyond"):
        (slow / f"{name}.md").write_text(render(slow, name, "ko"), encoding="utf-8")
    command = [sys.executable, str(ROOT / "tools" / "beside_a_burner.py"), "read", str(slow)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0 and "FAIL" not in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    cpu = clocks.step3_speedup(loaded["slowed"]["time_runs"])["cpu"]
    report = (slow / "report.md").read_text(encoding="utf-8")
    wall = loaded["slowed"]["time_runs"]["speedup"]
    (slow / "report.md").write_text(report.replace(f"{cpu['low']:.2f}–{cpu['high']:.2f}",
                                                   f"{wall['low']:.2f}–{wall['high']:.2f}"), encoding="utf-8")
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 1 and "FAIL step 3 on the cpu clock" in done.stdout, done.stdout[-3000:]


def test_both_reports_say_which_build_made_them(course_build):
    """Provenance at the top of both reports: the commit of the checkout the workflow ran from (the tests'
    build runs this one's Snakefile), or "unknown" outside a git checkout; the date; the machine; torch."""
    import subprocess

    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = f"커밋 `{done.stdout.strip()}`" if done.returncode == 0 else "알 수 없음(워크플로가 git 체크아웃 안에서 돌지 않았음)"
    processor = json.loads((course_build / "results" / "time_runs.json").read_text())["processor"]
    for name in ("report.md", "beyond.md"):
        text = (course_build / "results" / name).read_text(encoding="utf-8")
        build = next(line for line in text.splitlines()[:8] if line.startswith("- **빌드:**"))
        assert commit in build and "torch 2.13.0" in build and processor in build, build
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", build)


def test_the_build_provenance_names_the_commit_of_a_git_checkout(tmp_path):
    import datetime
    import subprocess

    from kvlab.workflow import build_provenance

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a").write_text("a")
    for args in (["add", "a"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "a"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    when = datetime.datetime(2026, 12, 3, 19, 40, tzinfo=datetime.timezone.utc)
    built = build_provenance(tmp_path, when)
    assert built["commit"] == head and built["changed"] is False and built["date"] == "2026-12-03 19:40 UTC"
    (tmp_path / "a").write_text("b")
    assert build_provenance(tmp_path, when)["changed"] is True
    assert build_provenance(tmp_path / "missing")["commit"] is None
