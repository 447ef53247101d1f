"""Builders shared by the serving engine's tests: a tiny model, prompts, each request generated alone
by MiniMind's `generate`, a trace served, and the engine's pool checked empty afterwards."""
from __future__ import annotations

import pytest
import torch

from kvlab.engine.sampling import GREEDY  # noqa: F401 (the serving tests' greedy knobs)
from kvlab.serving import ServingConfig, ServingEngine, generate_alone

from helpers import random_model

@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One thread for a serving test module (import it there): on a shared 2-core machine two OpenMP
    threads spin against each other, eight times slower; the comparisons with `generate` hold at any
    thread count, as both run at the same one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


VOCAB = 300


def tiny_model(seed: int = 0, **arch):
    """A random MiniMind small enough that a trace is served in a fraction of a second."""
    return random_model(seed, vocab_size=VOCAB, **{"hidden_size": 64, "num_hidden_layers": 2, **arch})


def prompts_of(lengths, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


alone = generate_alone  # what `generate` gives the prompt alone: the contract every test checks


def serve(model, config: ServingConfig, requests, on_draw=None):
    """requests: (prompt, params, arrival_step) each. Returns (result, engine)."""
    engine = ServingEngine(model, config, on_draw=on_draw)
    for prompt, params, arrival in requests:
        engine.add_request(prompt, params, arrival_step=arrival)
    return engine.run(), engine


def mismatches(model, result, requests, kv_dtype: str = "float32") -> list[int]:
    """The requests whose samples differ from `generate` alone (its cache in `kv_dtype`, the engine's):
    counted, not assumed away."""
    return [index for index, (output, (prompt, params, _)) in enumerate(zip(result.outputs, requests))
            if output.samples != alone(model, prompt, params, kv_dtype=kv_dtype)]


def assert_pool_empty(engine) -> None:
    """Every block free again, no reference left, every queue empty."""
    assert engine.pool.num_free == engine.pool.num_blocks
    assert all(block.ref_count == 0 for block in engine.pool.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting
