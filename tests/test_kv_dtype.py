"""The cache in fewer bits (kvlab.engine.kv_dtype): its bytes are the formula's for every dtype and
shape, float32 changes nothing, int8 reads back within its documented error, and the serving engine
whose pool stores a dtype serves every request as `generate` alone with its cache in the same."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from kvlab.engine.config import MiniMindConfig
from kvlab.engine.kv_dtype import INT8_LEVELS, KV_DTYPES, StoredCache, load, store
from kvlab.engine.model import MiniMindForCausalLM, kv_cache_bytes
from kvlab.engine.sampling import GREEDY
from kvlab.serving import SamplingParams, ServingConfig

from serving_helpers import assert_pool_empty, mismatches, one_thread, prompts_of, serve, tiny_model  # noqa: F401

LOW = [name for name in KV_DTYPES if name != "float32"]


@settings(max_examples=25, deadline=None)
@given(kv_dtype=st.sampled_from(KV_DTYPES), layers=st.integers(1, 3), kv_heads=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 2]), head_dim=st.sampled_from([8, 16, 24]), tokens=st.integers(1, 40),
       batch=st.integers(1, 2))
def test_the_bytes_a_cache_holds_are_the_formulas_for_every_dtype_and_shape(kv_dtype, layers, kv_heads, group,
                                                                            head_dim, tokens, batch):
    config = MiniMindConfig(hidden_size=head_dim * kv_heads * group, num_attention_heads=kv_heads * group,
                            num_key_value_heads=kv_heads, num_hidden_layers=layers, vocab_size=50,
                            max_position_embeddings=64)
    torch.manual_seed(0)
    model = MiniMindForCausalLM(config).eval()
    cache = StoredCache(layers, kv_dtype) if kv_dtype != "float32" else None
    with torch.inference_mode():
        out = model(torch.randint(0, 50, (batch, tokens)), past_key_values=cache, use_cache=True)
    assert kv_cache_bytes(out.past_key_values) == batch * tokens * config.kv_bytes_per_token(kv_dtype)


def test_float32_is_todays_cache_bit_for_bit():
    """The default makes no round trip: the same tensors MiniMind's cache holds, the same tokens."""
    model = tiny_model(0)
    prompt = torch.tensor([prompts_of([30])[0]])
    knobs = dict(max_new_tokens=24, eos_token_id=None, **GREEDY)
    assert torch.equal(model.generate(prompt, **knobs), model.generate(prompt, kv_dtype="float32", **knobs))
    x = torch.randn(2, 5, 2, 16)
    values, scale = store(x, "float32")
    assert values is x and scale is None


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(1e-3, 1e3), head_dim=st.sampled_from([4, 32, 96]))
def test_int8_reads_back_within_half_a_step_of_its_scale(seed, scale, head_dim):
    """|x - load(store(x))| <= max|x| / 127 / 2 per token and head (the module's bound), zeros exact."""
    x = torch.randn(3, 7, 2, head_dim, generator=torch.Generator().manual_seed(seed)) * scale
    x[0, 0, 0] = 0.0
    values, scales = store(x, "int8")
    assert values.dtype == torch.int8 and scales.shape == (3, 7, 2, 1)
    back = load(values, scales, torch.float32)
    bound = x.abs().amax(-1, keepdim=True) / INT8_LEVELS / 2
    assert bool(((back - x).abs() <= bound * (1 + 1e-5) + 1e-30).all())
    assert bool((back[0, 0, 0] == 0).all())


@pytest.mark.parametrize("kv_dtype", LOW)
def test_a_cache_stored_in_pieces_holds_what_one_write_holds(kv_dtype):
    """A prompt written at once or a token at a time stores the same bytes (the engine writes in pieces)."""
    x = torch.randn(1, 12, 2, 16)
    whole = store(x, kv_dtype)
    pieces = [store(x[:, i:i + 1], kv_dtype) for i in range(12)]
    assert torch.equal(whole[0], torch.cat([p[0] for p in pieces], dim=1))
    if whole[1] is not None:
        assert torch.equal(whole[1], torch.cat([p[1] for p in pieces], dim=1))


def test_kv_dtype_is_refused_where_no_cache_keeps_it():
    model = tiny_model(0)
    prompt = torch.tensor([prompts_of([5])[0]])
    with pytest.raises(ValueError, match="kv_dtype must be one of"):
        model.generate(prompt, max_new_tokens=2, kv_dtype="int4")
    with pytest.raises(ValueError, match="needs use_cache=True"):
        model.generate(prompt, max_new_tokens=2, kv_dtype="int8", use_cache=False)
    with pytest.raises(ValueError, match="compile=False"):
        ServingConfig(kv_dtype="int8")
    with pytest.raises(ValueError, match="ServingConfig.kv_dtype must be one of"):
        ServingConfig(kv_dtype="fp8", compile=False)


@pytest.mark.parametrize("kv_dtype", LOW)
def test_the_engine_serves_each_dtype_as_generate_alone_with_the_same(kv_dtype):
    """Greedy and seeded requests, staggered, through a pool tight enough to preempt and with a shared
    prefix: every request's tokens equal generate's with its cache in the same dtype; the pool's bytes
    are the formula's."""
    model = tiny_model(0)
    shared = prompts_of([36], seed=4)[0]
    prompts = [shared + tail for tail in prompts_of((1, 5, 12, 20), seed=5)] + prompts_of((7, 30), seed=6)
    params = [SamplingParams(max_tokens=20, eos_token_id=None, **GREEDY) if i % 2 else
              SamplingParams(max_tokens=20, eos_token_id=None, seed=50 + i, do_sample=True, temperature=0.9,
                             top_p=0.9, top_k=0) for i in range(len(prompts))]
    requests = [(prompt, knobs, 2 * i) for i, (prompt, knobs) in enumerate(zip(prompts, params))]
    config = ServingConfig(num_blocks=12, block_size=8, max_num_seqs=4, compile=False, kv_dtype=kv_dtype)
    result, engine = serve(model, config, requests)
    assert result.stats.preemptions > 0 and result.stats.prefix_hit_blocks > 0
    assert mismatches(model, result, requests, kv_dtype) == []
    assert engine.pool.nbytes() == 12 * 8 * model.config.kv_bytes_per_token(kv_dtype)
    assert_pool_empty(engine)


def test_fewer_bits_change_the_tokens_somewhere_and_float32_never():
    """Not exact: on a random model the int8 cache's tokens drift from float32's within 200 steps, while
    the engine and generate agree on whatever each dtype gives (the test above)."""
    model = tiny_model(3)
    prompt = torch.tensor([prompts_of([20], seed=9)[0]])
    knobs = dict(max_new_tokens=200, eos_token_id=None, **GREEDY)
    base = model.generate(prompt, **knobs)
    assert not torch.equal(base, model.generate(prompt, kv_dtype="int8", **knobs))
