"""Drawn traces: whatever the requests, arrivals, pool, budget, policy and way (compiled or eager),
every request gets what `generate` gives it alone, and the pool ends empty."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.serving import SamplingParams, ServingConfig

from serving_helpers import GREEDY, assert_pool_empty, mismatches, one_thread, serve, tiny_model  # noqa: F401

MODEL = tiny_model(1)  # the serving tests' one architecture: its step compiled once a session
SHARED = list(range(10, 42))  # a 32-token prefix some prompts start with (two blocks of 16)


@st.composite
def requests(draw):
    """(prompt, params, arrival) for 1 to 4 requests."""
    drawn = []
    for _ in range(draw(st.integers(1, 4))):
        tail = draw(st.lists(st.integers(3, 299), min_size=1, max_size=30))
        prompt = SHARED + tail if draw(st.booleans()) else tail
        n = draw(st.sampled_from([1, 1, 2]))
        if draw(st.booleans()):
            knobs = GREEDY
        else:
            knobs = dict(temperature=draw(st.sampled_from([0.6, 1.0, 1.8])),
                         top_p=draw(st.sampled_from([0.5, 0.9, 1.0])), top_k=draw(st.sampled_from([0, 10])),
                         seed=draw(st.integers(0, 1000)))
        eos = draw(st.sampled_from([None, None, 3, 5]))  # tokens 3..5 are drawn now and then
        params = SamplingParams(max_tokens=draw(st.integers(1, 10)), eos_token_id=eos, n=n, **knobs)
        drawn.append((prompt, params, draw(st.integers(0, 6))))
    return drawn


def blocks_for(prompt, params):
    """The most blocks the request holds (ServingConfig's rule, the one home of that arithmetic)."""
    return ServingConfig(block_size=16).blocks_for(len(prompt), params.max_tokens, params.n)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=requests(), spare_blocks=st.integers(0, 6), budget=st.sampled_from([16, 24, 64, 128]),
       chunked=st.booleans(), policy=st.sampled_from(["continuous", "static"]),
       matmuls=st.sampled_from(["per_request", "per_request", "fused"]), compile=st.booleans())
def test_every_request_equals_generate_alone_and_the_pool_ends_empty(trace, spare_blocks, budget, chunked, policy,
                                                                    matmuls, compile):
    longest_prompt = max(len(prompt) for prompt, _, _ in trace)
    if not chunked and longest_prompt > budget:
        budget = longest_prompt  # without chunking a prompt must fit a step (refused otherwise: test_serving_parts)
    config = ServingConfig(num_blocks=max(blocks_for(p, params) for p, params, _ in trace) + spare_blocks,
                           max_num_seqs=4, max_num_batched_tokens=budget, chunked_prefill=chunked, policy=policy,
                           matmuls=matmuls, compile=compile)
    result, engine = serve(MODEL, config, trace)
    assert mismatches(MODEL, result, trace) == []
    assert_pool_empty(engine)
    assert result.stats.peak_blocks_in_use <= config.num_blocks
    assert all(s.prefill_tokens + s.decode_tokens <= budget for s in result.stats.steps)


@pytest.mark.parametrize("policy", ["continuous", "static"])
def test_the_tightest_pool_still_serves_a_trace(policy):
    """A pool just big enough for the largest request: preemption does the rest."""
    trace = [(SHARED + [7] * k, SamplingParams(max_tokens=12, eos_token_id=None, **GREEDY), 0) for k in (1, 9, 17, 30)]
    config = ServingConfig(num_blocks=max(blocks_for(p, params) for p, params, _ in trace), max_num_seqs=4,
                           policy=policy)
    result, engine = serve(MODEL, config, trace)
    assert mismatches(MODEL, result, trace) == []
    assert_pool_empty(engine)
    if policy == "continuous":
        assert result.stats.preemptions > 0


@settings(max_examples=300, deadline=None)
@given(prompt_len=st.integers(1, 300), n=st.integers(1, 4), num_blocks=st.integers(1, 80),
       block_size=st.sampled_from([1, 4, 16]))
def test_the_pool_room_is_request_blocks_solved_for_max_tokens(prompt_len, n, num_blocks, block_size):
    """kvlab serve's default max_tokens (the pool's room) is the most the engine admits, and one more
    does not fit: the pool arithmetic's one home, kvlab.facts.formulas, both ways."""
    config = ServingConfig(num_blocks=num_blocks, block_size=block_size)
    room = config.room(prompt_len, n)
    if room >= 1:
        assert config.blocks_for(prompt_len, room, n) <= num_blocks
    assert config.blocks_for(prompt_len, max(room, 0) + 1, n) > num_blocks  # one more token does not fit
