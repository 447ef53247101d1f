"""The lab sheet's steps as plain functions: each takes loaded models and returns the dicts
that the workflow writes as JSON. Snakemake scripts only load inputs and call these.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kvlab.engine.device import dtype_name, timing_context
from kvlab.engine.model import MiniMindForCausalLM, kv_cache_bytes
from kvlab.engine import sampling
from kvlab.engine.sampling import top_p_kept
from kvlab.engine.tokenizer import BROKEN, Tokenizer
from kvlab.facts import timing
from kvlab.facts.formulas import MODES

# Greedy decoding with every knob off, as the lab sheet asks for steps 1-3.
GREEDY_NO_EOS = {**sampling.GREEDY, "eos_token_id": None}


@dataclass
class ForwardCalls:
    """What a wrapped `model.forward` saw, one entry per call: the tokens fed and the seconds it took;
    and the latest call's output (its cache is the one the generation ended with)."""

    fed_lengths: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    last_output: object = None


@contextmanager
def recording_forward(model: MiniMindForCausalLM, observe=None):
    """Wrap `model.forward` (which `generate` calls once a step) and record, for every call, the length
    of its input and its wall time (CUDA synchronised on both sides, so the time is the step's own).
    `observe(input_ids, output)`, when given, sees every call too (e.g. to read the logits)."""
    calls = ForwardCalls()
    original = model.forward

    def forward(input_ids, *args, **kwargs):
        calls.fed_lengths.append(int(input_ids.shape[1]))
        sync(input_ids.device)
        start = time.perf_counter()
        output = original(input_ids, *args, **kwargs)
        sync(input_ids.device)
        calls.seconds.append(time.perf_counter() - start)
        calls.last_output = output
        if observe is not None:
            observe(input_ids, output)
        return output

    model.forward = forward
    try:
        yield calls
    finally:
        del model.forward  # the instance attribute goes; the class method shows through again


@contextmanager
def counting_forward(model: MiniMindForCausalLM):
    """Record the length of every input `model.forward` gets (a view of `recording_forward`)."""
    with recording_forward(model) as calls:
        yield calls.fed_lengths


def prompt_tensor(model: MiniMindForCausalLM, prompt_ids: list[int], new_tokens: int, device) -> torch.Tensor:
    """(1, P) ids on `device`, refused up front if the model cannot embed them or has no room for the answer."""
    too_big = [i for i in prompt_ids if not 0 <= i < model.config.vocab_size]
    if too_big:
        raise ValueError(
            f"prompt holds token id {too_big[0]} but the checkpoint's vocab_size is {model.config.vocab_size}: "
            "tokenizer and checkpoint do not belong together"
        )
    model.check_room(len(prompt_ids), new_tokens)
    return torch.tensor([prompt_ids], device=device)


def greedy_new_ids(model, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> list[int]:
    """Step 1's generation: greedy, every knob off, no eos; the new ids of the (only) row.
    `model` is anything with MiniMind's `generate` (kvlab's engine, or MiniMind's own code)."""
    out = model.generate(prompt, max_new_tokens=new_tokens, use_cache=use_cache, **GREEDY_NO_EOS)
    return out[0, prompt.shape[1]:].tolist()


def greedy_with_and_without_cache(model: MiniMindForCausalLM, prompt_ids: list[int], new_tokens: int, device) -> tuple[dict, dict]:
    """Steps 1 and 2: the same greedy generation twice; returns (same.json, count.json)."""
    prompt = prompt_tensor(model, prompt_ids, new_tokens, device)
    new_ids, fed = {}, {}
    for label, use_cache in MODES:
        with counting_forward(model) as fed_lengths:
            new_ids[label] = greedy_new_ids(model, prompt, new_tokens, use_cache)
        fed[label] = sum(fed_lengths)
    return same_and_count(len(prompt_ids), new_ids, fed)


def same_and_count(prompt_len: int, new_ids: dict, fed: dict) -> tuple[dict, dict]:
    """same.json and count.json from each mode's new ids and tokens fed in all (by MODES label)."""
    same = {
        "same_ids": new_ids["with_cache"] == new_ids["without_cache"],
        "ids": new_ids["with_cache"],
        "prompt_len": prompt_len,
        "new_tokens": len(new_ids["with_cache"]),
    }
    count = {
        "prompt_len": prompt_len,
        "new_tokens": len(new_ids["with_cache"]),
        "fed_with_cache": fed["with_cache"],
        "fed_without_cache": fed["without_cache"],
    }
    return same, count


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


def generation_opened(model: MiniMindForCausalLM, prompt_ids: list[int], new_tokens: int, device) -> dict:
    """Steps 1 and 2's greedy generation in both modes, one entry a step (a call of forward): `fed`, the
    tokens fed; `kv_computed`, the K rows each layer computed (forward hooks on every layer's k_proj and
    v_proj; its V rows are checked to be as many); `cache_tokens`, the tokens each layer's cache holds
    after the step, and `cache_bytes`, what those tensors weigh (none without the cache: MiniMind then
    keeps nothing). Returns {"prompt_len", "new_ids": {mode: ids}, "steps": {mode: [entry, ...]}}:
    same.json and count.json are read from it (`opened_same_and_count`), and the lab's page opens it."""
    prompt = prompt_tensor(model, prompt_ids, new_tokens, device)
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

            with recording_forward(model, observe=observe):
                new_ids[label] = greedy_new_ids(model, prompt, new_tokens, use_cache)
        by_mode[label] = entries
    return {"prompt_len": len(prompt_ids), "new_ids": new_ids, "steps": by_mode}


def opened_same_and_count(opened: dict) -> tuple[dict, dict]:
    """same.json and count.json of a generation opened by `generation_opened`."""
    fed = {label: sum(entry["fed"] for entry in entries) for label, entries in opened["steps"].items()}
    return same_and_count(opened["prompt_len"], opened["new_ids"], fed)


def sync(device) -> None:
    """Wait for the device's queued work (a GPU's; nothing on the CPU), before a clock is read."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def use_threads(threads: int) -> None:
    """PyTorch's CPU threads for what is timed next (the config's timing.threads)."""
    torch.set_num_threads(threads)


def time_generation(model, prompt_ids: list[int], new_tokens: int, warmup: int, repeats: int, max_seconds: float,
                    device) -> tuple[dict, dict]:
    """Step 3: in each mode, `warmup` untimed greedy generations, then `repeats` timed ones and more
    while their spread is unstable, for at most `max_seconds` (kvlab.facts.timing.repeat).

    Returns (time.json: the sheet's three keys, medians and their ratio; time_runs.json: every
    sample, each run's clocks (`usage`: CPU and wall seconds, involuntary context switches, load
    average), each mode's summary with its flags (unstable, contended), the speedup's interval and
    what the timing ran on)."""
    prompt = prompt_tensor(model, prompt_ids, new_tokens, device)
    samples, usage = {}, {}
    for label, use_cache in MODES:
        def run():
            model.generate(prompt, max_new_tokens=new_tokens, use_cache=use_cache, **GREEDY_NO_EOS)
            sync(device)

        for _ in range(warmup):
            run()
        usage[label] = timing.empty_usage()
        samples[label] = timing.repeat(run, repeats, max_seconds, usage=usage[label])
    judged = timing.judged_on(device)
    summary = {label: timing.summary(samples[label], usage[label], judged) for label, _ in MODES}
    speedup = timing.ratio_interval(summary["without_cache"], summary["with_cache"])
    result = {"with_cache_s": summary["with_cache"]["median_s"], "without_cache_s": summary["without_cache"]["median_s"],
              "speedup": speedup["ratio"]}
    runs = {
        "runs_s": samples,
        "usage": usage,
        "summary": summary,
        "speedup": speedup,
        "warmup": warmup,
        "repeats": repeats,
        "max_seconds": max_seconds,
        "new_tokens": new_tokens,
        "prompt_len": len(prompt_ids),
        **timing_context(device),
    }
    return result, runs


def kv_bytes_input(model: MiniMindForCausalLM, tokens: int, seed: int, device) -> torch.Tensor:
    """Step 4's input: `tokens` seeded random ids (1, tokens), none of the first three (special) ids."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (1, tokens), generator=generator).to(device)


def measure_kv_bytes(model: MiniMindForCausalLM, tokens: int, seed: int, device) -> dict:
    """Step 4: feed `tokens` random ids with the cache on and weigh what comes back."""
    ids = kv_bytes_input(model, tokens, seed, device)
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values
    first_k = cache[0][0]
    return {
        "tokens": tokens,
        "measured_bytes": kv_cache_bytes(cache),
        # 2 (K and V) x layers x tokens x KV heads x head_dim x bytes per element
        "formula_bytes": tokens * model.config.kv_bytes_per_token(dtype_name(first_k.dtype)),
        "k_shape": list(first_k.shape),
    }


def answer_text(tokenizer: Tokenizer, new_ids: list[int]) -> str:
    """Decode an answer and cut it before the first eos (<|im_end|>). An answer the token limit cut
    (no eos) may end inside a character, its last bytes never drawn: that character is left out, not
    shown as U+FFFD."""
    text = tokenizer.decode(new_ids)
    if tokenizer.eos_token in text:
        return text.split(tokenizer.eos_token)[0]
    return text.rstrip(BROKEN)


def chat_prompt(tokenizer: Tokenizer, question: str) -> tuple[str, list[int]]:
    """Step 5's prompt: the question as one user turn in chat format, ready for the answer."""
    chat = tokenizer.chat_text([{"role": "user", "content": question}], add_generation_prompt=True)
    return chat, tokenizer.encode(chat)


def sampled_new_ids(model, prompt: torch.Tensor, temperature: float, samples: int, max_new_tokens: int,
                    seed: int, eos_id: int | None) -> torch.Tensor:
    """Step 5's generation at one temperature: reseeded, top-k and top-p off, `samples` rows at once.
    Returns the new ids, (samples, n); rows that finished early are padded with eos.
    `model` is anything with MiniMind's `generate` (kvlab's engine, or MiniMind's own code)."""
    torch.manual_seed(seed)
    out = model.generate(
        prompt, max_new_tokens=max_new_tokens, temperature=temperature, do_sample=True, top_k=0,
        top_p=1.0, num_return_sequences=samples, eos_token_id=eos_id,
    )
    return out[:, prompt.shape[1]:]


def temperature_answers(model, tokenizer: Tokenizer, question: str, temperatures, samples: int,
                        max_new_tokens: int, seed: int, device) -> tuple[dict, dict]:
    """Step 5: for each temperature, reseed and draw `samples` answers. Returns (temp.json, answers)."""
    chat, prompt_ids = chat_prompt(tokenizer, question)
    prompt = prompt_tensor(model, prompt_ids, max_new_tokens, device)
    counts, answers = {}, {}
    for temperature in temperatures:
        rows = sampled_new_ids(model, prompt, temperature, samples, max_new_tokens, seed, tokenizer.eos_id)
        texts = [answer_text(tokenizer, row.tolist()) for row in rows]
        key = str(temperature)
        counts[key] = {"distinct": len(set(texts))}
        answers[key] = texts
    side = {"question": question, "chat_text": chat, "seed": seed, "answers": answers,
            "chat_template": "tokenizer" if tokenizer.has_chat_template else "ChatML fallback"}
    return counts, side


def prefix_ids(tokenizer: Tokenizer, prefix: str) -> list[int]:
    """Step 6's input: [bos] + the prefix, encoded."""
    return [tokenizer.bos_id] + tokenizer.encode(prefix)


def next_token_logits(model, tokenizer: Tokenizer, prefix: str, device) -> torch.Tensor:
    """Logits at the last position after [bos] + prefix, shape (1, vocab)."""
    ids = torch.tensor([prefix_ids(tokenizer, prefix)], device=device)
    with torch.inference_mode():
        return model(ids).logits[:, -1, :].float()


def top_p_survivors(logits: torch.Tensor, ps) -> dict:
    """Step 6: how many tokens `generate` keeps at each p (MiniMind's top-p rule; all of them at p >= 1)."""
    return {str(p): int(top_p_kept(logits, p).sum()) for p in ps}
