"""The engine against the lab's rules: same tokens with and without the cache, the fed-token
formulas, the cache's shape and bytes, eos padding."""
import pytest
import torch

from kvlab.measure.steps import GREEDY_NO_EOS, counting_forward
from kvlab.engine.model import kv_cache_bytes, repeat_kv
from kvlab.facts.formulas import fed_formulas

from helpers import random_model


@pytest.mark.parametrize("seed,prompt_len", [(0, 1), (1, 7), (2, 33)])
def test_greedy_same_with_and_without_cache(seed, prompt_len):
    model = random_model(seed)
    prompt = torch.randint(3, 300, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    with_cache = model.generate(prompt, max_new_tokens=20, use_cache=True, **GREEDY_NO_EOS)
    without_cache = model.generate(prompt, max_new_tokens=20, use_cache=False, **GREEDY_NO_EOS)
    assert with_cache.shape == (1, prompt_len + 20)
    assert torch.equal(with_cache, without_cache)
    assert torch.equal(with_cache[:, :prompt_len], prompt)
    assert len(set(with_cache[0, prompt_len:].tolist())) > 1, "degenerate output would make the check weak"


def test_greedy_same_for_a_batch():
    model = random_model(3)
    prompt = torch.randint(3, 300, (3, 9), generator=torch.Generator().manual_seed(3))
    with_cache = model.generate(prompt, max_new_tokens=12, use_cache=True, **GREEDY_NO_EOS)
    without_cache = model.generate(prompt, max_new_tokens=12, use_cache=False, **GREEDY_NO_EOS)
    assert torch.equal(with_cache, without_cache)
    # each row equals the same prompt generated alone
    for row in range(3):
        alone = model.generate(prompt[row : row + 1], max_new_tokens=12, use_cache=True, **GREEDY_NO_EOS)
        assert torch.equal(alone[0], with_cache[row])


def test_cached_logits_match_full_forward():
    model = random_model(4)
    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        full = model(ids).logits
        prefix = model(ids[:, :10], use_cache=True)
        step = model(ids[:, 10:11], past_key_values=prefix.past_key_values, use_cache=True)
        rest = model(ids[:, 11:], past_key_values=step.past_key_values, use_cache=True)
    torch.testing.assert_close(prefix.logits, full[:, :10], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.logits, full[:, 10:11], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rest.logits, full[:, 11:], rtol=1e-5, atol=1e-5)
    assert rest.past_key_values[0][0].shape == (2, 16, 2, 32)


@pytest.mark.parametrize("prompt_len,new_tokens", [(1, 1), (5, 9), (17, 32)])
def test_fed_tokens_follow_the_formulas(prompt_len, new_tokens):
    model = random_model(5)
    prompt = torch.randint(3, 300, (1, prompt_len))
    fed = {}
    for use_cache in (True, False):
        with counting_forward(model) as lengths:
            model.generate(prompt, max_new_tokens=new_tokens, use_cache=use_cache, **GREEDY_NO_EOS)
        fed[use_cache] = sum(lengths)
        assert len(lengths) == new_tokens  # one forward call per new token
    formulas = fed_formulas(prompt_len, new_tokens)
    assert fed[True] == prompt_len + new_tokens - 1 == formulas["with_cache"]
    assert fed[False] == prompt_len * new_tokens + new_tokens * (new_tokens - 1) // 2 == formulas["without_cache"]
    assert "forward" not in vars(model), "the counting wrapper must be removed afterwards"


@pytest.mark.parametrize("tokens", [1, 100])
def test_cache_shape_and_bytes(tokens):
    model = random_model(6)
    with torch.inference_mode():
        cache = model(torch.randint(3, 300, (1, tokens)), use_cache=True).past_key_values
    assert len(cache) == 4
    for k, v in cache:
        assert k.shape == v.shape == (1, tokens, 2, 32)  # KV heads, not query heads: before repeat_kv
    assert kv_cache_bytes(cache) == 2 * 4 * tokens * 2 * 32 * 4


def test_no_cache_returned_without_use_cache():
    model = random_model(6)
    assert model(torch.tensor([[5, 6, 7]])).past_key_values is None


def test_repeat_kv_expands_each_kv_head():
    x = torch.arange(2 * 3 * 2 * 4, dtype=torch.float32).view(2, 3, 2, 4)
    out = repeat_kv(x, 3)
    assert out.shape == (2, 3, 6, 4)
    assert torch.equal(out[:, :, 0], x[:, :, 0]) and torch.equal(out[:, :, 2], x[:, :, 0])
    assert torch.equal(out[:, :, 3], x[:, :, 1])


def test_finished_rows_are_padded_with_eos():
    model = random_model(7)
    prompt = torch.randint(3, 300, (1, 4), generator=torch.Generator().manual_seed(7))
    torch.manual_seed(0)
    free = model.generate(prompt, max_new_tokens=10, num_return_sequences=6, do_sample=True,
                          temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None)
    # declare the token that row 0 produced third "eos": that row must stop changing after it
    eos = int(free[0, 4 + 2])
    torch.manual_seed(0)
    out = model.generate(prompt, max_new_tokens=10, num_return_sequences=6, do_sample=True,
                         temperature=1.0, top_k=0, top_p=1.0, eos_token_id=eos)
    new = out[:, 4:]
    saw_eos = False
    for row in new:
        hits = (row == eos).nonzero()
        if len(hits):
            saw_eos = True
            first = int(hits[0])
            assert torch.all(row[first:] == eos)
    assert saw_eos
    # the loop stops once every row has finished, or after max_new_tokens
    all_done = all((row == eos).any() for row in new)
    assert new.shape[1] == 10 or all_done


def test_generation_stops_when_every_row_finished():
    model = random_model(8)
    prompt = torch.tensor([[5, 6, 7]])
    first = int(model.generate(prompt, max_new_tokens=1, **GREEDY_NO_EOS)[0, -1])
    out = model.generate(prompt, max_new_tokens=50, do_sample=False, top_k=0, top_p=1.0, eos_token_id=first)
    assert out.shape == (1, 4)


def test_sampling_needs_a_positive_temperature():
    model = random_model(9)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        model.generate(torch.tensor([[5]]), max_new_tokens=2, temperature=0.0, do_sample=True)
    # greedy ignores the scale
    out = model.generate(torch.tensor([[5]]), max_new_tokens=3, temperature=0.0, do_sample=False, top_k=0, top_p=1.0)
    assert torch.equal(out, model.generate(torch.tensor([[5]]), max_new_tokens=3, **GREEDY_NO_EOS))


def test_seeded_sampling_is_reproducible_and_cache_independent():
    model = random_model(10)
    prompt = torch.tensor([[5, 9, 11]])
    runs = []
    for use_cache in (True, False, True):
        torch.manual_seed(123)
        runs.append(model.generate(prompt, max_new_tokens=15, num_return_sequences=4, use_cache=use_cache, eos_token_id=None))
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_too_long_generation_is_refused_before_work():
    model = random_model(11, max_position_embeddings=64)
    with counting_forward(model) as lengths, pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(torch.randint(3, 300, (1, 40)), max_new_tokens=26, **GREEDY_NO_EOS)
    assert lengths == []
    # exactly full: the 25th new token is produced but never fed back
    out = model.generate(torch.randint(3, 300, (1, 40)), max_new_tokens=25, **GREEDY_NO_EOS)
    assert out.shape == (1, 65)
