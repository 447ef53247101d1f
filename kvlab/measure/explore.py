"""What the lab's page (results/explore.html, kvlab.present.explore) needs that no other result holds.

  * steps_opened      step 1's greedy generation (the prompt, N new tokens) opened step by step, in
                      both modes, as `same` opened it (kvlab.measure.steps.generation_opened, with
                      forward hooks: one generation a mode serves steps 1, 2 and the page): the
                      tokens each step fed to forward, the K and V rows each layer computed, the cache
                      held after the step, its tokens per layer and its bytes (weighed as step 4
                      weighs it), and here the text each new token adds;
  * next_token_logits step 6's two prefixes: the next-token logits over the whole vocabulary, so that
                      the page redraws softmax(logits / T) and MiniMind's top-p cut itself, and the
                      text of the tokens it draws as bars.

Nothing here is timed: the page reads each step's time from `latency` (kvlab.measure.curves.step_latency),
the same greedy generation timed one forward call at a time.
"""

from __future__ import annotations

import logging

import torch

from kvlab.engine.device import dtype_name
from kvlab.engine.model import MiniMindForCausalLM
from kvlab.engine.config import BYTES_PER_ELEMENT
from kvlab.engine.tokenizer import BROKEN, Tokenizer
from kvlab.facts.formulas import MODES
from kvlab.measure import steps

log = logging.getLogger("kvlab")



def token_pieces(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """The text each id adds to the text of those before it. A token that ends inside a character (a
    byte-level piece) adds nothing until the character is whole; the next one adds it."""
    pieces, shown = [], ""
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end]).rstrip(BROKEN)
        if not text.startswith(shown):  # a decoder that rewrites what came before: the token alone
            text = shown + tokenizer.decode(ids[end - 1:end])
        pieces.append(text[len(shown):])
        shown = text
    return pieces


def token_label(tokenizer: Tokenizer, token_id: int) -> str | None:
    """A token's own text, or None where it is no whole character (a byte-level piece)."""
    text = tokenizer.decode([token_id])
    return None if BROKEN in text else text


def steps_opened(opened: dict, model: MiniMindForCausalLM, tokenizer: Tokenizer, prompt_ids: list[int]) -> dict:
    """Step 1's generation as the page steps through it, from the generation `same` opened
    (kvlab.measure.steps.generation_opened, results/steps_opened.json) for the model and tokenizer it
    ran on: every step's entry in both modes, its token and the text it adds, and what the cache's
    bytes are made of. The new ids must be the same in both modes (step 1), or this refuses."""
    new_ids = opened["new_ids"]
    if new_ids["with_cache"] != new_ids["without_cache"]:
        raise ValueError("the greedy tokens differ with and without the cache (step 1's same_ids is false): "
                         "the page steps through one generation")
    if opened["prompt_len"] != len(prompt_ids):
        raise ValueError(f"the opened generation's prompt has {opened['prompt_len']} tokens, the prompt "
                         f"{len(prompt_ids)}: steps_opened.json is not this prompt's")
    ids = new_ids["with_cache"]
    pieces = token_pieces(tokenizer, ids)
    config = model.config
    dtype = dtype_name(next(model.parameters()).dtype)
    return {
        "prompt_len": len(prompt_ids),
        "new_tokens": len(ids),
        "prompt_text": tokenizer.decode(prompt_ids),
        "ids": ids,
        "model": {
            "layers": config.num_hidden_layers,
            "kv_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "dtype": dtype,
            "bytes_per_element": BYTES_PER_ELEMENT[dtype],
            "kv_bytes_per_token": config.kv_bytes_per_token(dtype),
            "vocab_size": config.vocab_size,
        },
        "steps": [{"step": index + 1, "id": token_id, "piece": piece,
                   **{label: opened["steps"][label][index] for label, _ in MODES}}
                  for index, (token_id, piece) in enumerate(zip(ids, pieces))],
    }


def prefix_logits(model: MiniMindForCausalLM, tokenizer: Tokenizer, prefix: str, labelled: int, device) -> dict:
    """After [bos] + `prefix` (step 6's input): the logits of every token, by id, and the text of the
    `labelled` highest (None for a byte-level piece), the bars the page draws."""
    logits = steps.next_token_logits(model, tokenizer, prefix, device)[0]
    top = torch.argsort(logits, descending=True, stable=True)[:labelled].tolist()
    return {
        "prefix": prefix,
        "ids": steps.prefix_ids(tokenizer, prefix),
        "logits": [float(value) for value in logits.tolist()],
        "labels": {str(token_id): token_label(tokenizer, token_id) for token_id in top},
    }


def explore_data(opened: dict, model: MiniMindForCausalLM, tokenizer: Tokenizer, prompt_ids: list[int],
                 prefix: str, sharp_prefix: str, labelled: int, device) -> dict:
    """results/explore_steps.json: the generation `same` opened, step by step, and both prefixes' logits."""
    opened = steps_opened(opened, model, tokenizer, prompt_ids)
    log.info("%d steps; fed %d / %d tokens, cache %d bytes at the end", len(opened["steps"]),
             sum(step["with_cache"]["fed"] for step in opened["steps"]),
             sum(step["without_cache"]["fed"] for step in opened["steps"]),
             opened["steps"][-1]["with_cache"]["cache_bytes"] if opened["steps"] else 0)
    return {**opened, "next_token": {"flat": prefix_logits(model, tokenizer, prefix, labelled, device),
                                     "sharp": prefix_logits(model, tokenizer, sharp_prefix, labelled, device)}}
