"""What each job asks of a scheduler (kvlab/resources.py, the rules' resources:), the hints when
Slurm refuses a run (kvlab/cluster.py), and a job stopped the way Slurm stops one. No Slurm needed:
tests/test_cluster.py runs the workflow on a real one."""
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from kvlab import resources as cost
from kvlab.cluster import INSTALL_PLUGIN, NO_SBATCH, failure_hints

from helpers import ROOT, course_config, snakemake

MODEL_RULES = {"model_card", "same", "timing", "kvbytes", "temp", "topp", "sweep", "latency", "kv_capacity",
               "topp_curve", "temp_curve", "compare_cost"}
TIMED_RULES = {"timing", "sweep", "latency", "compare_cost"}
MB = 1024**2


def checkpoint_mem_mb(file_bytes, dtype="float32", work=cost.greedy_pair(201, 64, runs=4), attempt=1):
    return cost.model_mem_mb(cost.checkpoint_params(file_bytes), dtype, work, attempt, file_bytes)


def test_memory_follows_the_model_and_grows_with_each_attempt():
    small, big = checkpoint_mem_mb(5 * MB), checkpoint_mem_mb(200 * MB)
    # per MB of file: the file as read (1 MB) and the model in float32, twice while casting: a file
    # holds at least 2 bytes a parameter, so 2 copies x 4 bytes / 2 bytes = 4 MB
    assert big - small == pytest.approx(195 * (1 + 4), abs=2)
    assert checkpoint_mem_mb(200 * MB, "float16") < big
    assert checkpoint_mem_mb(200 * MB, attempt=2) == 2 * big
    assert small >= cost.PROCESS_MB
    # an architecture's count is the compare rule's own (kvlab.lab.compare.parameter_estimate)
    small_arch = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert cost.architecture_params({**small_arch, "hidden_size": 768}) > cost.architecture_params(small_arch)


def test_runtime_follows_the_work():
    params = cost.checkpoint_params(200 * MB)
    lab = cost.runtime_minutes(cost.greedy_pair(201, 64, runs=4), params)
    longer = cost.runtime_minutes(cost.greedy_pair(201, 256, runs=4), params)
    assert lab < longer and lab > cost.STARTUP_S / 60
    assert cost.runtime_minutes(cost.greedy_pair(201, 64, runs=4), params, attempt=3) == 3 * lab
    # the fed tokens are the lab's own formulas: P+N-1 with the cache, P*N+N(N-1)/2 without, per run
    assert cost.greedy_pair(201, 64, runs=4).fed_tokens == 4 * (264 + 14880)
    assert cost.training(300, 16, 128).trained_tokens == 300 * 16 * 128


def test_training_memory_counts_adam_state_and_activations():
    work = cost.training(300, 16, 128)
    params = cost.architecture_params({"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                                       "num_key_value_heads": 2, "vocab_size": 2048})
    base = cost.training_mem_mb(params, 128, 4, 2048, work)
    assert cost.training_mem_mb(10 * params, 128, 4, 2048, work) - base == pytest.approx(16 * 9 * params / MB, abs=1)
    assert cost.training_mem_mb(params, 128, 4, 2048, cost.training(300, 64, 128)) > base
    assert cost.training_mem_mb(params, 128, 4, 2048, work, attempt=2) == 2 * base
    assert base > 608  # what the embedded default's pretraining (these sizes) peaked at here


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
    jobs = job_resources(snakemake(tmp_path, "-n", "--forceall", config=config).stdout)
    assert set(jobs) >= MODEL_RULES | {"prompt", "report", "check", "figure_cost_curves"}
    for rule, asked in jobs.items():
        if rule == "all":
            continue
        assert {"mem_mb", "runtime"} <= set(asked), rule
        assert (asked.get("gpu", "0") != "0") == (device == "cuda" and rule in MODEL_RULES), rule
        assert (asked.get("slurm_extra") == "--exclusive") == (rule in TIMED_RULES), rule
    if device == "cuda":
        assert jobs["same"]["gpu"] == "1"


def test_the_asks_follow_each_rules_work(tmp_path, course):
    """The lab's own sizes on the course's checkpoint (it exists, so the asks are numbers)."""
    config = {key: str(path) for key, path in course.items()}
    jobs = job_resources(snakemake(tmp_path, "-n", "--forceall", config=config).stdout)
    runtime = {rule: int(asked["runtime"]) for rule, asked in jobs.items() if rule in MODEL_RULES}
    mem_mb = {rule: int(asked["mem_mb"]) for rule, asked in jobs.items() if rule in MODEL_RULES}
    assert runtime["sweep"] > runtime["timing"] >= runtime["kvbytes"]  # N up to 256 vs N = 64 vs one forward
    assert mem_mb["kv_capacity"] > mem_mb["kvbytes"]  # it also builds MiniMind's default architecture
    assert mem_mb["temp"] > mem_mb["topp"]  # 30 answers at once vs one prefix
    assert min(mem_mb.values()) > cost.PROCESS_MB


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


def test_a_job_stopped_with_sigterm_removes_the_output_it_was_writing(tmp_path):
    """scancel and Slurm's time limit send SIGTERM first: the file being written must go."""
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
    proc = subprocess.Popen([sys.executable, str(job)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert len(list(tmp_path.glob(".out.json.*.tmp"))) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert not (tmp_path / "out.json").exists() and not list(tmp_path.glob(".out.json.*"))
