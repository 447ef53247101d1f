"""The serving engine's parts on their own: the block pool's bookkeeping and prefix hashes, paged
attention against MiniMind's Attention and the one-line refusals of a bad configuration (the import
contract that keeps kvlab.serving on the engine alone is one of tests/test_layout.py's)."""
import pytest
import torch

from kvlab.serving import SamplingParams, ServingConfig, ServingEngine
from kvlab.serving.block_pool import BlockPool, chain_hash, prefix_hashes
from kvlab.serving.paged_attention import block_index, paged_attention, slot_ids

from serving_helpers import GREEDY, one_thread, prompts_of, tiny_model  # noqa: F401


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


# --- the block pool ----------------------------------------------------------------------------


def test_pool_tensors_are_allocated_once_per_layer(model):
    pool = BlockPool(model.config, num_blocks=6, block_size=16, dtype=torch.float32)
    assert len(pool.keys) == len(pool.values) == model.config.num_hidden_layers
    assert pool.keys[0].shape == (6, 16, model.config.num_key_value_heads, model.config.head_dim)
    assert pool.nbytes() == 6 * 16 * model.config.kv_bytes_per_token("float32")


def test_free_list_and_reference_counts(model):
    pool = BlockPool(model.config, num_blocks=3, block_size=4, dtype=torch.float32)
    first, second = pool.allocate(), pool.allocate()
    assert (first, second, pool.num_free) == (0, 1, 1)
    pool.hold(first)  # a second table holds it
    pool.release(first)
    assert pool.blocks[first].ref_count == 1 and pool.num_used == 2
    pool.release(first)
    assert pool.num_free == 2 and list(pool.free) == [2, 0]  # freed last, taken last
    with pytest.raises(RuntimeError, match="released more often than held"):
        pool.release(first)
    pool.release(second)
    assert [pool.allocate() for _ in range(3)] == [2, 0, 1]
    with pytest.raises(RuntimeError, match="no free block"):
        pool.allocate()


def test_prefix_cache_survives_freeing_until_the_block_is_taken_again(model):
    pool = BlockPool(model.config, num_blocks=2, block_size=4, dtype=torch.float32)
    tokens = [5, 6, 7, 8]
    block = pool.allocate()
    pool.register(block, chain_hash(None, tokens), tokens)
    pool.release(block)
    assert pool.lookup(chain_hash(None, tokens), tokens) == block  # freed, still cached
    assert pool.lookup(chain_hash(None, tokens), [5, 6, 7, 9]) is None  # the tokens are checked too
    pool.hold(block)  # a hit takes it off the free list
    assert pool.num_free == 1
    pool.release(block)
    pool.allocate(), pool.allocate()  # the other free block, then this one: its cache entry goes
    assert pool.lookup(chain_hash(None, tokens), tokens) is None and not pool.cached


def test_hashes_chain_over_every_token_before():
    a = prefix_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = prefix_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and len(b) == 2  # full blocks only
    assert a[1] != b[1]  # the same second block after another first one
    assert a == prefix_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)


# --- paged attention against MiniMind's Attention ----------------------------------------------


@pytest.mark.parametrize("flash", [True, False])
def test_paged_attention_gives_the_attention_bits_of_minimind(model, flash):
    """A prefill of 21 positions, then one decode step, through blocks of 8 scattered in the pool."""
    attn = model.model.layers[0].self_attn
    attn.use_flash = flash
    try:
        pool = BlockPool(model.config, num_blocks=8, block_size=8, dtype=torch.float32)
        table = [[5, 2, 7, 0]]
        cos, sin = model.model.freqs_cos, model.model.freqs_sin
        x = torch.randn(1, 22, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            prefill, present = attn(x[:, :21], cos[:21], sin[:21], use_cache=True)
            decode, _ = attn(x[:, 21:], cos[21:22], sin[21:22], past_kv=present, use_cache=True)
            for start, end, expected in ((0, 21, prefill), (21, 22, decode)):
                part = x[:, start:end]
                mixed = paged_attention(attn, attn.q_proj(part), attn.k_proj(part), attn.v_proj(part), cos[start:end],
                                        sin[start:end], pool.keys[0], pool.values[0], start,
                                        slot_ids(table, start, end, 8), block_index(table, end, 8))
                assert torch.equal(attn.o_proj(mixed), expected)
        assert torch.equal(pool.keys[0][5], present[0][0, :8])  # the first 8 positions live in block 5
    finally:
        attn.use_flash = True


# --- refusals: one line, naming the knob -------------------------------------------------------


def refusal(call) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_bad_configuration_is_refused_in_one_line_naming_the_knob(model):
    assert "ServingConfig.block_size" in refusal(lambda: ServingConfig(block_size=0))
    assert "ServingConfig.num_blocks" in refusal(lambda: ServingConfig(num_blocks=-1))
    assert "ServingConfig.policy" in refusal(lambda: ServingConfig(policy="fifo"))
    assert "ServingConfig.matmuls" in refusal(lambda: ServingConfig(matmuls="batched"))
    message = refusal(lambda: ServingEngine(model, ServingConfig(block_size=24)))
    assert "block_size (24) must divide the model's max_position_embeddings (1024)" in message
    assert "SamplingParams.max_tokens" in refusal(lambda: SamplingParams(max_tokens=0))
    assert "SamplingParams.n" in refusal(lambda: SamplingParams(n=0))
    assert "temperature must be > 0" in refusal(lambda: SamplingParams(temperature=0.0))


def test_a_request_the_engine_could_never_serve_is_refused_before_any_work(model):
    prompt = prompts_of([40])[0]

    def add(config, params=SamplingParams(max_tokens=10, **GREEDY), tokens=prompt):
        return lambda: ServingEngine(model, config).add_request(tokens, params)

    message = refusal(add(ServingConfig(num_blocks=3)))
    assert "ServingConfig.num_blocks (3) is too small: this request needs up to 4 blocks" in message
    message = refusal(add(ServingConfig(max_num_batched_tokens=32)))
    assert "ServingConfig.max_num_batched_tokens (32) fits nothing: a 40-token prompt" in message
    chunked = ServingConfig(max_num_batched_tokens=32, chunked_prefill=True)
    ServingEngine(model, chunked).add_request(prompt)  # chunked, the same prompt is fine
    assert "ServingConfig.max_num_batched_tokens (2) fits nothing: decoding this request feeds n = 3" in refusal(
        add(ServingConfig(max_num_batched_tokens=2, chunked_prefill=True), SamplingParams(n=3)))
    assert "ServingConfig.max_num_seqs (2) is smaller than this request's n (3)" in refusal(
        add(ServingConfig(max_num_seqs=2), SamplingParams(n=3)))
    assert "max_position_embeddings (1024)" in refusal(add(ServingConfig(), SamplingParams(max_tokens=1000)))
    assert "prompt: token ids must lie in 0 .. 299" in refusal(add(ServingConfig(), tokens=[5, 300]))
    assert "prompt: a request needs at least one token" in refusal(add(ServingConfig(), tokens=[]))
