"""What the lab ran on: each checkpoint's architecture with the source of every field, and the
pretrained model's perplexity on the lab prompt, a sanity number a student can read at a glance.

A perplexity near the vocabulary size means the model predicts the prompt no better than a
uniform guess: an untrained model, or a tokenizer that does not belong to the checkpoint (its
ids then stand for other tokens than the ones the model learned). That becomes a warning at the
top of the report and in `check`.
"""

from __future__ import annotations

import math

from kvlab.engine.architecture import mean_loss
from kvlab.engine.model import count_parameters

# Warn when the prompt's perplexity exceeds vocabulary / PERPLEXITY_ALARM_DIVISOR.
PERPLEXITY_ALARM_DIVISOR = 4


def describe_model(checkpoint, model, head_count: dict | None = None) -> dict:
    entry = {"checkpoint": str(checkpoint), **model.architecture.to_dict(), "parameters": count_parameters(model)}
    if head_count:
        entry["head_count"] = head_count
    return entry


def model_card(models: dict, tokenizer, prompt_ids: list[int], head_counts: dict) -> dict:
    """`models`: {name: (checkpoint path, model)}, the pretrained one under "pretrain"; `head_counts`:
    {name: how its head count was measured (kvlab.checkpoints), or None where it was not}."""
    card = {
        "models": {name: describe_model(path, model, head_counts.get(name)) for name, (path, model) in models.items()},
        "tokenizer_vocab_size": tokenizer.vocab_size,
        "warnings": [],
    }
    _, pretrain = models["pretrain"]
    loss = mean_loss(pretrain, prompt_ids)
    vocab_size = pretrain.config.vocab_size
    perplexity = math.exp(loss)
    alarm = perplexity > vocab_size / PERPLEXITY_ALARM_DIVISOR
    card["prompt_perplexity"] = {"model": "pretrain", "tokens": len(prompt_ids), "loss": loss,
                                 "perplexity": perplexity, "vocab_size": vocab_size, "alarm": alarm}
    if alarm:
        card["warnings"].append(
            f"the pretrained model's perplexity on the lab prompt is {perplexity:,.1f}, near its vocabulary of "
            f"{vocab_size:,} (a uniform guess scores {vocab_size:,}): the model is untrained, or the tokenizer does "
            f"not belong to the checkpoint; the lab's numbers then say nothing about a real model"
        )
    return card
