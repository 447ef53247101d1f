"""MiniMind checkpoints: float16 state_dicts with MiniMind's names load strictly and round-trip."""
import pickle

import pytest
import torch

from kvlab.engine.architecture import infer_architecture
from kvlab.engine.checkpoint import CheckpointError, check_keys_and_shapes, load_model, save_checkpoint
from kvlab.engine.config import MiniMindConfig
from kvlab.engine.model import MiniMindForCausalLM, count_parameters, kv_cache_bytes
from kvlab.measure.steps import GREEDY_NO_EOS

from helpers import random_model

MINIMIND_LAYER_KEYS = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight", "input_layernorm.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
}


def test_parameter_names_are_minimind_names():
    keys = set(random_model().state_dict())
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    expected |= {f"model.layers.{i}.{k}" for i in range(4) for k in MINIMIND_LAYER_KEYS}
    assert keys == expected


def test_float16_round_trip_loads_strictly(tmp_path):
    model = random_model(1)
    path = tmp_path / "pretrain.pth"
    save_checkpoint(model, path)
    raw = torch.load(path, weights_only=True)
    assert all(t.dtype == torch.float16 for t in raw.values())
    assert set(raw) == set(model.state_dict())
    loaded = load_model(path)
    assert loaded.config.num_key_value_heads == 2 and loaded.config.head_dim == 32
    assert loaded.config.intermediate_size == model.config.intermediate_size
    assert loaded.config.tie_word_embeddings and loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert next(loaded.parameters()).dtype == torch.float32
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, raw[key].float())
    # a second save of the loaded model is byte-for-byte the same tensors
    save_checkpoint(loaded, tmp_path / "again.pth")
    again = torch.load(tmp_path / "again.pth", weights_only=True)
    assert all(torch.equal(again[k], raw[k]) for k in raw)


def test_wrapped_state_dict_and_mini_mind2_layout(tmp_path):
    model = random_model(2, qk_norm=False, hidden_size=64, num_attention_heads=8, num_key_value_heads=2)
    state = {k: v.half() for k, v in model.state_dict().items()}
    torch.save({"model": state}, tmp_path / "wrapped.pth")
    loaded = load_model(tmp_path / "wrapped.pth", num_attention_heads=8)
    assert not loaded.config.qk_norm
    assert (loaded.config.head_dim, loaded.config.num_key_value_heads) == (8, 2)
    prompt = torch.tensor([[4, 5, 6]])
    half_model = random_model(2, qk_norm=False, hidden_size=64, num_attention_heads=8, num_key_value_heads=2)
    half_model.load_state_dict({k: v.float() for k, v in state.items()})
    assert torch.equal(loaded.generate(prompt, max_new_tokens=5, **GREEDY_NO_EOS), half_model.generate(prompt, max_new_tokens=5, **GREEDY_NO_EOS))


def test_every_shape_field_is_read_off_the_tensors():
    model = random_model(3, vocab_size=500, intermediate_size=320)
    config = infer_architecture(model.state_dict()).config
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (500, 128, 4)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 32)
    assert config.intermediate_size == 320 and config.qk_norm


def test_what_the_embedded_default_was_built_with_fills_what_its_file_cannot_show():
    """The embedded default's checkpoints (inputs left null) are inspected with default_model.model as
    `built`: max_position_embeddings is the 2,048 they were built with, sourced "built", where a
    user's file gets its layout's 32,768; the fields the tensors show stay "file", and a user's
    override still wins."""
    import yaml

    from kvlab.config import checkpoints
    from helpers import ROOT

    config = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8"))
    found = checkpoints(config, {"pretrain": "p.pth", "sft": "s.pth"}, {})
    built = found["pretrain"]["built"]
    assert built == config["default_model"]["model"] and found["sft"]["built"] == built
    assert checkpoints(config | {"pretrain": "mine.pth", "sft": "mine.pth"}, {"pretrain": "mine.pth", "sft": "mine.pth"},
                       {})["pretrain"]["built"] is None
    state = random_model(6).state_dict()
    architecture = infer_architecture(state, built=built)
    assert architecture.config.max_position_embeddings == built["max_position_embeddings"] == 2048
    assert architecture.sources["max_position_embeddings"] == "built"
    assert architecture.sources["hidden_size"] == "file"
    assert infer_architecture(state).config.max_position_embeddings == 32768
    overridden = infer_architecture(state, {"max_position_embeddings": 1024}, built=built)
    assert (overridden.config.max_position_embeddings, overridden.sources["max_position_embeddings"]) == (1024, "user")


def test_a_tied_checkpoint_without_lm_head_loads_and_is_left_as_it_was():
    model = random_model(5)
    state = {key: value for key, value in model.state_dict().items() if key != "lm_head.weight"}
    loadable = check_keys_and_shapes("tied.pth", model, state)
    assert "lm_head.weight" not in state  # the argument is not changed
    assert torch.equal(loadable["lm_head.weight"], state["model.embed_tokens.weight"])


@pytest.mark.parametrize("arch", [{}, {"vocab_size": 1884, "hidden_size": 128, "num_hidden_layers": 4,
                                       "num_attention_heads": 4, "num_key_value_heads": 2},
                                  {"qk_norm": False, "tie_word_embeddings": False, "head_dim": 96}])
def test_the_configs_arithmetic_is_the_built_models(arch):
    """parameter_count and kv_bytes_per_token, free of PyTorch, against the model and a cache it builds."""
    config = MiniMindConfig(**{"max_position_embeddings": 64, **arch})
    model = MiniMindForCausalLM(config)
    assert config.parameter_count() == count_parameters(model)
    with torch.inference_mode():
        cache = model(torch.ones(1, 3, dtype=torch.long), use_cache=True).past_key_values
    assert 3 * config.kv_bytes_per_token("float32") == kv_cache_bytes(cache)
    assert config.kv_bytes_per_token("float16") * 2 == config.kv_bytes_per_token("float32")


def test_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    state = random_model(4).state_dict()
    state["model.layers.2.mlp.up_proj.weight"] = torch.zeros(10, 128)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.mlp\.up_proj\.weight.*\(10, 128\).*\(448, 128\)"):
        load_model(tmp_path / "bad.pth")


def test_malicious_pickle_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    with open(tmp_path / "evil.pth", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": Evil()}, f)
    with pytest.raises(CheckpointError, match="evil.pth"):
        load_model(tmp_path / "evil.pth")
    assert not marker.exists()


def test_moe_checkpoint_is_refused_by_name(tmp_path):
    state = random_model().state_dict()
    state["model.layers.0.mlp.experts.0.gate_proj.weight"] = state.pop("model.layers.0.mlp.gate_proj.weight")
    torch.save(state, tmp_path / "moe.pth")
    with pytest.raises(CheckpointError, match=r"moe\.pth: a mixture-of-experts"):
        load_model(tmp_path / "moe.pth")
