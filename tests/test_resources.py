"""What each job asks of a scheduler (kvlab/resources.py, rules/common.smk), the hints when
Slurm refuses a run (kvlab/cluster.py), and a job stopped the way Slurm stops one. No Slurm needed:
tests/test_cluster.py runs the workflow on a real one."""
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from kvlab import resources
from kvlab.cluster import INSTALL_PLUGIN, NO_SBATCH, failure_hints

from helpers import ROOT, course_config, snakemake

MODEL_RULES = {"inspect_checkpoint", "model_card", "same", "timing", "kvbytes", "temp", "topp", "sweep", "latency",
               "kv_capacity", "topp_curve", "temp_curve", "compare_cost", "batch", "kv_waste", "step_anatomy",
               "compile_steps", "serve_trace", "serve_rates", "serve_bench", "explore_steps", "kv_dtype"}
TIMED_RULES = {"timing", "sweep", "latency", "compare_cost", "batch", "step_anatomy", "serve_trace", "serve_rates",
               "serve_bench", "kv_dtype"}
MB = 1024**2


def test_sizes_are_declared_and_grow_with_each_attempt():
    assert resources.declared(resources.LIGHT, 1) == resources.LIGHT
    assert resources.declared(resources.TRAINING, 3) == {key: 3 * size for key, size in resources.TRAINING.items()}
    assert resources.TRAINING["mem_mb"] > 608  # what the embedded default's pretraining peaked at here
    small, big = resources.model_sized(5 * MB, 1), resources.model_sized(200 * MB, 1)
    # per MB of float16 weights: the file, the model in float32 twice while casting, the activations
    assert big["mem_mb"] - small["mem_mb"] == pytest.approx(195 * resources.MODEL_PER_MB["mem_mb"], abs=1)
    assert big["runtime"] > small["runtime"] >= resources.MODEL_BASE["runtime"]
    assert resources.model_sized(200 * MB, 2) == {key: 2 * size for key, size in big.items()}


def test_every_rule_declares_threads_and_resources():
    """Jobs a dry run of the default targets never lists (e.g. lab_tables, for --report) too."""
    rules = {}
    for path in sorted((ROOT / "rules").glob("*.smk")):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, re.MULTILINE | re.DOTALL):
            rules[match.group(1)] = match.group(2)
    assert len(rules) > 20 and "lab_tables" in rules
    for rule, body in rules.items():
        assert "\n    threads:" in "\n" + body and "\n    resources:" in "\n" + body, rule


def job_resources(output: str) -> dict[str, dict[str, str]]:
    """rule -> its resources, from a dry run's job listing."""
    jobs = {}
    for rule, listed in re.findall(r"^rule (\w+):\n(?:    .*\n)*?    resources: (.*)$", output, re.MULTILINE):
        jobs[rule] = dict(item.split("=", 1) for item in listed.split(", "))
    return jobs


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_job_asks_for_memory_and_time_and_a_gpu_only_on_cuda(tmp_path, course, device):
    config = course_config(course) | {"device": device}
    # everything `all` builds, and what is only built when asked for
    jobs = job_resources(snakemake(tmp_path, "-n", "--forceall", "all", "results/figures/serve_bench.png",
                                   config=config).stdout)
    assert set(jobs) >= MODEL_RULES | {"prompt", "report", "check", "figure_cost_curves", "figure_serve_bench"}
    for rule, asked in jobs.items():
        if rule == "all":
            continue
        assert {"mem_mb", "runtime"} <= set(asked), rule
        # an inspection measures a head count on the CPU, whatever the device
        assert (asked.get("gpu", "0") != "0") == (device == "cuda" and rule in MODEL_RULES - {"inspect_checkpoint"}), rule
        assert (asked.get("slurm_extra") == "--exclusive") == (rule in TIMED_RULES), rule
    if device == "cuda":
        assert jobs["same"]["gpu"] == "1"


def test_the_asks_follow_each_jobs_kind_and_checkpoints(tmp_path, course):
    """The course's checkpoints exist, so a dry run shows the model jobs' asks as numbers."""
    config = {key: str(path) for key, path in course.items()}
    jobs = job_resources(snakemake(tmp_path, "-n", "--forceall", config=config).stdout)
    pretrain, sft = (course[key].stat().st_size for key in ("pretrain", "sft"))
    for rule in ("same", "sweep", "kvbytes"):
        assert jobs[rule]["mem_mb"] == str(resources.model_sized(pretrain, 1)["mem_mb"]), rule
    assert jobs["model_card"]["mem_mb"] == str(resources.model_sized(pretrain + sft, 1)["mem_mb"])
    for rule in ("prompt", "report", "check", "figure_cost_curves"):
        assert (jobs[rule]["mem_mb"], jobs[rule]["runtime"]) == tuple(map(str, resources.LIGHT.values())), rule


def test_a_site_sets_its_own_sizes_in_the_profile(tmp_path, course):
    """What the Slurm profile's `set-resources` does, given on the command line."""
    config = {key: str(path) for key, path in course.items()}
    output = snakemake(tmp_path, "-n", "--forceall", "--set-resources", "sweep:runtime=240", "sweep:mem_mb=9000",
                       config=config).stdout
    assert job_resources(output)["sweep"]["runtime"] == "240" and job_resources(output)["sweep"]["mem_mb"] == "9000"


def test_each_compared_model_asks_for_its_own_size(tmp_path, course):
    small = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}
    big = {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2}
    config = course_config(course) | {"compare": [{"name": "small", "architecture": small},
                                                  {"name": "big", "architecture": big, "device": "cuda"}]}
    output = snakemake(tmp_path, "-n", "results/compare.csv", config=config).stdout
    jobs = {}
    for name, listed in re.findall(r"^rule compare_cost:\n(?:    .*\n)*?    wildcards: name=(\w+)\n(?:    .*\n)*?"
                                   r"    resources: (.*)$", output, re.MULTILINE):
        jobs[name] = dict(item.split("=", 1) for item in listed.split(", "))
    assert set(jobs) == {"lab", "small", "big"}
    assert int(jobs["big"]["mem_mb"]) > int(jobs["small"]["mem_mb"])
    assert int(jobs["big"]["runtime"]) >= int(jobs["small"]["runtime"])
    assert jobs["big"]["gpu"] == "1" and jobs["small"]["gpu"] == "0"  # its own device


def test_lint_finds_nothing_but_the_conda_note(tmp_path):
    result = subprocess.run([sys.executable, "-m", "snakemake", "--lint", "--snakefile", str(ROOT / "Snakefile"),
                             "--directory", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    lints = re.findall(r"^\s+\* (.*)$", result.stdout + result.stderr, re.MULTILINE)
    assert lints, result.stdout + result.stderr
    assert set(lints) == {"Specify a conda environment or container for each rule.:"}


def test_failure_hints_name_what_to_set():
    partition_log = ("SLURM sbatch failed. The error message was 'sbatch: error: invalid partition specified: gpu_big\n"
                     "sbatch: error: Batch job submission failed: Invalid partition name specified'.")
    [line] = failure_hints(partition_log, sbatch_found=True, known_partitions=lambda: ["debug", "long"])
    assert "'gpu_big'" in line and "SBATCH_PARTITION" in line and "debug, long" in line
    assert failure_hints("Job submission failed with exception: No such file or directory: 'sinfo' (SLURM)",
                         sbatch_found=False) == [NO_SBATCH]
    [account] = failure_hints("SLURM sbatch failed: Invalid account or account/partition combination specified",
                              sbatch_found=True)
    assert "SBATCH_ACCOUNT" in account
    [gpu] = failure_hints("SLURM sbatch failed. The error message was 'sbatch: error: Invalid generic resource "
                          "(gres) specification'.\n    sbatch call: sbatch --mem 522 --gpus=1", sbatch_found=True)
    assert "device=cpu" in gpu
    # a failure of the lab itself, locally: nothing to add
    assert failure_hints("Error in rule same:\n    kvlab error in rule same: bad checkpoint", sbatch_found=False) == []
    assert "pip install" in INSTALL_PLUGIN and "[slurm]" in INSTALL_PLUGIN


@pytest.mark.parametrize("blocked_by_parent", [False, True])
def test_a_job_stopped_with_sigterm_removes_the_output_it_was_writing(tmp_path, blocked_by_parent):
    """scancel and Slurm's time limit send SIGTERM first: the file being written must go, also when
    the process that started the job blocks SIGTERM (a child inherits its parent's blocked signals;
    then the signal waited, unseen, until the job ended on its own)."""
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(f"""
        import time
        from types import SimpleNamespace
        from kvlab.io import atomic_path
        from kvlab.workflow import run

        def main(snakemake):
            with atomic_path({str(tmp_path / "out.json")!r}) as tmp:
                tmp.write_text("half of it")
                print("writing", flush=True)
                time.sleep(60)

        run(SimpleNamespace(log=[{str(tmp_path / "job.log")!r}], rule="job"), main)
    """), encoding="utf-8")
    blocked = {signal.SIGTERM} if blocked_by_parent else set()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        proc = subprocess.Popen([sys.executable, str(job)], stdout=subprocess.PIPE, text=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    assert proc.stdout.readline().strip() == "writing"
    assert len(list(tmp_path.glob(".out.json.*.tmp"))) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not (tmp_path / "out.json").exists() and not list(tmp_path.glob(".out.json.*"))
