"""What every Snakemake `script:` entry point shares: logging to the rule's log file, one-line
errors for bad input, a clean exit when a scheduler stops the job, and the tokenizer input.

Free of PyTorch, so that jobs which load no model (the corpus, the tokenizer, the prompt, figures,
the report, the check) start without it; model jobs load theirs with kvlab.checkpoints."""

from __future__ import annotations

import datetime
import logging
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from contextlib import ExitStack, redirect_stderr
from importlib import metadata
from pathlib import Path

from kvlab.engine.tokenizer import load_tokenizer

# Errors whose message already says what is wrong and where: shown as one line, no traceback.
# (CheckpointError, TokenizerError, DataError and ArchitectureError are ValueErrors.)
USER_ERRORS = (ValueError, FileNotFoundError)

log = logging.getLogger("kvlab")


def run(snakemake, main) -> None:
    """Call `main(snakemake)` with its log set up: the logger and everything written to stderr
    (library warnings, progress) go, in order, to the rule's log file. Bad input becomes a
    one-line error on the console (and in the log) and exit status 1."""
    console = sys.stderr
    with ExitStack() as stack:
        stream = console
        if snakemake.log:
            log_path = Path(snakemake.log[0])
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # one handle for both, so the logger's lines and stray stderr never overwrite each other
            stream = stack.enter_context(open(log_path, "w", encoding="utf-8", buffering=1))
            stack.enter_context(redirect_stderr(stream))
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                            handlers=[logging.StreamHandler(stream)], force=True)
        # One torch thread in every job that uses torch (its script imported it by now): the model is
        # tiny, so a second thread buys little and, on a busy machine, makes timings erratic; results
        # also stay the same whatever --cores is. Timing rules still reserve every core (threads:).
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        # A scheduler stops a job with SIGTERM (scancel, a time limit) before it kills it: exit the
        # Python way, so an output being written is removed, never left half-written. A process
        # inherits the signals its parent blocks; a blocked SIGTERM would wait until the job ended.
        signal.signal(signal.SIGTERM, exit_on_sigterm)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        try:
            main(snakemake)
            log.info(clocks_line())
        except USER_ERRORS as err:
            message = f"kvlab error in rule {snakemake.rule}: {err}"
            log.error(message)
            print(message, file=console)
            sys.exit(1)
        except Exception:
            log.error(traceback.format_exc())
            raise


CLOCKS = "the job's clocks:"


def clocks_line() -> str:
    """The job's CPU seconds so far, its own and its finished children's (a compiler run, a tokenizer's
    worker), beside the wall seconds since the process started: the last line of every job's log, read
    by tools/build_times.py. Where the wall is far above the CPU, the job waited."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    own_s, children_s = own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime
    return (f"{CLOCKS} wall {process_age():.2f} s, CPU {own_s + children_s:.2f} s "
            f"(its own {own_s:.2f} s, its children's {children_s:.2f} s)")


def process_age() -> float:
    """Seconds since this process started (Linux's /proc, to the hundredth; elsewhere, since kvlab was
    imported)."""
    try:
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return float(Path("/proc/uptime").read_text().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time() - IMPORTED


IMPORTED = time.time()


def exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def load_tokenizer_input(snakemake):
    """The tokenizer folder that holds input `tokenizer` (its tokenizer.json)."""
    return load_tokenizer(Path(snakemake.input.tokenizer).parent)


def build_provenance(folder, now: datetime.datetime | None = None) -> dict:
    """Which code made a report, and when: {commit, changed, date, torch}. `commit` is `git rev-parse
    --short HEAD` of the checkout `folder` (the workflow's) is in, None when it is in none (a copied
    workflow, a release archive) or git is missing; `changed`, whether its tracked files differ from
    that commit; `date`, now in UTC to the minute; `torch`, the installed version, read from its
    metadata (the report's job does not import torch)."""
    def git(*args) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    changed = bool(commit) and bool(git("status", "--porcelain", "--untracked-files=no"))
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return {"commit": commit or None, "changed": changed, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch_version}
