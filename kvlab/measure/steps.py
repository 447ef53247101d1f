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
from kvlab.engine.sampling import top_p_keep
from kvlab.engine.tokenizer import Tokenizer
from kvlab.facts import timing
from kvlab.facts.formulas import MODES

# Greedy decoding with every knob off, as the lab sheet asks for steps 1-3.
GREEDY = {**sampling.GREEDY, "eos_token_id": None}


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
    out = model.generate(prompt, max_new_tokens=new_tokens, use_cache=use_cache, **GREEDY)
    return out[0, prompt.shape[1]:].tolist()


def greedy_with_and_without_cache(model: MiniMindForCausalLM, prompt_ids: list[int], new_tokens: int, device) -> tuple[dict, dict]:
    """Steps 1 and 2: the same greedy generation twice; returns (same.json, count.json)."""
    prompt = prompt_tensor(model, prompt_ids, new_tokens, device)
    new_ids = {}
    fed = {}
    for use_cache in (True, False):
        with counting_forward(model) as fed_lengths:
            new_ids[use_cache] = greedy_new_ids(model, prompt, new_tokens, use_cache)
        fed[use_cache] = sum(fed_lengths)
    same = {
        "same_ids": new_ids[True] == new_ids[False],
        "ids": new_ids[True],
        "prompt_len": len(prompt_ids),
        "new_tokens": len(new_ids[True]),
    }
    count = {
        "prompt_len": len(prompt_ids),
        "new_tokens": len(new_ids[True]),
        "fed_with_cache": fed[True],
        "fed_without_cache": fed[False],
    }
    return same, count


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
            model.generate(prompt, max_new_tokens=new_tokens, use_cache=use_cache, **GREEDY)
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


def measure_kv_bytes(model: MiniMindForCausalLM, tokens: int, seed: int, device) -> dict:
    """Step 4: feed `tokens` random ids with the cache on and weigh what comes back."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (1, tokens), generator=generator).to(device)
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
    """Decode an answer and cut it before the first eos (<|im_end|>)."""
    return tokenizer.decode(new_ids).split(tokenizer.eos_token)[0]


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
    """Step 6: how many tokens MiniMind's top-p rule keeps at each p."""
    return {str(p): int(top_p_keep(logits, p).sum()) for p in ps}
