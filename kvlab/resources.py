"""What a job asks of a scheduler: memory (`mem_mb`) and wall time (`runtime`, minutes), declared
in three sizes: a light job, training, and a job that loads models (a base plus so much per MB of its
weights). Each is multiplied by the attempt, so a job killed for time or memory asks for twice as much
when it runs again (the Slurm profile's `retries`). They are generous for this lab: its jobs take 1 to
110 s and at most 0.6 GB here. A site tunes them in its profile (`set-resources`, see
profiles/slurm/config.yaml), not here. Free of PyTorch: Snakemake's own process sizes every job.

`asked` and `asked_by_weights` give a rule's `resources:` as Snakemake calls them (functions of the
wildcards, the input files and the attempt).
"""

from __future__ import annotations

import math
from pathlib import Path

MB = 1024**2
# A job that loads no model: the corpus, the tokenizer, the prompt, tables, figures, the report.
LIGHT = {"mem_mb": 1000, "runtime": 10}
# Training the embedded default: its pretraining peaked at 608 MB and took under 2 minutes here.
TRAINING = {"mem_mb": 4000, "runtime": 60}
# A job that loads models: Python with torch, plus, per MB of the models' float16 weights (2 bytes
# a parameter, as MiniMind ships them), the file as read, the model in float32 (twice the file)
# with a copy while casting, and what the steps compute.
MODEL_BASE = {"mem_mb": 1000, "runtime": 10}
MODEL_PER_MB = {"mem_mb": 8, "runtime": 1}


def declared(sizes: dict, attempt: int) -> dict:
    """`sizes` for this attempt."""
    return {key: size * attempt for key, size in sizes.items()}


def model_sized(weight_bytes: int, attempt: int) -> dict:
    """The sizes of a job that loads models of `weight_bytes` in float16, for this attempt."""
    return {key: attempt * math.ceil(MODEL_BASE[key] + MODEL_PER_MB[key] * weight_bytes / MB)
            for key in MODEL_BASE}


def asked(sizes: dict) -> dict:
    """`resources:` of a job of the declared `sizes`."""
    return {key: lambda wildcards, attempt, key=key: declared(sizes, attempt)[key] for key in sizes}


def asked_by_weights(weight_bytes, device, timed: bool = False) -> dict:
    """`resources:` of a job whose models weigh `weight_bytes(wildcards, input)` in float16, on
    `device(wildcards)` (a GPU asked for on "cuda"); a job that times something (`timed`) asks Slurm
    for a node of its own."""
    resources = {key: lambda wildcards, input, attempt, key=key: model_sized(weight_bytes(wildcards, input),
                                                                             attempt)[key]
                 for key in MODEL_BASE}
    resources["gpu"] = lambda wildcards: int(device(wildcards) == "cuda")
    if timed:
        resources["slurm_extra"] = "--exclusive"
    return resources


def file_bytes(*names):
    """`weight_bytes` of a job that loads the checkpoints of its inputs `names`: their files' sizes."""
    return lambda wildcards, input: sum(Path(input[name]).stat().st_size for name in names)
