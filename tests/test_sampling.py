"""MiniMind's sampling rules, top-p against a brute-force reference (ties included)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.engine import sampling
from kvlab.engine.sampling import top_p_keep
from kvlab.kernels import loader, ops


def brute_force_survivors(probs: list[float], p: float) -> int:
    """Walk the tokens from most to least likely; keep a token while the mass before it is <= p."""
    kept, mass_before = 0, 0.0
    for prob in sorted(probs, reverse=True):
        if kept > 0 and mass_before > p:
            break
        kept += 1
        mass_before += prob
    return kept


def test_four_ties_at_a_quarter_keep_three_at_half():
    logits = torch.zeros(1, 4)
    assert int(top_p_keep(logits, 0.5).sum()) == 3


@pytest.mark.parametrize("p", [0.01, 0.25, 0.5, 0.74, 0.75, 0.9, 0.99, 1.0])
def test_ties_match_brute_force(p):
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.25, 0.125, 0.125]]))
    probs = torch.softmax(logits, -1)[0].tolist()
    assert int(top_p_keep(logits, p).sum()) == brute_force_survivors(probs, p)


@pytest.mark.parametrize("seed", range(20))
def test_random_logits_match_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 50, generator=gen) * (1 + seed % 4)
    for p in (0.1, 0.5, 0.9, 0.99):
        mask = top_p_keep(logits, p)
        for row in range(3):
            probs = torch.softmax(logits[row], -1)
            expected = brute_force_survivors(probs.tolist(), p)
            assert int(mask[row].sum()) == expected
            # the survivors are the most likely tokens
            kept_min = probs[mask[row]].min()
            assert torch.all(probs[~mask[row]] <= kept_min)


def test_top_token_always_survives():
    logits = torch.tensor([[10.0, 0.0, 0.0]])  # top-1 alone holds > 0.99
    mask = top_p_keep(logits, 0.01)
    assert mask.tolist() == [[True, False, False]]


def test_top_p_filter_sets_cut_tokens_to_minus_inf_and_one_is_noop():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    out = sampling.top_p_filter(logits, 0.6)
    assert math.isinf(out[0, -1]) and out[0, 0] == 3.0
    assert torch.equal(sampling.top_p_filter(logits, 1.0), logits)


def test_top_k_keeps_k_largest():
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0]])
    out = sampling.top_k_filter(logits, 2)
    assert torch.isinf(out).tolist() == [[True, False, True, False]]
    assert torch.equal(sampling.top_k_filter(logits, 0), logits)


def test_repetition_penalty_is_sign_aware_and_only_for_seen_ids():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    seen = torch.tensor([[0, 1, 1]])
    out = sampling.apply_repetition_penalty(logits, seen, 2.0)
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0]]


def test_temperature_divides_and_refuses_zero_when_sampling():
    logits = torch.tensor([[2.0, 4.0]])
    assert sampling.apply_temperature(logits, 0.5, do_sample=True).tolist() == [[4.0, 8.0]]
    with pytest.raises(ValueError):
        sampling.apply_temperature(logits, 0.0, do_sample=True)
    assert torch.equal(sampling.apply_temperature(logits, 0.0, do_sample=False), logits)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5), st.integers(1, 40), st.sampled_from([torch.float32, torch.float64]), st.data())
def test_the_greedy_pick_is_torch_argmax_with_ties_infinities_and_nan(rows, vocab, dtype, data):
    """The greedy pick (NumPy's argmax on a CPU) is torch.argmax's index in every row: ties (few distinct
    values), -inf and +inf, NaN, a row all -inf; also on a strided view (every other column)."""
    values = st.sampled_from([0.0, 1.0, -1.0, 2.5, float("inf"), float("-inf"), float("nan")])
    logits = torch.tensor(data.draw(st.lists(st.lists(values | st.floats(-1e6, 1e6, width=32), min_size=2 * vocab,
                                                      max_size=2 * vocab), min_size=rows, max_size=rows)), dtype=dtype)
    for chosen in (logits, logits[:, ::2]):
        picked = sampling.draw_or_argmax(chosen, do_sample=False)
        assert picked.dtype == torch.int64 and picked.shape == (rows, 1)
        assert torch.equal(picked, torch.argmax(chosen, dim=-1, keepdim=True)), chosen


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(2, 40), st.sampled_from([torch.float32, torch.float64]), st.data())
def test_the_greedy_choice_is_next_tokens_at_each_rows_temperature(rows, vocab, dtype, data):
    """`greedy_pick_rows` (the serving engine's pick for plain greedy requests, rows of other temperatures
    in one call) against `next_token` row by row under the same knobs: logits a last bit apart, which a
    temperature's division can make equal (then the first wins), ties, infinities, NaN. A choice that
    multiplied by 1 / temperature, skipped the division or took the last of equals fails here; so does
    `greedy_pick`, the same rule in torch that the compiled steps make, and kvlab::greedy_pick, the
    serving step's in C++ (which divides only the logits near the largest: 3e38 over a temperature
    below 1 overflows to infinity, a rounding tie it must find)."""
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16)))
    logits = (torch.randn(rows, vocab, generator=generator) * 4).to(dtype)
    for row in range(rows):  # the largest and the float just above it, the larger placed first or after
        top, at = logits[row].max(), data.draw(st.integers(0, vocab - 1))
        logits[row, at] = torch.nextafter(top, torch.tensor(float("inf"), dtype=dtype))
        if at > 0 and data.draw(st.booleans()):
            logits[row, at - 1] = logits[row, at] if data.draw(st.booleans()) else top
    special = data.draw(st.sampled_from([None, float("inf"), float("-inf"), float("nan"), 3e38]))
    if special is not None:
        logits[0, data.draw(st.integers(0, vocab - 1))] = special
    temperatures = data.draw(st.lists(st.sampled_from([0.85, 0.7, 1.3, 1.0, 0.1, 2.0]), min_size=rows, max_size=rows))
    expected = []
    for row, temperature in zip(logits, temperatures):
        knobs = dict(temperature=temperature, top_k=0, top_p=1.0, repetition_penalty=1.0, do_sample=False)
        assert sampling.is_greedy(**knobs)
        expected.append(int(sampling.pick(row[None], None, **knobs)[0, 0]))
    assert sampling.greedy_pick_rows(logits, temperatures) == expected
    strided = torch.stack([logits, logits], dim=-1)[..., 0]  # the same values, a view with a stride of 2
    assert sampling.greedy_pick_rows(strided, temperatures) == expected
    # the compiled steps' rule, in torch (the serving step's per row, generate's fast step's for all rows)
    assert sampling.greedy_pick(logits, torch.tensor(temperatures, dtype=dtype)[:, None]).tolist() == expected
    if dtype == torch.float32 and loader.library():  # and in C++ (kvlab.kernels' kvlab::greedy_pick)
        assert ops.greedy_pick(strided, torch.tensor(temperatures)).tolist() == expected


def test_at_p_one_generate_keeps_every_token_where_the_bare_rule_would_cut_the_tail():
    """The rule's mask cuts the tail once the rounded cumulative sum passes 1.0; generate skips the rule
    at p >= 1, and the count the lab reports (top_p_kept) is generate's."""
    logits = torch.randn(1, 2000, generator=torch.Generator().manual_seed(2)) * 8  # a peaked distribution
    assert int(sampling.top_p_keep(logits, 1.0).sum()) < logits.shape[1]  # float rounding cuts the tail
    assert bool(sampling.top_p_kept(logits, 1.0).all())
    assert torch.equal(sampling.top_p_kept(logits, 0.9), sampling.top_p_keep(logits, 0.9))
    assert torch.equal(sampling.top_p_filter(logits, 1.0), logits)
