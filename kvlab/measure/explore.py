"""What the lab's page (results/explore.html, kvlab.present.explore) needs that no other result holds.

  * steps_opened      step 1's greedy generation (the prompt, N new tokens) opened step by step, in
                      both modes: the tokens each step fed to forward, the K and V rows each layer
                      computed (forward hooks on every layer's k_proj and v_proj), the cache held after
                      the step, its tokens per layer and its bytes (weighed as step 4 weighs it), and
                      the text each new token adds;
  * next_token_logits step 6's two prefixes: the next-token logits over the whole vocabulary, so that
                      the page redraws softmax(logits / T) and MiniMind's top-p cut itself, and the
                      text of the tokens it draws as bars.

Nothing here is timed: the page reads each step's time from `latency` (kvlab.measure.curves.step_latency),
the same greedy generation timed one forward call at a time.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from kvlab.engine.device import dtype_name
from kvlab.engine.model import MiniMindForCausalLM, kv_cache_bytes
from kvlab.engine.config import BYTES_PER_ELEMENT
from kvlab.engine.tokenizer import Tokenizer
from kvlab.facts.formulas import MODES
from kvlab.measure import steps

log = logging.getLogger("kvlab")

# Where a token's text is not a whole character on its own (a byte-level piece): what stands for it.
BROKEN = "\ufffd"


@contextmanager
def counting_kv_rows(model: MiniMindForCausalLM):
    """Count the rows (tokens) each layer's k_proj and v_proj compute, with forward hooks. Yields
    {"k": [rows per layer], "v": [...]}, added up over every call until the caller resets them."""
    layers = model.model.layers
    counts = {"k": [0] * len(layers), "v": [0] * len(layers)}

    def hook(which: str, index: int):
        def count(module, inputs, output):
            counts[which][index] += int(output.shape[1])  # (batch, fed, kv_heads * head_dim)
        return count

    handles = [layer.self_attn.k_proj.register_forward_hook(hook("k", index)) for index, layer in enumerate(layers)]
    handles += [layer.self_attn.v_proj.register_forward_hook(hook("v", index)) for index, layer in enumerate(layers)]
    try:
        yield counts
    finally:
        for handle in handles:
            handle.remove()


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


def steps_opened(model: MiniMindForCausalLM, tokenizer: Tokenizer, prompt_ids: list[int], new_tokens: int,
                 device) -> dict:
    """Step 1's generation in both modes, one entry a step (a call of forward): `fed`, the tokens fed;
    `kv_computed`, the K rows each layer computed (its V rows are checked to be as many); `cache_tokens`,
    the tokens each layer's cache holds after the step, and `cache_bytes`, what those tensors weigh
    (none without the cache: MiniMind then keeps nothing). The new ids must be the same in both modes
    (step 1), or this refuses."""
    prompt = steps.prompt_tensor(model, prompt_ids, new_tokens, device)
    by_mode, new_ids = {}, {}
    for label, use_cache in MODES:
        entries = []
        with counting_kv_rows(model) as computed:
            def observe(input_ids, output):
                if computed["k"] != computed["v"]:
                    raise AssertionError(f"k_proj and v_proj computed {computed['k']} and {computed['v']} rows")
                cache = output.past_key_values
                entries.append({
                    "fed": int(input_ids.shape[1]),
                    "kv_computed": list(computed["k"]),
                    "cache_tokens": [int(k.shape[1]) for k, _ in cache] if cache else [0] * len(computed["k"]),
                    "cache_bytes": kv_cache_bytes(cache) if cache else 0,
                })
                for which in computed.values():
                    which[:] = [0] * len(which)

            with steps.recording_forward(model, observe=observe):
                new_ids[label] = steps.greedy_new_ids(model, prompt, new_tokens, use_cache)
        by_mode[label] = entries
    if new_ids["with_cache"] != new_ids["without_cache"]:
        raise ValueError("the greedy tokens differ with and without the cache (step 1's same_ids is false): "
                         "the page steps through one generation")
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
                   **{label: by_mode[label][index] for label, _ in MODES}}
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


def explore_data(model: MiniMindForCausalLM, tokenizer: Tokenizer, prompt_ids: list[int], new_tokens: int,
                 prefix: str, sharp_prefix: str, labelled: int, device) -> dict:
    """results/explore_steps.json: the generation opened step by step, and both prefixes' logits."""
    opened = steps_opened(model, tokenizer, prompt_ids, new_tokens, device)
    log.info("%d steps; fed %d / %d tokens, cache %d bytes at the end", len(opened["steps"]),
             sum(step["with_cache"]["fed"] for step in opened["steps"]),
             sum(step["without_cache"]["fed"] for step in opened["steps"]),
             opened["steps"][-1]["with_cache"]["cache_bytes"] if opened["steps"] else 0)
    return {**opened, "next_token": {"flat": prefix_logits(model, tokenizer, prefix, labelled, device),
                                     "sharp": prefix_logits(model, tokenizer, sharp_prefix, labelled, device)}}
