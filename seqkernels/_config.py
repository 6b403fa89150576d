"""What this seqkernels build contains and what it will run here: `show_config()` and
`python -m seqkernels`; `lstm_loop_choice()` and `python -m seqkernels --batch B --hidden H`:
which LSTM time loop the `auto` heuristic picks for a shape, and why."""
from __future__ import annotations

import os
import platform

import torch

from . import __version__

# The ops of the schema list (csrc/registration.cpp) when the dispatcher cannot list them.
_KNOWN_OPS = ("lstm_forward", "lstm_backward", "convrnn_forward", "convrnn_backward",
              "convlstm_forward", "convlstm_backward")

# The constants of the C++ heuristics mirrored by lstm_loop_choice (keep them in step).
CPU_PERSISTENT_MAX_BATCH = 32  # kPersistentMaxBatch, csrc/cpu/lstm_persistent.h
CUDA_PERSISTENT_MAX_BATCH = 64  # kMaxBatch, csrc/cuda/lstm_persistent.cu
CUDA_AUTO_MAX_FORWARD_STATE_BYTES = 64 * 1024  # kAutoMaxForwardStateBytes, csrc/cuda/lstm_persistent.cu
CUDA_AUTO_MAX_BACKWARD_STATE_BYTES = 32 * 1024  # kAutoMaxBackwardStateBytes, csrc/cuda/lstm_persistent.cu
_BACKENDS = {"auto": "auto", "persistent": "persistent", "gemm": "gemm", "cublas": "gemm"}


def ops() -> list[str]:
    """The seqkernels ops the dispatcher knows (every schema of csrc/registration.cpp),
    each cell's forward before its backward."""
    try:
        names = [n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("seqkernels::")]
    except AttributeError:  # a torch without the listing: the names this build registers
        names = list(_KNOWN_OPS)
    return sorted(set(names), key=lambda n: (n.rsplit("_", 1)[0], not n.endswith("_forward"), n))


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
        "ops (CPU / CUDA)": {op: (_registered(op, "CPU"), _registered(op, "CUDA")) for op in ops()},
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


def _backend_from_env() -> str:
    """SEQKERNELS_LSTM_BACKEND as csrc/lstm_backend.cpp (lstm_backend_from_env) reads it:
    auto (default), persistent, gemm or cublas (the same loop); anything else is an error."""
    value = os.environ.get("SEQKERNELS_LSTM_BACKEND", "auto")
    if value not in _BACKENDS:
        raise ValueError(f"SEQKERNELS_LSTM_BACKEND must be auto, persistent, gemm or cublas, got '{value}'")
    return _BACKENDS[value]


def lstm_loop_choice(batch: int, hidden: int, dtype: torch.dtype = torch.float32, proj_size: int = 0,
                     device: str = "cpu", backend: str | None = None) -> dict:
    """Which time loop an LSTM layer of this shape runs, and why, for the forward and the
    backward op: a dict ``{"forward": (loop, reason), "backward": (loop, reason)}``.

    Mirrors the C++ selection exactly (change both together):
      CPU:  use_persistent_loop, csrc/cpu/lstm.cpp lines 149-158, with kPersistentMaxBatch
            (csrc/cpu/lstm_persistent.h:42): persistent for float32 without projection;
            under auto only while B <= 32. Forward and backward decide alike.
      CUDA: common_preconditions, csrc/cuda/lstm_persistent.cu lines 1191-1197, and
            auto_prefers_persistent (lines 1041-1059): no projection, 1 <= B <= 64, and under
            auto B * H * sizeof(dtype) <= 64 KiB (forward) / 32 KiB (backward). Python cannot
            mirror what follows at launch (plan(), lines 1149-1160: the block geometry and
            shared memory, 4 or 8 units per block so B <= 32 where 8 are needed, e.g. at
            H = 1024, and the co-residency/occupancy check, then the cooperative launch):
            a persistent choice here is "subject to the occupancy check at launch", which
            falls back to the cuBLAS loop when it fails.
    ``backend`` is SEQKERNELS_LSTM_BACKEND's value (default: read from the environment).
    """
    backend = _BACKENDS[backend] if backend is not None else _backend_from_env()
    if batch < 1 or hidden < 1:
        raise ValueError(f"batch and hidden must be >= 1, got batch={batch}, hidden={hidden}")
    dtype_name = str(dtype).replace("torch.", "")
    if device == "cpu":
        if backend == "gemm":
            choice = ("gemm", "SEQKERNELS_LSTM_BACKEND forces the BLAS loop")
        elif dtype != torch.float32:
            choice = ("gemm", f"the persistent CPU loop is float32 only ({dtype_name} takes the BLAS loop)")
        elif proj_size > 0:
            choice = ("gemm", "the persistent CPU loop has no projection (proj_size > 0 takes the BLAS loop)")
        elif backend == "persistent":
            choice = ("persistent", "SEQKERNELS_LSTM_BACKEND=persistent, and it applies (float32, no projection)")
        elif batch <= CPU_PERSISTENT_MAX_BATCH:
            choice = ("persistent", f"auto: float32, no projection, B = {batch} <= {CPU_PERSISTENT_MAX_BATCH}")
        else:
            choice = ("gemm", f"auto: B = {batch} > {CPU_PERSISTENT_MAX_BATCH}, where the BLAS loop is faster")
        return {"forward": choice, "backward": choice}
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    elem = torch.empty((), dtype=dtype).element_size()
    state = batch * hidden * elem
    launch = "subject to the occupancy check at launch (cuBLAS loop if the grid cannot be co-resident)"
    result = {}
    for op, limit in (("forward", CUDA_AUTO_MAX_FORWARD_STATE_BYTES), ("backward", CUDA_AUTO_MAX_BACKWARD_STATE_BYTES)):
        if backend == "gemm":
            result[op] = ("cublas", "SEQKERNELS_LSTM_BACKEND forces the cuBLAS loop")
        elif proj_size > 0:
            result[op] = ("cublas", "the persistent kernel has no projection (proj_size > 0)")
        elif batch > CUDA_PERSISTENT_MAX_BATCH:
            result[op] = ("cublas", f"B = {batch} > {CUDA_PERSISTENT_MAX_BATCH}, the persistent kernel's limit")
        elif backend == "persistent":
            result[op] = ("persistent", f"SEQKERNELS_LSTM_BACKEND=persistent; {launch}")
        elif state <= limit:
            result[op] = ("persistent", f"auto: state B*H*{elem} bytes = {state / 1024:g} KiB <= {limit // 1024} KiB; "
                                        + launch)
        else:
            result[op] = ("cublas", f"auto: state B*H*{elem} bytes = {state / 1024:g} KiB > {limit // 1024} KiB")
    return result


def show_lstm_choice(batch: int, hidden: int, dtype: torch.dtype = torch.float32, proj_size: int = 0,
                     device: str = "cpu") -> None:
    """Print lstm_loop_choice() for one shape."""
    dtype_name = str(dtype).replace("torch.", "")
    print(f"LSTM time loop for B={batch}, H={hidden}, {dtype_name}, proj_size={proj_size} on {device} "
          f"(SEQKERNELS_LSTM_BACKEND={os.environ.get('SEQKERNELS_LSTM_BACKEND', 'auto')}):")
    if device == "cuda" and not torch.cuda.is_available():
        print("  (no GPU here: what the heuristic would pick on one)")
    for op, (loop, why) in lstm_loop_choice(batch, hidden, dtype, proj_size, device).items():
        print(f"  {op if op == 'forward' else 'backward (training)'}: {loop} ({why})")
