"""Where a model runs and in which precision, from the config's `device` and `dtype` words; and
what a timing ran on, recorded beside it."""

from __future__ import annotations

import platform
from pathlib import Path

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


def processor_name(device: torch.device) -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), or the GPU's when `device` is CUDA."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def timing_context(device) -> dict:
    """What a timing depends on beside its work: the device, its processor, torch's CPU threads."""
    device = torch.device(device)
    return {"device": str(device), "processor": processor_name(device), "torch_threads": torch.get_num_threads()}
