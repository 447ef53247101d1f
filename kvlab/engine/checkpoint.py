"""MiniMind checkpoints: a `state_dict` saved with `torch.save`, usually float16.

`load_model` reads one safely (`weights_only=True`: a pickle that would run code
is refused), builds the architecture the tensor shapes determine (kvlab.engine.architecture)
or one inspected before, and loads it strictly. `save_checkpoint` writes the same format
MiniMind's trainers write.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvlab.engine.architecture import Architecture, ArchitectureError, infer_architecture, with_lm_head
from kvlab.engine.model import MiniMindForCausalLM
from kvlab.io import atomic_path


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


def check_keys_and_shapes(path, model, state_dict) -> dict[str, torch.Tensor]:
    """The state_dict that `model` loads strictly, or, in one line naming `path`, why it cannot:
    tensors missing or unexpected, or of another shape. `model` is kvlab's MiniMind or any module
    with a `config.tie_word_embeddings` (MiniMind's own code); a tied checkpoint saved without
    lm_head.weight gets it added (in a new dict: the argument is left as it was)."""
    expected = model.state_dict()
    state_dict = with_lm_head(state_dict, model.config.tie_word_embeddings)
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
    return state_dict


def load_model(path, device="cpu", dtype=torch.float32, architecture: Architecture | None = None,
               **overrides) -> MiniMindForCausalLM:
    """Read a MiniMind .pth, build the model of `architecture` (as an inspection of the file found
    it, kvlab.checkpoints) or else of the architecture its tensors and `overrides` (the user's
    model_overrides) determine, load it strictly, cast, and set eval mode. The model's
    `architecture` attribute says where each config field came from."""
    state_dict = read_state_dict(path)
    if architecture is None:
        try:
            architecture = infer_architecture(state_dict, overrides)
        except ArchitectureError as err:
            raise CheckpointError(f"{path}: {err}") from None
    model = MiniMindForCausalLM(architecture.config)
    model.load_state_dict(check_keys_and_shapes(path, model, state_dict), strict=True)
    model.architecture = architecture
    return model.to(device=device, dtype=dtype).eval()


def save_checkpoint(model: MiniMindForCausalLM, path) -> None:
    """Write MiniMind's format: a float16 state_dict (tied weights saved under both names)."""
    state_dict = {key: tensor.detach().to("cpu", torch.float16).clone() for key, tensor in model.state_dict().items()}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state_dict, f)  # through a handle: a path would be recorded in the file
