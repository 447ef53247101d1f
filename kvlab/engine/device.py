"""Where a model runs and in which precision, from the config's `device` and `dtype` words."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("config key 'device' is 'cuda' but no CUDA device is available")
    return torch.device(name)


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str) -> torch.dtype:
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The config's word for `dtype`: torch.float16 -> "float16"."""
    return str(dtype).removeprefix("torch.")
