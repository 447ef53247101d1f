"""The serving engine's parts on their own: the block pool's bookkeeping and prefix hashes, paged
attention against MiniMind's Attention, the compiled step's rows and its attention over (row, block)
pairs, the eager step where no compiler is found, and the one-line refusals of a bad configuration
(the import contract that keeps kvlab.serving on the engine alone is one of tests/test_layout.py's)."""
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engine.model import attention
from kvlab.kernels import loader, ops
from kvlab.serving import SamplingParams, ServingConfig, ServingEngine, generate_alone
from kvlab.serving.block_pool import BlockPool, chain_hash, prefix_hashes, zeroed_memory
from kvlab.serving.compiled_step import step_rows
from kvlab.serving.paged_attention import block_attention, block_index, gather_kv, paged_attention, slot_ids

from serving_helpers import GREEDY, one_thread, prompts_of, tiny_model  # noqa: F401


@pytest.fixture(scope="module")
def model():
    return tiny_model(0)


# --- the block pool ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_pools_memory_starts_at_zero_and_is_its_own(dtype):
    """zeroed_memory (the pool's tensors on a CPU): zeros of the shape and dtype asked for, writable,
    each tensor its own memory; on Linux, which maps anonymous memory, it starts on a 2 MiB boundary
    (a huge page's)."""
    first, second = (zeroed_memory((9, 16, 2, 32), dtype, "cpu") for _ in range(2))
    assert first.shape == (9, 16, 2, 32) and first.dtype == dtype and first.is_contiguous()
    assert not first.any() and not second.any()
    first[3] = 1
    assert first.sum().item() == 16 * 2 * 32 and not second.any()
    if sys.platform == "linux":
        assert first.data_ptr() % (2 << 20) == 0


def test_pool_tensors_are_allocated_once_per_layer(model):
    pool = BlockPool(model.config, num_blocks=6, block_size=16, dtype=torch.float32)
    assert len(pool.keys) == len(pool.values) == model.config.num_hidden_layers
    # one block more than it lends: the scratch block the compiled step's padded rows write
    assert pool.keys[0].shape == (7, 16, model.config.num_key_value_heads, model.config.head_dim)
    assert pool.scratch_block == 6 and pool.num_free == 6
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


def test_a_decoding_rows_block_in_short_is_what_append_gives(model):
    """`append_position` (the scheduler's short way for one row decoding) allocates what `append` does
    for the same piece: a block only where the position begins one; with no free block, False and
    nothing taken (the scheduler then goes the long way, which preempts)."""
    from kvlab.serving.block_manager import BlockManager
    from kvlab.serving.request import Request
    from kvlab.serving.request import Piece

    pool = BlockPool(model.config, num_blocks=4, block_size=4, dtype=torch.float32)
    blocks = BlockManager(pool, prefix_caching=False)
    short, long = (Request(i, [1, 2, 3], SamplingParams(max_tokens=9)) for i in range(2))
    for position in range(3, 8):  # 3 lies in the first block, 4 begins the second
        assert blocks.append_position(short, position)
        blocks.append(Piece(long, position, 1, [0]))
        assert len(short.rows[0].block_table) == len(long.rows[0].block_table) == position // 4 + 1
    assert pool.num_free == 0
    assert not blocks.append_position(short, 8) and len(short.rows[0].block_table) == 2
    assert not blocks.can_append(Piece(long, 8, 1, [0]))
    blocks.free(long)
    assert blocks.append_position(short, 8) and len(short.rows[0].block_table) == 3 and pool.num_free == 1


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
    assert "ServingConfig.block_size: 24 does not divide the model's max_position_embeddings (1024)" in message
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


# --- the compiled step's parts -------------------------------------------------------------------


def reference_attention(q, keys, values, tables, positions):
    """Each row alone, by MiniMind's attention (kvlab.engine.model.attention) over its held positions
    gathered through its table."""
    block_size = keys.shape[1]
    out = []
    for row, (table, position) in enumerate(zip(tables, positions)):
        blocks = torch.tensor([table[: position // block_size + 1]])
        held_k, held_v = gather_kv(keys, values, blocks, position + 1)
        n_rep = q.shape[2] // keys.shape[2]
        out.append(attention(q[row:row + 1], held_k, held_v, n_rep, use_flash=False, had_past=position > 0))
    return torch.cat(out)


def test_block_attention_is_minimind_attention_row_by_row():
    """Rows of other requests, positions and scattered tables, the work split into (row, block) pairs:
    each row's output is MiniMind's attention over its own positions, within rounding (compiled, inside
    the whole step, in tests/test_serving_engine.py)."""
    generator = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 12, 4, 2, 8, generator=generator)  # 12 blocks of 4 positions, 2 KV heads
    tables = [[5, 2, 7, 0], [3], [11, 9, 1], [4, 6]]
    positions = [13, 0, 10, 4]
    q = torch.randn(4, 1, 4, 8, generator=generator)  # 4 query heads: 2 per KV head
    rows = step_rows([([1], position, table, True) for position, table in zip(positions, tables)], 4, 8, "cpu")
    assert rows.pair_rows.tolist() == [0, 0, 0, 0, 1, 2, 2, 2, 3, 3]  # each row reads its blocks up to its position
    assert rows.pair_blocks.tolist() == [5, 2, 7, 0, 3, 11, 9, 1, 4, 6]
    assert rows.pair_starts.tolist() == [0, 4, 8, 12, 0, 0, 4, 8, 0, 4]
    assert rows.slots.tolist() == [0 * 4 + 1, 3 * 4 + 0, 1 * 4 + 2, 6 * 4 + 0]  # block x 4 + offset of each position
    longer = [table + [10] if index == 1 else table for index, table in enumerate(tables)]  # a block not read yet
    again = step_rows([([1], position, table, True) for position, table in zip(positions, longer)], 4, 8, "cpu")
    assert all(torch.equal(a, b) for a, b in zip((again.per_row, again.per_pair), (rows.per_row, rows.per_pair)))
    got = block_attention(q, keys, values, torch.tensor(positions), rows.pair_rows, rows.pair_blocks, rows.pair_starts)
    expected = reference_attention(q, keys, values, tables, positions)
    assert torch.allclose(got, expected, atol=1e-6, rtol=1e-5)


@settings(max_examples=40)
@given(data=st.data(), head_dim=st.sampled_from([32, 64, 8, 40]), group=st.sampled_from([2, 4, 3]),
       block_size=st.sampled_from([16, 4, 12]), scale=st.sampled_from([1.0, 6.0]))
def test_the_cpu_kernel_is_minimind_attention_row_by_row(data, head_dim, group, block_size, scale):
    """kvlab::paged_attention (kvlab.kernels, C++: the compiled step's attention on a CPU) against MiniMind's
    attention of each row alone: its vectorised shapes (head_dim 32 and 64) and the loop every other
    shape takes, blocks of 16 (two lanes of eight positions), 12 (eight and a rest) and 4, prompt rows
    that read the same blocks up to their own positions, scores far apart (scale 6: its exponential at
    work far below the largest)."""
    if not loader.usable(torch.empty(0)):
        pytest.skip("no C++ compiler built kvlab.kernels' operators")
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    kv_heads = 2
    pieces, tables, next_block = [], [], 0
    for _ in range(data.draw(st.integers(1, 5))):
        start, fed = data.draw(st.integers(0, 40)), data.draw(st.integers(1, 6))
        table = list(range(next_block, next_block + (start + fed - 1) // block_size + 1))
        next_block += len(table)
        pieces.append(([1] * fed, start, table, True))
        tables += [table] * fed
    keys, values = torch.randn(2, next_block + 1, block_size, kv_heads, head_dim, generator=generator)
    rows = step_rows(pieces, block_size, next_block, "cpu")
    q = torch.randn(len(rows.positions), 1, kv_heads * group, head_dim, generator=generator) * scale
    got = ops.paged_attention(q, keys, values, rows.positions, rows.pair_rows, rows.pair_blocks)
    if len(tables) < len(rows.positions):  # a lone row's partner on the scratch block
        tables.append([next_block])
    expected = reference_attention(q, keys, values, tables, rows.positions.tolist())
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)


def test_a_compiler_that_fails_is_said_once_and_the_step_keeps_block_attention(monkeypatch, tmp_path):
    """Where the compiler cannot build the C++ operators' library (here: one that always fails), `usable`
    says no and warns once, naming the compiler; nothing half-built is left where a later process would
    load it."""
    monkeypatch.setattr(loader, "_LOADED", None)
    monkeypatch.setattr(loader, "find_cpp_compiler", lambda: "false")
    monkeypatch.setattr(loader.tempfile, "gettempdir", lambda: str(tmp_path))
    said_so = r"false could not build or load the library of kvlab's C\+\+ operators"
    with pytest.warns(RuntimeWarning, match=said_so) as said:
        assert not loader.usable(torch.empty(1, 16, 2, 32))
        assert not loader.usable(torch.empty(1, 16, 2, 32))
    assert len(said) == 1
    assert not list(tmp_path.rglob("*.so"))


def test_the_compiled_step_attends_with_the_cpu_kernel(model):
    """On a CPU in float32 with a compiler at hand, the engine's compiled step runs the C++ kernel."""
    engine = ServingEngine(model, ServingConfig(num_blocks=16))
    assert engine.runner.compiled.native == loader.usable(engine.pool.keys[0])
    if loader.find_cpp_compiler():
        assert engine.runner.compiled.native


def test_a_step_of_one_row_is_padded_onto_the_scratch_block():
    """Dynamo compiles sizes 0 and 1 apart: a lone row gets a second on the scratch block, a lone wanted
    logit a second copy, so the one compiled step serves them too."""
    rows = step_rows([([7], 5, [2, 3], True)], 4, 9, "cpu")
    assert rows.token_ids.tolist() == [7, 0] and rows.positions.tolist() == [5, 0]
    assert rows.slots.tolist() == [3 * 4 + 1, 9 * 4] and rows.logit_rows.tolist() == [0, 1]
    assert rows.pair_blocks.tolist() == [2, 3, 9]  # the scratch row reads the scratch block only


def test_without_a_compiler_the_engine_says_so_once_and_runs_the_same_step_eagerly(model, monkeypatch):
    from kvlab.serving.compiled_step import NO_COMPILER

    monkeypatch.setattr(loader, "find_cpp_compiler", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = ServingEngine(model, ServingConfig(num_blocks=16))
        engine.add_request(prompts_of([9])[0], SamplingParams(max_tokens=5, eos_token_id=None, **GREEDY))
        result = engine.run()
    lines = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert lines == [NO_COMPILER] and "\n" not in lines[0]
    assert not engine.compiled and engine.warm_up() == 0.0
    assert result.outputs[0].samples == [generate_alone(model, prompts_of([9])[0], SamplingParams(
        max_tokens=5, eos_token_id=None, **GREEDY))][0]


def test_the_steps_products_follow_the_weights_when_they_change():
    """The compiled step's products read the packed weights' panels (kvlab.kernels' kvlab::linear),
    laid out again with every copy: weights changed in place between two runs of one engine (a
    training step, a load_state_dict) are packed and laid out again, and every token of the second run
    is `generate`'s with the new weights. The four requests decode together: 4 rows, the operator's
    own product (an LM head of 1,100 outputs: 34 panels and a part)."""

    from helpers import random_model

    model = random_model(3, vocab_size=1100, hidden_size=64, num_hidden_layers=2)
    engine = ServingEngine(model, ServingConfig(num_blocks=64))
    prompts = prompts_of([9, 12, 7, 15], seed=5)
    params = SamplingParams(max_tokens=6, eos_token_id=None, **GREEDY)
    served = []
    for change in range(2):
        if change:
            with torch.no_grad():
                model.load_state_dict(random_model(4, vocab_size=1100, hidden_size=64, num_hidden_layers=2).state_dict())
        ids = [engine.add_request(prompt, params) for prompt in prompts]
        outputs = {output.request_id: output for output in engine.run().outputs}
        served.append([outputs[i].samples for i in ids])
        assert served[-1] == [generate_alone(model, prompt, params) for prompt in prompts]
    assert served[0] != served[1]  # the weights did change what is served


def test_the_product_operator_is_f_linear_and_a_function_of_its_inputs():
    """kvlab::linear against F.linear: MKL's very product below 4 rows; its own from 4 rows on, within
    a float's rounding, for whole tiles of rows and the rest (8 rows a tile, 32 or 16 outputs a panel:
    1,100 outputs leave part of a panel). It keeps nothing between calls: the panels are an input, so
    stale panels give the old weight's product, new ones the new (the packed weights lay them out anew
    with each copy), panels of another weight's shape are refused, and none at all is MKL's product."""
    if not loader.usable(torch.empty(1, 16, 2, 32)):
        pytest.skip("no C++ compiler built kvlab.kernels' operators")
    generator = torch.Generator().manual_seed(0)
    buffer = torch.randn(3 * 1100 * 40, generator=generator)
    weight = buffer[1100 * 40:2 * 1100 * 40].view(1100, 40)  # a view inside a larger buffer, as packed weights
    panels = ops.linear_panels(weight)
    assert panels.numel() == ops.panel_size(1100, 40, ops.panel_width())
    for rows in (1, 2, 3, 4, 8, 13, 37, 300):
        x = torch.randn(rows, 1, 40, generator=generator)
        got = ops.linear(x, weight, panels)
        assert got.shape == (rows, 1, 1100)
        if rows < 4 or not ops.panel_width():
            assert torch.equal(got, torch.nn.functional.linear(x, weight))
        else:
            assert torch.allclose(got, torch.nn.functional.linear(x, weight), rtol=1e-5, atol=1e-5)
    x = torch.randn(8, 40, generator=generator)
    before = torch.nn.functional.linear(x, weight)
    with torch.no_grad():
        weight.mul_(-2.0)
    after = torch.nn.functional.linear(x, weight)
    if ops.panel_width():
        assert torch.allclose(ops.linear(x, weight, panels), before, rtol=1e-5, atol=1e-5)  # the panels it was given
        with pytest.raises(RuntimeError, match="not kvlab::linear_panels' layout"):
            ops.linear(x, weight, panels[:-1])
    assert torch.allclose(ops.linear(x, weight, ops.linear_panels(weight)), after, rtol=1e-5, atol=1e-5)
    assert torch.equal(ops.linear(x, weight, torch.empty(0)), x @ weight.t())
