"""MiniMind checkpoints: a `state_dict` saved with `torch.save`, usually float16.

`load_model` reads one safely (`weights_only=True`: a pickle that would run code
is refused), infers the architecture from the tensor shapes, and loads it
strictly. `save_checkpoint` writes the same format MiniMind's trainers write.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from kvlab.io import atomic_path
from kvlab.engine.model import MiniMindConfig, MiniMindForCausalLM


class CheckpointError(ValueError):
    """A checkpoint file that cannot be used, with a one-line reason naming the file."""


def read_state_dict(path) -> dict[str, torch.Tensor]:
    """Load a bare state_dict or one wrapped as {"model": state_dict}, never running pickled code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types: UnpicklingError, RuntimeError, EOFError, ...
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "weights_only" in str(err) or "Unsupported global" in str(err):
            reason = "it holds Python objects that only an unsafe unpickle could load (refused)"
        raise CheckpointError(f"{path}: not a loadable PyTorch state_dict: {reason}") from None
    if isinstance(obj, dict) and "model" in obj and isinstance(obj["model"], dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a state_dict (a dict of tensor names to tensors)")
    return obj


def infer_config(state_dict: dict[str, torch.Tensor], **overrides) -> MiniMindConfig:
    """Every architecture field the tensors determine; the rest from `overrides` or the defaults."""
    if any(".mlp.experts." in key for key in state_dict):
        raise CheckpointError("a mixture-of-experts (use_moe) checkpoint: kvlab's engine has dense MLPs only")
    try:
        vocab_size, hidden_size = state_dict["model.embed_tokens.weight"].shape
        q_rows = state_dict["model.layers.0.self_attn.q_proj.weight"].shape[0]
        k_rows = state_dict["model.layers.0.self_attn.k_proj.weight"].shape[0]
        intermediate_size = state_dict["model.layers.0.mlp.gate_proj.weight"].shape[0]
    except KeyError as err:
        raise CheckpointError(f"missing tensor {err.args[0]!r}: not a MiniMind state_dict") from None
    layer_ids = {int(m.group(1)) for key in state_dict if (m := re.match(r"model\.layers\.(\d+)\.", key))}
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=max(layer_ids) + 1,
        intermediate_size=intermediate_size,
    )
    q_norm = state_dict.get("model.layers.0.self_attn.q_norm.weight")
    fields["qk_norm"] = q_norm is not None
    if q_norm is not None:
        head_dim = q_norm.shape[0]
    else:  # MiniMind2 layout: the head count is not in any shape
        heads = overrides.get("num_attention_heads", MiniMindConfig.num_attention_heads)
        head_dim = overrides.get("head_dim") or hidden_size // heads
    fields["head_dim"] = head_dim
    fields["num_attention_heads"] = q_rows // head_dim
    fields["num_key_value_heads"] = k_rows // head_dim
    lm_head = state_dict.get("lm_head.weight")
    fields["tie_word_embeddings"] = lm_head is None or torch.equal(lm_head, state_dict["model.embed_tokens.weight"])
    for key, value in overrides.items():
        if key in fields and key not in ("num_attention_heads", "head_dim") and value != fields[key]:
            raise CheckpointError(f"override {key}={value} contradicts the checkpoint's tensors ({fields[key]})")
    return MiniMindConfig(**{**overrides, **fields})


def _check_keys_and_shapes(path, model: MiniMindForCausalLM, state_dict) -> None:
    expected = model.state_dict()
    if "lm_head.weight" not in state_dict and model.config.tie_word_embeddings:
        state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensor(s): {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensor(s): {', '.join(unexpected[:3])}")
        raise CheckpointError(f"{path}: not this MiniMind architecture: {'; '.join(parts)}")
    for key, tensor in expected.items():
        if tuple(state_dict[key].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{path}: tensor {key} has shape {tuple(state_dict[key].shape)}, "
                f"the architecture expects {tuple(tensor.shape)}"
            )


def load_model(path, device="cpu", dtype=torch.float32, **overrides) -> MiniMindForCausalLM:
    """Read a MiniMind .pth, build the matching model, load it strictly, cast, and set eval mode."""
    state_dict = read_state_dict(path)
    try:
        config = infer_config(state_dict, **overrides)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None
    model = MiniMindForCausalLM(config)
    _check_keys_and_shapes(path, model, state_dict)
    model.load_state_dict(state_dict, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def save_checkpoint(model: MiniMindForCausalLM, path) -> None:
    """Write MiniMind's format: a float16 state_dict (tied weights saved under both names)."""
    state_dict = {key: tensor.detach().to("cpu", torch.float16).clone() for key, tensor in model.state_dict().items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state_dict, f)  # through a handle: a path would be recorded in the file
