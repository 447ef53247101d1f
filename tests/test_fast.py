"""The fast decode path (kvlab.engine.fast): MiniMind's tokens and logits from every step plan, the
default step compiled ahead of time once per architecture and kept on disk, a torch.compile plan once
per shape, none within a generation, the weights followed, the missing compiler."""
import gc
import warnings
import weakref

import pytest
import torch

from kvlab.engine import aot, fast, sampling
from kvlab.engine.model import left_pad
from kvlab.kernels import torch_internals
from kvlab.measure.steps import GREEDY_NO_EOS

from helpers import TINY_FAST, random_model, torch_threads

PROMPT = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11]])
LOGITS_WITHIN = 1e-5
SMALL = dict(hidden_size=64, num_hidden_layers=2, std=0.15)  # eager plans: no compiling, a wider model
# MiniMind's arithmetic with static shapes; each fusion alone; all of them, with each attention
EAGER_PLANS = [fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="repeat_kv", compile_mode=None),
               fast.StepPlan(fused_qkv=True, fused_gate_up=False, attention="repeat_kv", compile_mode=None),
               fast.StepPlan(fused_qkv=False, fused_gate_up=True, attention="repeat_kv", compile_mode=None),
               fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="grouped", compile_mode=None),
               fast.StepPlan(fused_qkv=False, fused_gate_up=False, attention="sdpa", compile_mode=None),
               fast.StepPlan(attention="sdpa", compile_mode=None),
               fast.StepPlan(attention="grouped", compile_mode=None)]


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the decode benchmark times: compiled code is made for a thread count (one
    of its guards), so the compiling tests share one compile with tests/test_decode_bench.py; and a
    model this small is no faster on two."""
    with torch_threads(1):
        yield


def compiles() -> int:
    """Graphs dynamo has compiled in this process so far."""
    return torch_internals.compiled_graphs()


class SeenLogits:
    """Every logits row the next-token choice saw (kvlab.engine.sampling.pick, which both the
    eager and the fast path call once a step; the fast path's plain greedy choice made in its step)."""

    def __init__(self, monkeypatch):
        self.rows = []
        original = sampling.pick

        def pick(logits, *args, **kwargs):
            self.rows.append(logits.clone())
            return original(logits, *args, **kwargs)

        monkeypatch.setattr(sampling, "pick", pick)

    def take(self) -> list[torch.Tensor]:
        rows, self.rows = self.rows, []
        return rows


def assert_same_run(model, prompt, seen, generate_fast, **knobs):
    """The fast generation's tokens are the torch.cat path's, and every step's logits within the bound."""
    cat = model.generate(prompt, kv_cache="cat", **knobs)
    cat_logits = seen.take()
    fast_ids = generate_fast(prompt, **knobs)
    fast_logits = seen.take()
    assert torch.equal(fast_ids, cat), "the fast path chose other tokens"
    assert len(fast_logits) == len(cat_logits)
    worst = max(float((a - b).abs().max()) for a, b in zip(fast_logits, cat_logits))
    assert worst <= LOGITS_WITHIN, f"logits differ by {worst}"
    return cat


# --- each fusion, eagerly: no compiling ---------------------------------------------------------------


@pytest.mark.parametrize("plan,qk_norm", [(plan, True) for plan in EAGER_PLANS] + [(EAGER_PLANS[0], False),
                                                                                   (EAGER_PLANS[-1], False)],
                         ids=lambda p: f"qkv{p.fused_qkv:d}-gateup{p.fused_gate_up:d}-{p.attention}"
                         if isinstance(p, fast.StepPlan) else f"qk_norm{p:d}")
def test_every_plan_gives_minimind_s_tokens_and_logits(plan, qk_norm, monkeypatch):
    model = random_model(2, **SMALL, qk_norm=qk_norm)
    seen = SeenLogits(monkeypatch)
    ids = assert_same_run(model, PROMPT, seen, lambda prompt, **k: fast.generate(model, prompt, plan=plan, **k),
                          max_new_tokens=16, **GREEDY_NO_EOS)
    assert len(set(ids[0, PROMPT.shape[1]:].tolist())) > 3, "degenerate output would make the check weak"


def test_padded_rows_and_seeded_samples_are_the_eager_path_s(monkeypatch):
    model = random_model(3, **SMALL)
    plan = fast.StepPlan(compile_mode=None)
    seen = SeenLogits(monkeypatch)
    ids, mask = left_pad([[1, 5, 6], [1, 7, 8, 9, 10, 11, 12]])
    cat = model.generate(ids, mask, max_new_tokens=12, **GREEDY_NO_EOS)
    seen.take()
    assert torch.equal(fast.generate(model, ids, mask, max_new_tokens=12, plan=plan, **GREEDY_NO_EOS), cat)
    sampled = []
    for run in (lambda: model.generate(PROMPT, max_new_tokens=20, num_return_sequences=4, temperature=1.2,
                                       eos_token_id=None),
                lambda: fast.generate(model, PROMPT, max_new_tokens=20, num_return_sequences=4, temperature=1.2,
                                      eos_token_id=None, plan=plan)):
        torch.manual_seed(7)
        sampled.append(run())
    assert torch.equal(*sampled) and len(set(map(tuple, sampled[0].tolist()))) > 1


def test_half_precision_gives_the_eager_path_s_tokens_too():
    model = random_model(1, **SMALL).half()
    cat = model.generate(PROMPT, max_new_tokens=12, **GREEDY_NO_EOS)
    assert torch.equal(fast.generate(model, PROMPT, max_new_tokens=12, plan=fast.StepPlan(compile_mode=None), **GREEDY_NO_EOS), cat)
    (decoder,) = fast.decoders_of(model).values()
    assert decoder.weights.packed.dtype == decoder.cache.keys_t[0].dtype == torch.float16


def test_the_fused_weights_follow_the_model_s(monkeypatch):
    model = random_model(4, **SMALL)
    plan = fast.StepPlan(compile_mode=None)
    seen = SeenLogits(monkeypatch)
    run = lambda prompt, **k: fast.generate(model, prompt, plan=plan, **k)  # noqa: E731
    before = assert_same_run(model, PROMPT, seen, run, max_new_tokens=16, **GREEDY_NO_EOS)
    assert_same_run(model, PROMPT, seen, run, max_new_tokens=16, **GREEDY_NO_EOS)
    (decoder,) = fast.decoders_of(model).values()
    assert decoder.weights.packs == 1  # nothing changed: the packed weights are not copied again
    with torch.no_grad():  # a training step, a load_state_dict: the weights change in place
        model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)
        model.model.layers[1].mlp.up_proj.weight.mul_(-1.0)
    after = assert_same_run(model, PROMPT, seen, run, max_new_tokens=16, **GREEDY_NO_EOS)
    assert not torch.equal(before, after), "the change must show in the tokens for the check to mean anything"
    assert list(fast.decoders_of(model).values()) == [decoder] and decoder.weights.packs == 2  # packed again
    held = weakref.ref(model)
    del model, decoder, run
    gc.collect()
    assert held() is None, "a Decoder must not keep its model alive"


def test_cache_lengths_are_bucketed_and_capped():
    assert [fast.bucket_length(n, 1024) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]
    model = random_model(5, **SMALL)
    plan = fast.StepPlan(compile_mode=None)
    for prompt_len in (3, 40):  # both fit one bucket: one Decoder serves both
        fast.generate(model, PROMPT[:, :1].repeat(1, prompt_len), max_new_tokens=5, plan=plan, **GREEDY_NO_EOS)
    assert [key[1] for key in fast.decoders_of(model)] == [256]


def test_bad_requests_are_refused_in_one_line():
    model = random_model(6, **SMALL)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        fast.generate(model, PROMPT, max_new_tokens=2000, **GREEDY_NO_EOS)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        fast.generate(model, PROMPT, max_new_tokens=3, temperature=0.0)
    with pytest.raises(ValueError, match="attention must be one of repeat_kv, grouped, sdpa, got 'flash'"):
        fast.StepPlan(attention="flash")
    with pytest.raises(ValueError, match="rowwise_matmul needs a compile_mode"):
        fast.StepPlan(rowwise_matmul=True, compile_mode=None)
    with pytest.raises(ValueError, match="cpp_wrapper needs compile_mode 'default'"):
        fast.StepPlan(cpp_wrapper=True, compile_mode="reduce-overhead")


# --- compiled: one small model, compiled once ---------------------------------------------------------


def test_one_program_per_architecture_every_length_minimind_s_tokens_and_the_disk_cache(monkeypatch):
    """The default plan's step compiled ahead of time (kvlab.engine.aot): one program serves every cache
    length (each generation's cache exactly its length) and every model of the architecture, greedy
    (chosen inside the step) and seeded; nothing is compiled by dynamo; a new process loads it from
    the cache directory."""
    model = random_model(0, **TINY_FAST)
    seen = SeenLogits(monkeypatch)

    def compiled(prompt, **knobs):
        return fast.generate(model, prompt, **knobs)

    before = compiles()
    ids = assert_same_run(model, PROMPT, seen, compiled, max_new_tokens=12, **GREEDY_NO_EOS)
    assert len(set(ids[0, PROMPT.shape[1]:].tolist())) > 3
    (decoder,) = fast.decoders_of(model).values()
    assert decoder.program is not None and decoder.steps == 11 and decoder.compile_s >= 0
    assert decoder.cache.max_tokens == PROMPT.shape[1] + 12 - 1
    loaded = dict(aot._LOADED)
    twin = random_model(1, **TINY_FAST)
    with torch.compiler.set_stance("fail_on_recompile"):
        assert_same_run(model, PROMPT[:, :5], seen, compiled, max_new_tokens=20, **GREEDY_NO_EOS)
        assert_same_run(twin, PROMPT, seen, lambda p, **k: fast.generate(twin, p, **k), max_new_tokens=12, **GREEDY_NO_EOS)
        sampled = []
        for generate in (model.generate, compiled):
            torch.manual_seed(11)
            sampled.append(generate(PROMPT, max_new_tokens=16, temperature=1.3, eos_token_id=None))
        assert torch.equal(*sampled)
    assert aot._LOADED == loaded and compiles() == before
    assert len(fast.decoders_of(model)) == 1 and decoder.steps == 11 + 19 + 15
    assert decoder.cache.max_tokens == PROMPT.shape[1] + 16 - 1
    # as a new process finds it: loaded from the cache directory, not compiled again
    monkeypatch.setattr(aot, "_LOADED", {})
    again = fast.Decoder(model, 1, None, decoder.plan)
    # (other tests of the session may have loaded programs of other architectures before)
    assert again.program.from_cache and len(aot._LOADED) == 1 and set(aot._LOADED) <= set(loaded)


def test_a_torch_compile_plan_compiles_once_per_shape(monkeypatch):
    """The plan compiled by torch.compile (the GPU's way, and the ablation's): one compile per shape,
    none within a generation, MiniMind's tokens."""
    torch_internals.reset_compiler()  # count from a clean slate, whatever ran before in this process
    model = random_model(0, **TINY_FAST)
    plan = fast.StepPlan(rowwise_matmul=True, cpp_wrapper=True)
    seen = SeenLogits(monkeypatch)
    run = lambda prompt, **k: fast.generate(model, prompt, plan=plan, **k)  # noqa: E731
    before = compiles()
    assert_same_run(model, PROMPT, seen, run, max_new_tokens=12, **GREEDY_NO_EOS)
    with torch.compiler.set_stance("fail_on_recompile"):
        assert_same_run(model, PROMPT[:, :5], seen, run, max_new_tokens=20, **GREEDY_NO_EOS)  # the same bucket
    assert compiles() - before == 1
    (decoder,) = fast.decoders_of(model).values()
    assert decoder.cache_length == fast.BUCKET_POSITIONS and decoder.steps == 11 + 19 and decoder.compile_s > 0


def test_without_a_compiler_one_line_and_the_eager_static_path(monkeypatch):
    model = random_model(0, **TINY_FAST)
    monkeypatch.setattr(fast, "find_cpp_compiler", lambda: None)
    before = compiles()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fast.generate(model, PROMPT, max_new_tokens=10, **GREEDY_NO_EOS)
    lines = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert lines == [fast.NO_COMPILER] and "\n" not in lines[0] and "no C++ compiler found" in lines[0]
    assert torch.equal(out, model.generate(PROMPT, max_new_tokens=10, kv_cache="cat", **GREEDY_NO_EOS))
    assert compiles() == before and not fast.decoders_of(model)
