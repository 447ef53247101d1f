"""What a MiniMind checkpoint's tensors say about its architecture, what they leave open,
and where each field of the config came from.

Two layouts are in use. minimind-3 has per-head `q_norm`/`k_norm` weights, whose length is
head_dim, so every shape-related field can be read off the file. The 2025 MiniMind2 layout
has none: its q_proj maps hidden_size to heads x head_dim = hidden_size for any head count, so
the head count is not in the file. kvlab never guesses it: the user states it
(`model_overrides.num_attention_heads`), or `measure_head_count` finds it, since a trained
model predicts text far better under its true head count than under any other.

Each field of the resulting config carries its source: "file" (read off the tensors),
"layout default" (the detected layout's own default, e.g. MiniMind2's eps of 1e-5),
"user" (model_overrides) or "measured" (the head count, from the loss on validation text).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F

from kvlab.engine.config import MiniMindConfig
from kvlab.engine.model import MiniMindForCausalLM

# The layouts' own defaults for what the tensors cannot show (MiniMind's MiniMindConfig of each era).
LAYOUT_DEFAULTS = {
    "minimind-3": dict(rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=32768),
    "MiniMind2": dict(rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=32768),
}
# Fields that only say how kvlab runs (not what the weights are): never reported as a source.
RUN_FIELDS = ("flash_attn",)
# A head count is "measured" only when the best candidate is this much better (nats per token)
# than the runner-up, and clearly better than chance: ln(vocab) - TRAINED_MARGIN_NATS.
CLEAR_WINNER_NATS = 0.5
TRAINED_MARGIN_NATS = 1.0
OVERRIDE_KEY = "model_overrides.num_attention_heads"


class ArchitectureError(ValueError):
    """The tensors and the overrides do not determine one architecture (one line, no path: the caller adds it)."""


class HeadCountUnknown(ArchitectureError):
    """A MiniMind2-layout file whose head count nobody stated: the caller may measure it."""

    def __init__(self, candidates: list[int]):
        self.candidates = candidates
        super().__init__(
            f"a MiniMind2-layout checkpoint (no q_norm/k_norm) does not reveal its head count: set "
            f"{OVERRIDE_KEY} to the number your model was trained with (the shapes allow {candidates})"
        )


@dataclass
class Architecture:
    config: MiniMindConfig
    layout: str
    # config field -> file | layout default | built (the embedded default's build) | user | measured
    sources: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The layout, and each field that has a source with its value and its source."""
        config = self.config.to_dict()
        return {
            "layout": self.layout,
            "config": {key: config[key] for key in self.sources},
            "sources": dict(self.sources),
        }

    def to_json(self) -> dict:
        """Everything `from_json` needs to rebuild it: the layout, the whole config, the sources."""
        return {"layout": self.layout, "config": self.config.to_dict(), "sources": dict(self.sources)}

    @classmethod
    def from_json(cls, data: dict) -> Architecture:
        return cls(config=MiniMindConfig(**data["config"]), layout=data["layout"], sources=dict(data["sources"]))


def layout_of(state_dict: dict[str, torch.Tensor]) -> str:
    return "minimind-3" if "model.layers.0.self_attn.q_norm.weight" in state_dict else "MiniMind2"


def _shape(state_dict, key):
    try:
        return tuple(state_dict[key].shape)
    except KeyError:
        raise ArchitectureError(f"missing tensor {key!r}: not a MiniMind state_dict") from None


def vocab_rows(state_dict: dict[str, torch.Tensor]) -> int:
    """Rows of the embedding: the vocabulary the checkpoint was trained with (perhaps padded)."""
    return _shape(state_dict, "model.embed_tokens.weight")[0]


def head_count_candidates(state_dict: dict[str, torch.Tensor]) -> list[int]:
    """Head counts a MiniMind2-layout file's shapes allow: head_dim = q rows / heads, even (RoPE) and at
    least 8, dividing the k rows into a number of KV heads that divides the head count."""
    q_rows = _shape(state_dict, "model.layers.0.self_attn.q_proj.weight")[0]
    k_rows = _shape(state_dict, "model.layers.0.self_attn.k_proj.weight")[0]
    candidates = []
    for heads in range(1, q_rows + 1):
        if q_rows % heads:
            continue
        head_dim = q_rows // heads
        if head_dim % 2 or head_dim < 8 or k_rows % head_dim:
            continue
        if heads % (k_rows // head_dim) == 0:
            candidates.append(heads)
    return candidates


def infer_architecture(state_dict: dict[str, torch.Tensor], overrides: dict | None = None,
                       measured: dict | None = None, built: dict | None = None) -> Architecture:
    """The config for `state_dict`: shapes from the file, the rest from `overrides` (the user's),
    `measured` (a head count found by `measure_head_count`), `built` (what the embedded default was
    built with: config default_model.model, for the fields its file cannot show) or the detected
    layout's defaults.
    A MiniMind2-layout file with no stated or measured head count raises HeadCountUnknown."""
    overrides = dict(overrides or {})
    measured = dict(measured or {})
    if any(".mlp.experts." in key for key in state_dict):
        raise ArchitectureError("a mixture-of-experts (use_moe) checkpoint: kvlab's engine has dense MLPs only")
    vocab_size, hidden_size = _shape(state_dict, "model.embed_tokens.weight")
    q_rows = _shape(state_dict, "model.layers.0.self_attn.q_proj.weight")[0]
    k_rows = _shape(state_dict, "model.layers.0.self_attn.k_proj.weight")[0]
    intermediate_size = _shape(state_dict, "model.layers.0.mlp.gate_proj.weight")[0]
    layer_ids = {int(m.group(1)) for key in state_dict if (m := re.match(r"model\.layers\.(\d+)\.", key))}
    layout = layout_of(state_dict)
    from_file = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=max(layer_ids) + 1,
                     intermediate_size=intermediate_size, qk_norm=layout == "minimind-3")
    lm_head = state_dict.get("lm_head.weight")
    from_file["tie_word_embeddings"] = lm_head is None or torch.equal(lm_head, state_dict["model.embed_tokens.weight"])
    for key, value in overrides.items():
        if key in from_file and value != from_file[key]:
            raise ArchitectureError(f"override {key}={value} contradicts the checkpoint's tensors ({from_file[key]})")

    sources = {key: "file" for key in from_file}
    if layout == "minimind-3":
        head_dim = _shape(state_dict, "model.layers.0.self_attn.q_norm.weight")[0]
        sources["head_dim"] = "file"
        stated_heads = overrides.get("num_attention_heads")
        if stated_heads is not None and stated_heads * head_dim != q_rows:
            raise ArchitectureError(f"override num_attention_heads={stated_heads} contradicts the checkpoint's "
                                    f"tensors ({q_rows // head_dim} heads of {head_dim})")
        heads_source = "file"
    else:
        if "num_attention_heads" in overrides or "head_dim" in overrides:
            heads = overrides.get("num_attention_heads") or q_rows // overrides["head_dim"]
            heads_source = "user"
        elif "num_attention_heads" in measured:
            heads = measured["num_attention_heads"]
            heads_source = "measured"
        else:
            raise HeadCountUnknown(head_count_candidates(state_dict))
        head_dim = overrides.get("head_dim") or q_rows // heads
        sources["head_dim"] = "user" if "head_dim" in overrides else heads_source
        if heads * head_dim != q_rows or k_rows % head_dim:
            raise ArchitectureError(
                f"{heads} heads of {head_dim} do not fit q_proj ({q_rows} rows) and k_proj ({k_rows} rows): "
                f"check {OVERRIDE_KEY}"
            )
    from_file["head_dim"] = head_dim
    from_file["num_attention_heads"] = q_rows // head_dim
    from_file["num_key_value_heads"] = k_rows // head_dim
    sources["num_attention_heads"] = heads_source
    sources["num_key_value_heads"] = heads_source
    if from_file["num_attention_heads"] % from_file["num_key_value_heads"]:
        raise ArchitectureError(f"{from_file['num_attention_heads']} heads are not a multiple of "
                                f"{from_file['num_key_value_heads']} KV heads: check {OVERRIDE_KEY}")

    values = dict(from_file)
    for key, value in LAYOUT_DEFAULTS[layout].items():
        values[key] = value
        sources[key] = "layout default"
    for key, value in (built or {}).items():
        if key not in from_file:
            values[key] = value
            sources[key] = "built"
    for key, value in overrides.items():
        if key not in from_file:
            values[key] = value
            if key not in RUN_FIELDS:
                sources[key] = "user"
    known = {f.name for f in fields(MiniMindConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ArchitectureError(f"unknown model_overrides key(s) {unknown}; MiniMind's config has {sorted(known)}")
    return Architecture(config=MiniMindConfig(**values), layout=layout, sources=sources)


def mean_loss(model: MiniMindForCausalLM, ids: list[int]) -> float:
    """Mean next-token cross-entropy (nats) of `model` over one sequence of ids."""
    tokens = torch.tensor([ids], device=next(model.parameters()).device)
    with torch.inference_mode():
        logits = model(tokens).logits[0, :-1].float()
    return float(F.cross_entropy(logits, tokens[0, 1:]))


def measure_head_count(state_dict: dict[str, torch.Tensor], windows: list[list[int]],
                       overrides: dict | None = None) -> dict:
    """Load `state_dict` under every head count its shapes allow and score each on `windows` (short
    pieces of validation text, bos first: short, so that no model is asked about positions it never
    trained on). Returns {"chosen": heads or None, "losses": {heads: loss per token}, "tokens",
    "reason": one line}. `chosen` is None when no candidate is a clear winner (random weights, text
    the model never saw)."""
    overrides = {k: v for k, v in (overrides or {}).items() if k not in ("num_attention_heads", "head_dim")}
    windows = [w for w in windows if len(w) >= 2]
    tokens = sum(len(w) - 1 for w in windows)
    losses = {}
    for heads in head_count_candidates(state_dict):
        architecture = infer_architecture(state_dict, overrides, measured={"num_attention_heads": heads})
        model = MiniMindForCausalLM(architecture.config)
        model.load_state_dict(with_lm_head(state_dict, architecture.config.tie_word_embeddings), strict=True)
        model = model.float().eval()
        losses[heads] = sum(mean_loss(model, w) * (len(w) - 1) for w in windows) / max(tokens, 1)
    ranked = sorted(losses, key=losses.get)
    chance = math.log(_shape(state_dict, "model.embed_tokens.weight")[0])
    shown = ", ".join(f"{h} heads {losses[h]:.3f}" for h in ranked)
    result = {"chosen": None, "losses": losses, "tokens": tokens}
    if not ranked or not tokens:
        return {**result, "reason": "the shapes allow no head count, or there is no validation text"}
    best = ranked[0]
    gap = losses[ranked[1]] - losses[best] if len(ranked) > 1 else math.inf
    if gap < CLEAR_WINNER_NATS or losses[best] > chance - TRAINED_MARGIN_NATS:
        reason = (f"no clear winner on {tokens} validation tokens (loss per token: {shown}; a uniform guess "
                  f"scores {chance:.3f}): the model is untrained or the text is not its kind")
        return {**result, "reason": reason}
    reason = (f"{best} heads: the lowest loss on {tokens} validation tokens, by {gap:.2f} nats per token "
              f"(loss per token: {shown}; a uniform guess scores {chance:.3f})")
    return {**result, "chosen": best, "reason": reason}


def with_lm_head(state_dict: dict[str, torch.Tensor], tie_word_embeddings: bool) -> dict[str, torch.Tensor]:
    """A tied checkpoint may be saved without lm_head.weight (it is the embedding): put it back,
    in a new dict."""
    if "lm_head.weight" not in state_dict and tie_word_embeddings:
        return {**state_dict, "lm_head.weight": state_dict["model.embed_tokens.weight"]}
    return state_dict
