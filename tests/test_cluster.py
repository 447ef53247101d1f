"""The workflow on a real one-node Slurm cluster (tests/cluster/slurm-up.sh), through
profiles/slurm and Snakemake's own Slurm executor plugin, from a clean copy of the workflow.

Without accounting (no slurmdbd) the plugin asks squeue for job states; the test cluster keeps
finished jobs there for MinJobAge seconds. The status checks are tuned for a test, here only.
Skipped, with the reason, where no Slurm is up."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kvlab.cluster import INSTALL_PLUGIN, NO_SBATCH, plugin_installed

from helpers import ROOT, course_config

# The test cluster has no accounting: job states come from squeue. First status check after 1 s.
TEST_FLAGS = ["--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks", "1",
              "--slurm-keep-successful-logs"]
TARGETS = ["results/prompt.json", "results/kvbytes.json", "results/topp.json", "results/time.json",
           "results/compare/lab/cost.json", "results/class/grades.csv"]
# Files that hold wall-clock times (README: Determinism): compared without their times.
TIMED = {"time.json", "time_runs.json", "compare/lab/cost.json"}
RUN_TIMEOUT_S = 240


def slurm_down_reason() -> str | None:
    """Why the cluster tests cannot run here, or None."""
    if not plugin_installed():
        return 'snakemake-executor-plugin-slurm is not installed (pip install -e ".[slurm]")'
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "no Slurm here (no sbatch/sinfo on PATH): run tests/cluster/slurm-up.sh as root"
    states = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True).stdout.split()
    if not any(state.rstrip("*~#") in {"idle", "mixed", "allocated", "completing"} for state in states):
        return f"Slurm is not up (sinfo: {states or 'no answer'}): run tests/cluster/slurm-up.sh as root"
    return None


SLURM_DOWN = slurm_down_reason()
needs_slurm = pytest.mark.skipif(SLURM_DOWN is not None, reason=str(SLURM_DOWN))
# One pytest worker runs these in turn: a test finds its jobs in Slurm's queue by their rule.
pytestmark = pytest.mark.xdist_group("slurm")


def workflow_copy(folder: Path) -> Path:
    """The workflow as a newcomer has it: the repository's files, no results, no Snakemake state."""
    shutil.copytree(ROOT, folder, ignore=shutil.ignore_patterns(
        ".git", "results", ".snakemake", "__pycache__", "*.egg-info", ".pytest_cache", "tests", "docs"))
    return folder


def write_config(folder: Path, config: dict) -> str:
    path = folder / "test-config.yaml"
    path.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")  # JSON is YAML
    return str(path)


def cluster_cmd(folder: Path, *args, config: dict) -> list[str]:
    """The README's cluster command, with the test cluster's flags."""
    return [sys.executable, "-m", "snakemake", "--profile", "profiles/slurm", *TEST_FLAGS, *args,
            "--configfile", write_config(folder, config)]


def run(cmd, folder, env=None, timeout=RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def submitted_jobs(output: str) -> dict[str, list[str]]:
    """Slurm job ids by rule, from the plugin's lines in Snakemake's output."""
    jobs = {}
    for match in re.finditer(r"has been submitted with SLURM jobid (\d+) \(log: \S*/rule_(\w+)/", output):
        jobs.setdefault(match.group(2), []).append(match.group(1))
    return jobs


def squeue(job_ids) -> dict[str, dict]:
    """State, comment (the plugin's rule_NAME[_wildcards_...]), memory, CPUs and whether the node is
    shared, per job id."""
    out = subprocess.run(["squeue", "--states=all", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%k|%m|%C|%h"],
                         capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        job_id, state, comment, memory, cpus, shared = line.split("|")
        rows[job_id] = {"state": state, "comment": comment, "memory": memory, "cpus": int(cpus), "shared": shared}
    return rows


def results(folder: Path) -> dict[str, bytes]:
    base = folder / "results"
    return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*")
            if p.is_file() and p.relative_to(base).parts[0] not in {"logs", "benchmarks"}}


@needs_slurm
def test_targets_run_through_sbatch_and_match_a_local_run(tmp_path, course, course_build):
    # grading too: two students of the example class (one handed in, one did not), against the shared
    # build's results as the key (grade.key; the same lab settings), so the grading jobs wait for no
    # job of the lab and run beside them
    sheet = tmp_path / "class.tsv"
    sheet.write_text(f"student_id\tresults\ns01\t{ROOT / 'examples/class/s01'}\ns08\t{tmp_path / 'none'}\n",
                     encoding="utf-8")
    config = {**course_config(course), "grade": {**yaml.safe_load((ROOT / "config.yaml").read_text(
        encoding="utf-8"))["grade"], "class_sheet": str(sheet), "key": str(course_build / "results")}}
    local = workflow_copy(tmp_path / "local")
    done = run([sys.executable, "-m", "snakemake", "--cores", "2", *TARGETS, "--configfile", write_config(local, config)],
               local)
    assert done.returncode == 0, done.stderr[-3000:]

    cluster = workflow_copy(tmp_path / "cluster")
    done = run(cluster_cmd(cluster, *TARGETS, config=config), cluster)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]

    # Every job went through sbatch, ran as the rule its comment names, and completed.
    jobs = submitted_jobs(output)
    assert set(jobs) == {"inspect_checkpoint", "prompt", "kvbytes", "topp", "timing", "compare_cost",
                         "grade_student", "grade_class"}, output[-4000:]
    assert len(jobs["grade_student"]) == 2
    states = squeue([job for ids in jobs.values() for job in ids])
    for rule, ids in jobs.items():
        for job in ids:
            assert states[job]["state"] == "COMPLETED" and states[job]["comment"].startswith(f"rule_{rule}"), states[job]
            assert list((cluster / ".snakemake" / "slurm_logs" / f"rule_{rule}").rglob(f"{job}.log"))
    # The timed jobs had the node to themselves; the others shared it.
    assert states[jobs["timing"][0]]["shared"] == states[jobs["compare_cost"][0]]["shared"] == "NO"
    assert states[jobs["kvbytes"][0]]["shared"] != "NO"

    # The same files, byte for byte, as the local run (timings aside).
    local_files, cluster_files = results(local), results(cluster)
    assert set(local_files) == set(cluster_files)
    assert {"prompt.json", "kvbytes.json", "topp.json", "topp_sharp.json", "time.json", "class/grades.csv",
            "class/s01/results.json", "class/s08/results.json"} <= set(cluster_files)
    for name, content in local_files.items():
        if name not in TIMED:
            assert cluster_files[name] == content, name
    assert json.loads(cluster_files["time.json"])["speedup"] > 0
    local_cost, cluster_cost = (untimed(json.loads(files["compare/lab/cost.json"]))
                                for files in (local_files, cluster_files))
    assert cluster_cost == local_cost and cluster_cost["fed_without_cache"] > 0


def untimed(cost: dict) -> dict:
    """A compare row without what the clock measured."""
    return {key: value for key, value in cost.items()
            if not (key.endswith(("_s", "_n", "_iqr_share", "_cpu_share", "_contended_runs")) or "speedup" in key
                    or key in ("fit_r2", "fit_runs", "unstable", "contended", "generate_usage"))}


def slurm_job(rule: str, known: set[str], state: str = "RUNNING", timeout: float = 120) -> str:
    """The id of a job of `rule` not in `known` once squeue shows it in `state`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%T|%k"], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            job_id, job_state, comment = line.split("|")
            if comment == f"rule_{rule}" and job_id not in known and job_state == state:
                return job_id
        time.sleep(0.5)
    raise AssertionError(f"no new {state} job of rule {rule} within {timeout} s")


@needs_slurm
def test_a_job_cancelled_while_it_runs_fails_the_run_and_a_rerun_completes(tmp_path, course):
    # A timing job whose timing takes about 2 s here: long enough to be caught running once loaded,
    # short enough (about 9 s in all) for the plugin's second status check, 12 s after submitting.
    config = course_config(course, time={"new_tokens": 40, "repeats": 8})
    folder = workflow_copy(tmp_path / "wf")
    cmd = cluster_cmd(folder, "results/time.json", config=config)
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log = folder / "results" / "logs" / "timing.log"
        first = slurm_job("timing", set())
        deadline = time.time() + 120
        while time.time() < deadline and not (log.exists() and "loaded" in log.read_text(encoding="utf-8")):
            time.sleep(0.2)
        assert "loaded" in log.read_text(encoding="utf-8"), "the timing job never got going"
        subprocess.run(["scancel", first], check=True)
        # The profile retries a failed job once, asking for twice the memory: cancel that one too.
        second = slurm_job("timing", {first})
        subprocess.run(["scancel", second], check=True)
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "Error in rule timing" in output and "CANCELLED" in output, output[-4000:]
    states = squeue([first, second])
    assert states[first]["state"] == states[second]["state"] == "CANCELLED"
    assert int(states[second]["memory"].rstrip("M")) == 2 * int(states[first]["memory"].rstrip("M"))
    # Nothing half-written stands: no result, no temporary file.
    assert not (folder / "results" / "time.json").exists() and not (folder / "results" / "time_runs.json").exists()
    assert not list((folder / "results").glob(".*.tmp"))

    done = run(cmd, folder)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    timing = json.loads((folder / "results" / "time.json").read_text(encoding="utf-8"))
    assert timing["speedup"] > 0
    assert len(json.loads((folder / "results" / "time_runs.json").read_text())["runs_s"]["with_cache"]) >= 8


# --- bad input ---------------------------------------------------------------------------------

@needs_slurm
def test_a_partition_that_does_not_exist(tmp_path, course):
    folder = workflow_copy(tmp_path / "wf")
    done = run(cluster_cmd(folder, "results/prompt.json", config=course_config(course)), folder,
               env={"SBATCH_PARTITION": "no_such_partition"})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "invalid partition specified: no_such_partition" in output  # Slurm's own message
    hint = [line for line in output.splitlines() if line.startswith("kvlab: Slurm has no partition")]
    assert len(hint) == 1 and "'no_such_partition'" in hint[0] and "SBATCH_PARTITION" in hint[0], output[-3000:]
    partitions = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True).stdout.split()
    assert all(name in hint[0] for name in partitions)


@needs_slurm
def test_on_cuda_a_model_job_asks_for_one_gpu(tmp_path, course):
    """This cluster has no GPU: Slurm refuses the job, and the sbatch call shows what it asked for."""
    folder = workflow_copy(tmp_path / "wf")
    config = course_config(course) | {"device": "cuda"}
    done = run(cluster_cmd(folder, "results/kvbytes.json", "--retries", "0", config=config), folder)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "Error in rule kvbytes" in output
    assert "Invalid generic resource (gres) specification" in output  # Slurm's own message
    calls = [line for line in output.splitlines() if line.strip().startswith("sbatch --parsable")]
    assert calls and all(" --gpus=1" in call for call in calls), output[-3000:]
    assert sum(line.startswith("kvlab: Slurm has no GPU") for line in output.splitlines()) == 1


@pytest.mark.skipif(not plugin_installed(), reason='snakemake-executor-plugin-slurm is not installed')
def test_no_sbatch_on_path(tmp_path, course):
    folder = workflow_copy(tmp_path / "wf")
    tools = tmp_path / "bin"  # the Python running the tests and `which`, no Slurm
    tools.mkdir()
    os.symlink(shutil.which("which"), tools / "which")
    done = run(cluster_cmd(folder, "results/prompt.json", config=course_config(course)), folder,
               env={"PATH": f"{Path(sys.executable).parent}:{tools}"})
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "Error in rule prompt" in output  # Snakemake's own message
    assert output.count(NO_SBATCH) == 1, output[-3000:]


def test_plugin_not_installed(tmp_path):
    """Snakemake without the Slurm plugin: its own 'invalid choice', and our line naming the install."""
    folder = workflow_copy(tmp_path / "wf")
    # Hide the plugin from Snakemake's plugin discovery (pkgutil.iter_modules), as if not installed.
    hide = ("import pkgutil, sys; found = pkgutil.iter_modules; "
            "pkgutil.iter_modules = lambda *a, **k: (m for m in found(*a, **k) "
            "if not m.name.startswith('snakemake_executor_plugin_slurm')); "
            "from snakemake.cli import main; sys.argv[0] = 'snakemake'; main()")
    done = run([sys.executable, "-c", hide, "--profile", "profiles/slurm", "-n"], folder)
    assert done.returncode != 0
    assert "invalid choice: 'slurm'" in done.stderr  # Snakemake's own message
    assert done.stderr.count(INSTALL_PLUGIN) == 1, done.stderr[-3000:]
