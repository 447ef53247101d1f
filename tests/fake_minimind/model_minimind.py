"""A stand-in for MiniMind's model/model_minimind.py, written for kvlab's tests: not MiniMind's code.

It has MiniMind's interface, `MiniMindConfig` (keyword arguments with MiniMind's names and defaults)
and `MiniMindForCausalLM` (`forward(input_ids, attention_mask, past_key_values, use_cache)` and
`generate`), by wrapping kvlab's engine, so unchanged it must agree with kvlab everywhere. The knobs
below let a test write an altered copy that parts from kvlab in one known place.
"""
import torch
from dataclasses import asdict

from kvlab.engine import model as engine
from kvlab.engine import sampling

QK_NORM = True  # False: the MiniMind2 layout, no q_norm/k_norm
RMS_NORM_EPS = 1e-6  # the config's default epsilon
ROPE_THETA = 1e6  # the config's default RoPE base
TOP_P_RULE = "shifted"  # "unshifted": the token that crosses p is cut too


class MiniMindConfig:
    def __init__(self, **kwargs):
        settings = {"rms_norm_eps": RMS_NORM_EPS, "rope_theta": ROPE_THETA, **kwargs}
        self.engine_config = engine.MiniMindConfig(**settings, qk_norm=QK_NORM)
        fields = asdict(self.engine_config)
        del fields["qk_norm"]  # MiniMind's config has no such key: the file's version decides
        self.__dict__.update(fields)


def unshifted_top_p_filter(logits, p):
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    cut = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1) > p
    cut[..., 0] = False
    return logits.masked_fill(cut.scatter(-1, order, cut), float("-inf"))


class MiniMindForCausalLM(engine.MiniMindForCausalLM):
    def __init__(self, config=None):
        config = config or MiniMindConfig()
        super().__init__(config.engine_config)
        self.config = config

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False, **kwargs):
        return super().forward(input_ids, past_key_values=past_key_values, use_cache=use_cache)

    def generate(self, inputs=None, **kwargs):
        if TOP_P_RULE == "shifted":
            return super().generate(inputs, **kwargs)
        kept = sampling.top_p_filter
        sampling.top_p_filter = unshifted_top_p_filter
        try:
            return super().generate(inputs, **kwargs)
        finally:
            sampling.top_p_filter = kept
