"""What this seqkernels build contains and what it will run here: `show_config()` and
`python -m seqkernels`."""
from __future__ import annotations

import os
import platform

import torch

from . import __version__

_OPS = ("lstm_forward", "lstm_backward", "convrnn_forward", "convrnn_backward")


def _build_config() -> dict:
    try:
        from . import _build_config as bc
    except ImportError:  # a build made before setup.py wrote this file
        return {}
    return {k: getattr(bc, k) for k in ("CUDA", "CUDA_ARCH_LIST", "TORCH_VERSION", "TORCH_CUDA_VERSION", "DEBUG")}


def _registered(op: str, key: str) -> bool:
    name = f"seqkernels::{op}"
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    except RuntimeError:  # the schema itself is missing
        return False


def config() -> dict:
    """The facts show_config() prints, as a dict."""
    build = _build_config()
    info = {
        "seqkernels": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "built against torch": build.get("TORCH_VERSION", "unknown"),
        "CUDA kernels built": build.get("CUDA", _registered("lstm_forward", "CUDA")),
        "CUDA arch list at build": build.get("CUDA_ARCH_LIST") or "torch's default",
        "debug build": build.get("DEBUG", False),
        "CPU threads": torch.get_num_threads(),
        "ops (CPU / CUDA)": {op: (_registered(op, "CPU"), _registered(op, "CUDA")) for op in _OPS},
        "SEQKERNELS_LSTM_BACKEND": os.environ.get("SEQKERNELS_LSTM_BACKEND", "auto (unset)"),
        "CUDA available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["GPU"] = f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)"
        info["cuDNN RNN may use TF32 (float32 follows it)"] = torch.backends.cudnn.allow_tf32
    info["LSTM time loops"] = {
        "cpu": "persistent (float32, no proj_size, B <= 32 under auto) or gemm (BLAS)",
        "cuda": "persistent (no proj_size, B <= 64, B <= 32 at H = 1024; auto: state B*H*bytes "
        "<= 64 KiB forward, <= 32 KiB backward) or cublas" if torch.cuda.is_available() else "no GPU here",
    }
    return info


def show_config() -> None:
    """Print the version, the torch it runs on, whether CUDA kernels were built and for which
    architectures, which ops are registered per device, and which LSTM time loops apply."""
    for key, value in config().items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        else:
            print(f"{key}: {value}")
