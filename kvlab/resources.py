"""What a job asks of a scheduler: its memory (`mem_mb`) and wall time (`runtime`, minutes),
estimated from the model it loads or trains and the work it does.

The rules (rules/*.smk) describe their work as a `Work`: how many forward calls, how many tokens
fed to them (the lab's own formulas), how many tokens trained on. A model's parameters are
estimated by kvlab.lab.compare.parameter_estimate: from its checkpoint file's size (read when the
job is ready to run) or from its architecture (the embedded default's config, random-weight models). The estimates are upper bounds for one CPU core of an ordinary cluster node, several
times what this project's machine needs; every retry (`attempt`) doubles, triples, ... them, so a
job killed for running out of time or memory asks for more the next time.

Free of PyTorch and Snakemake: the workflow's main process evaluates these for every job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvlab.lab.compare import parameter_estimate
from kvlab.lab.formulas import fed_formulas

MB = 1024**2
# A job's Python with torch and kvlab imported: about 230 MB measured; twice that.
PROCESS_MB = 512
# Snakemake's job step, the interpreter and the imports before the work starts: 5 to 20 s here
# (a busy shared file system is slower). No job asks for less than two minutes.
STARTUP_S = 120
# One forward call's fixed cost (1.4 ms measured for the lab's model here) ...
FORWARD_S = 0.01
# ... and the sustained speed of the matrix work on one core (2 FLOPs per parameter per token fed,
# 6 when training). The lab's model reached about 60 GFLOP/s here; ask for far less.
FLOPS = 5e9
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2}
# Attention scores of one forward call: heads x context^2 float32 numbers; 16 heads at most.
SCORE_BYTES_PER_CONTEXT_SQUARED = 16 * 4
# The chat template's tokens around a question (role markers, newlines), at most.
CHAT_TOKENS = 32


@dataclass(frozen=True)
class Work:
    """What a job makes a model do."""
    forwards: int = 0        # forward calls (one per generated token, one per training step)
    fed_tokens: int = 0      # tokens fed to forward, over every call and every sequence
    trained_tokens: int = 0  # tokens trained on (forward and backward)
    context: int = 1         # the longest sequence one call sees
    batch: int = 1           # sequences in one call

    def __add__(self, other: Work) -> Work:
        return Work(self.forwards + other.forwards, self.fed_tokens + other.fed_tokens,
                    self.trained_tokens + other.trained_tokens, max(self.context, other.context),
                    max(self.batch, other.batch))


def greedy_pair(prompt_len: int, new_tokens: int, runs: int = 1) -> Work:
    """`runs` generations of `new_tokens` in each mode, with the cache and without (steps 1-3)."""
    fed = fed_formulas(prompt_len, new_tokens)
    return Work(forwards=2 * runs * new_tokens, fed_tokens=runs * (fed["with_cache"] + fed["without_cache"]),
                context=prompt_len + new_tokens)


def sampled(prompt_len: int, new_tokens: int, samples: int, runs: int = 1) -> Work:
    """`runs` cached generations of `samples` sequences at once (step 5)."""
    fed = fed_formulas(prompt_len, new_tokens)["with_cache"]
    return Work(forwards=runs * new_tokens, fed_tokens=runs * samples * fed, context=prompt_len + new_tokens,
                batch=samples)


def forward(tokens: int, calls: int = 1) -> Work:
    """`calls` forward calls of `tokens` tokens each (steps 4 and 6)."""
    return Work(forwards=calls, fed_tokens=calls * tokens, context=tokens)


def training(steps: int, batch_size: int, seq_len: int) -> Work:
    return Work(forwards=steps, trained_tokens=steps * batch_size * seq_len, context=seq_len, batch=batch_size)


def prompt_len_bound(cut_tokens: int) -> int:
    """The lab's prompt: bos and at most `cut_tokens` tokens."""
    return cut_tokens + 1


def text_tokens_bound(text: str) -> int:
    """A byte-level BPE tokenizer (kvlab's, MiniMind's) gives at most one token per byte."""
    return len(text.encode("utf-8"))


def chat_len_bound(question: str) -> int:
    """A question in the chat template."""
    return text_tokens_bound(question) + CHAT_TOKENS


def checkpoint_params(checkpoint_bytes: int) -> int:
    """The most parameters a checkpoint of this size holds (float16, as MiniMind ships them; kvlab's
    float32 files hold half as many: an upper bound)."""
    return parameter_estimate({}, checkpoint_bytes)


def architecture_params(architecture: dict) -> int:
    """Parameters of a MiniMind of this architecture (hidden_size, num_hidden_layers, heads, ...)."""
    return parameter_estimate({"architecture": architecture}, None)


def grid_count_bound(start: float, stop: float, step: float) -> int:
    """Points of the grid start, start + step, ..., stop: at most this many."""
    return math.ceil((stop - start) / step) + 1


def runtime_minutes(work: Work, params: int, attempt: int = 1, extra_s: float = 0.0) -> int:
    """Minutes of wall time for `work` on a model of `params` parameters (`extra_s`: anything else)."""
    flops = 2 * params * work.fed_tokens + 6 * params * work.trained_tokens
    seconds = STARTUP_S + extra_s + work.forwards * FORWARD_S + flops / FLOPS
    return attempt * math.ceil(seconds / 60)


def _scores_mb(work: Work) -> float:
    return work.batch * work.context**2 * SCORE_BYTES_PER_CONTEXT_SQUARED / MB


def model_mem_mb(params: int, dtype: str, work: Work, attempt: int = 1, file_bytes: int = 0) -> int:
    """Memory of a job that holds models of `params` parameters in `dtype` and runs `work`: the
    checkpoint files as read (`file_bytes`), the models (and a copy while casting), the attention
    scores."""
    model_mb = 2 * params * BYTES_PER_ELEMENT[dtype] / MB
    return attempt * math.ceil(PROCESS_MB + file_bytes / MB + model_mb + _scores_mb(work))


def training_mem_mb(params: int, hidden_size: int, num_hidden_layers: int, vocab_size: int, work: Work,
                    attempt: int = 1) -> int:
    """Memory of a float32 training job: weights, gradients and Adam's two moments (16 bytes a
    parameter) and what backward keeps of every token: about 100 bytes per layer and hidden unit,
    16 per vocabulary entry (logits, softmax, their gradients), three copies of each layer's
    attention scores. (The embedded default's pretraining peaked at 608 MB here.)"""
    state_mb = 16 * params / MB
    tokens = work.batch * work.context
    activations_mb = tokens * (100 * num_hidden_layers * hidden_size + 16 * vocab_size) / MB
    scores_mb = 3 * num_hidden_layers * _scores_mb(work)
    return attempt * math.ceil(PROCESS_MB + state_mb + activations_mb + scores_mb)


def light_mem_mb(input_bytes: int = 0, attempt: int = 1, per_input_byte: int = 4) -> int:
    """Memory of a job that loads no model: the process and a few copies of what it reads."""
    return attempt * math.ceil(PROCESS_MB + per_input_byte * input_bytes / MB)


def light_runtime_minutes(seconds_of_work: float = 0.0, attempt: int = 1) -> int:
    return attempt * math.ceil((STARTUP_S + seconds_of_work) / 60)
