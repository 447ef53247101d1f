"""Small builders shared by the tests."""
import torch

from kvlab.model import MiniMindConfig, MiniMindForCausalLM

LAB_ARCH = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)


def random_model(seed=0, vocab_size=300, std=0.08, **arch) -> MiniMindForCausalLM:
    """A MiniMind with random weights large enough that greedy output varies."""
    torch.manual_seed(seed)
    config = MiniMindConfig(**{**LAB_ARCH, "vocab_size": vocab_size, "max_position_embeddings": 1024, **arch})
    model = MiniMindForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0.0, std)
    return model.eval()
