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


# --- the rule and its section --------------------------------------------------------------------------

def test_the_builds_kv_dtype_csv_holds_its_numbers_against_the_formula_and_generate(course_build):
    """The shared build's results/kv_dtype.csv: a row per dtype, float32 first and unchanged; every cache
    weighed equals the formula; fewer bytes buy more blocks from the same pool; every served request
    equals generate alone with its cache in the same dtype; the section and its figure are in beyond.md."""
    from kvlab.io import read_csv_rows

    results = course_build / "results"
    rows = read_csv_rows(results / "kv_dtype.csv")
    assert [row["kv_dtype"] for row in rows] == list(KV_DTYPES)
    base = rows[0]
    assert all(base[key] for key in base if key.startswith("same_")) and base["max_kl"] == 0
    assert all(row["bytes_measured"] == row["bytes_formula"] == row["tokens"] * row["bytes_per_token"] for row in rows)
    by_bytes = sorted(rows, key=lambda row: row["bytes_per_token"])
    assert [row["pool_blocks"] for row in by_bytes] == sorted((row["pool_blocks"] for row in rows), reverse=True)
    assert all(row["mismatches"] == 0 and row["checked"] > 0 for row in rows)
    assert all(row["fits_lab"] >= base["fits_lab"] for row in rows)
    beyond = (results / "beyond.md").read_text(encoding="utf-8")
    assert "## 더 적은 비트의 캐시" in beyond and "figures/kv_dtype.png" in beyond
    assert (results / "figures" / "kv_dtype.png").stat().st_size > 0


def section_rows(int8_speed, int8_first_diff=None, bf16_first_diff=None):
    """Two-N rows as kv_dtype.csv holds them, float32 at 100 tokens/s (90-110)."""
    def row(name, per_token, speed, first):
        low, value, high = speed
        return {"kv_dtype": name, "bytes_per_token": per_token, "tokens": 10, "bytes_formula": 10 * per_token,
                "bytes_measured": 10 * per_token, "budget_gib": 1, "lab_context": 100, "fits_lab": 2 ** 30 // (per_token * 100),
                "minimind": "MiniMind", "minimind_context": 2048, "fits_minimind": 2 ** 30 // (per_token * 2048),
                "same_4": first is None or first >= 4, "first_diff_4": first if first is not None and first < 4 else None,
                "same_16": first is None, "first_diff_16": first, "max_kl": 0.0 if first is None else 1e-3,
                "pool_blocks": 2048 // per_token, "pool_bytes": 65536, "peak_running": 2048 // per_token, "steps": 10,
                "preemptions": 0, "tokens_per_s": value, "tokens_per_s_low": low, "tokens_per_s_high": high,
                "iqr_share": 0.05, "unstable": False, "mismatches": 0, "checked": 5}
    return [row("float32", 2048, (90, 100, 110), None), row("float16", 1024, (90, 100, 110), None),
            row("bfloat16", 1024, (90, 100, 110), bf16_first_diff), row("int8", 576, int8_speed, int8_first_diff)]


@pytest.mark.parametrize("speed, verdict", [((120, 130, 140), "above"), ((60, 70, 80), "below"),
                                            ((100, 105, 115), "overlap")])
@pytest.mark.parametrize("first", [None, 9])
def test_the_sections_sentences_follow_the_numbers(speed, verdict, first):
    """Which dtype is smallest, whether its tokens changed and where, which changed soonest, and whether its
    throughput rose, fell or could not be told from float32's: chosen from the rows, each way."""
    from kvlab.present.precision import kv_dtype_section

    section = kv_dtype_section({"kv_dtype": section_rows(speed, first, bf16_first_diff=5 if first else None)})["kv_dtype"]
    assert section["smallest"]["kv_dtype"] == "int8" and section["longest"] == 16
    assert section["smallest"]["fits_gain"] == pytest.approx(section_rows(speed)[3]["fits_lab"] / section_rows(speed)[0]["fits_lab"])
    assert section["smallest"]["against_float32"] == verdict
    assert section["smallest"]["first_diff"] == first
    assert (section["earliest"] is None) == (first is None)
    if first is not None:
        assert section["earliest"]["kv_dtype"] == "bfloat16" and section["earliest"]["first_diff"] == 5


@pytest.mark.parametrize("arch", [dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
                                  dict(hidden_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4)])
def test_the_traces_pool_holds_the_same_float32_tokens_whatever_the_models_size(arch):
    """The pool is the bytes of pool_tokens float32 tokens of the model's own cache: at the lab's size and at
    MiniMind's the same blocks in float32, and each smaller dtype as many more as its bytes per token allow."""
    from kvlab.measure.kv_dtype import pool_config

    model = MiniMindForCausalLM(MiniMindConfig(vocab_size=64, **arch))
    blocks = {d: pool_config(model, d, 256, 16, 512, 24).num_blocks for d in KV_DTYPES}
    assert blocks["float32"] == 256 // 16 and blocks["float16"] == blocks["bfloat16"] == 2 * blocks["float32"]
    per_token = {d: model.config.kv_bytes_per_token(d) for d in KV_DTYPES}
    assert blocks["int8"] == 256 * per_token["float32"] // (16 * per_token["int8"]) > blocks["float16"]
