"""What a job asks of a scheduler: memory (`mem_mb`) and wall time (`runtime`, minutes), in four
declared sizes. Each is multiplied by the attempt, so a job killed for time or memory asks for twice
as much when it runs again (the Slurm profile's `retries`). They are generous for this lab: its
jobs take 1 to 110 s and at most 0.6 GB here. A site tunes them in its profile (`set-resources`,
see profiles/slurm/config.yaml), not here. Free of PyTorch: Snakemake's own process sizes every job.
"""

from __future__ import annotations

import math

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
