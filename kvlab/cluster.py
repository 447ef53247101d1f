"""Running kvlab on Slurm: one line that says what to install or set, after Slurm's or Snakemake's
own message, when the cluster cannot take the run.

`preflight` runs when Snakemake reads profiles/slurm/config.yaml, before anything else: the only
moment a missing executor plugin can be named (Snakemake then stops with its own "invalid choice"
message). `failure_hints` runs when a run has failed (the Snakefile's `onerror`), on Snakemake's
log: sbatch missing from PATH, a partition or account Slurm does not know, GPUs it cannot give.
"""

from __future__ import annotations

import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

PLUGIN_MODULE = "snakemake_executor_plugin_slurm"
INSTALL_PLUGIN = ('kvlab: the Slurm profile needs Snakemake\'s Slurm executor plugin: '
                  'pip install -e ".[slurm]" (or pip install snakemake-executor-plugin-slurm)')
NO_SBATCH = ("kvlab: no sbatch on PATH: run from a Slurm login node (or add Slurm's bin folder to PATH); "
             "on a Debian machine, tests/cluster/slurm-up.sh sets up a one-node test cluster")
INVALID_PARTITION = re.compile(r"invalid partition", re.IGNORECASE)
PARTITION_NAME = re.compile(r"invalid partition specified: ([^\s']+)")
NO_GPU = re.compile(r"invalid generic resource|gres", re.IGNORECASE)
INVALID_ACCOUNT = re.compile(r"invalid account|account .* appears to be invalid", re.IGNORECASE)


def plugin_installed() -> bool:
    """Whether Snakemake will find the Slurm executor (it looks for the module the same way)."""
    return any(module.name == PLUGIN_MODULE for module in pkgutil.iter_modules())


def preflight() -> list[str]:
    """The lines to print before Snakemake reads the profile's executor."""
    return [] if plugin_installed() else [INSTALL_PLUGIN]


def partitions() -> list[str]:
    """The partitions Slurm knows, from sinfo; empty when sinfo cannot say."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(set(out.split()))


def failure_hints(log_text: str, sbatch_found: bool, known_partitions=partitions) -> list[str]:
    """What to do about a failed run whose Snakemake log is `log_text`; [] when Slurm is not why."""
    if "SLURM" not in log_text and "sbatch" not in log_text:
        return []  # a local run, or a failure of the lab itself
    if not sbatch_found:
        return [NO_SBATCH]
    hints = []
    if INVALID_PARTITION.search(log_text):
        named = PARTITION_NAME.search(log_text)
        asked = f" '{named.group(1)}'" if named else " asked for"
        names = known_partitions()
        offer = f"one of: {', '.join(names)}" if names else "a partition `sinfo -s` lists"
        hints.append(f"kvlab: Slurm has no partition{asked} here: set SBATCH_PARTITION "
                     f"(or --default-resources slurm_partition=NAME) to {offer}")
    if NO_GPU.search(log_text) and "--gpus" in log_text:
        hints.append("kvlab: Slurm has no GPU to give these jobs: set SBATCH_PARTITION to a partition "
                     "with GPUs, or run on the CPU (--config device=cpu)")
    if INVALID_ACCOUNT.search(log_text):
        hints.append("kvlab: Slurm refused the account: set SBATCH_ACCOUNT (or --default-resources "
                     "slurm_account=NAME) to one of yours (`sacctmgr show associations user=$USER`)")
    return hints


def print_failure_hints(log_paths) -> None:
    """The Snakefile's onerror: print `failure_hints` for the run's log files to stderr."""
    text = "\n".join(Path(path).read_text(encoding="utf-8", errors="replace")
                     for path in log_paths if Path(path).is_file())
    for line in failure_hints(text, shutil.which("sbatch") is not None):
        print(line, file=sys.stderr)
