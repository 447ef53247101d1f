"""tools/build_times.py on the tests' build: every job's wall and CPU seconds from its own log, and the
serving jobs loading the steps compile_steps compiled (the build compiles them once)."""
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import build_times  # noqa: E402
from helpers import course_config, snakemake  # noqa: E402


def test_every_job_of_the_build_says_its_wall_and_cpu_seconds(course_build):
    """Each job's log ends with its clocks, read for every job of the build: CPU seconds above zero and
    no more than two cores' worth of its process's wall; the printed table names every job, its sum
    and which jobs waited."""
    # the build's own run: a later run in its folder (step 3 timed again, tests/conftest.py) runs a few jobs
    log = max((course_build / ".snakemake" / "log").glob("*.log"), key=lambda path: len(build_times.parse_log(path)[0]))
    jobs, elapsed = build_times.parse_log(log)
    rows = build_times.job_rows(course_build, jobs)
    assert len(rows) > 30 and elapsed > 0
    unclocked = [row["label"] for row in rows if row["cpu"] is None]
    assert not unclocked, f"these jobs' logs end without the job's clocks: {unclocked}"
    for row in rows:
        assert 0 < row["cpu"] <= 2 * row["process_wall"] + 0.5, row
        assert row["process_wall"] <= row["wall"] + 1.5, row  # the process lives within its job
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "build_times.py"), str(course_build),
                           "--unit", "7.5", "--log", str(log)], capture_output=True, text=True, check=True)
    assert all(row["label"] in done.stdout for row in rows)
    assert "machine units of 7.50 s" in done.stdout and "waited more than 3 s beyond their CPU:" in done.stdout


def test_the_serving_jobs_load_the_steps_compile_steps_compiled(course_build, course, tmp_path):
    """With the engine compiled (the tests' build runs it eager), compile_steps makes both compiled
    steps ready and says where they are kept; serve_rates, after it, loads the engine's step from the
    same file instead of compiling it, and says so."""
    work = tmp_path / "run"
    shutil.copytree(course_build, work, symlinks=True)
    config = copy.deepcopy(course_config(course))  # SMALL_EXTRAS stays as other tests know it
    config["extras"]["serving"]["compile"] = True
    snakemake(work, "results/serving/serve_rates.csv", config=config)
    results = work / "results"
    compiled = json.loads((results / "serving" / "compiled_steps.json").read_text(encoding="utf-8"))["steps"]
    assert len(compiled["engine"]["files"]) == 1 and compiled["one_at_a_time"]["files"]
    assert "compiled steps ready: one_at_a_time: " in (results / "logs" / "compile_steps.log").read_text(encoding="utf-8")
    rates_log = (results / "logs" / "serve_rates.log").read_text(encoding="utf-8")
    assert f"engine: loaded {compiled['engine']['files'][0]}" in rates_log, rates_log[-2000:]
