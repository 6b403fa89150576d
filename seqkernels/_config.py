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
CPU_PERSISTENT_MAX_BATCH = 256  # kPersistentMaxBatch, csrc/cpu/lstm_persistent.h
CPU_PERSISTENT_MIN_STEPS = 4  # kPersistentMinSteps, csrc/cpu/lstm.cpp
CPU_PERSISTENT_MIN_STEPS_SMALL_BATCH = 8  # kPersistentMinStepsSmallBatch, B < kPersistentSmallBatch
CPU_PERSISTENT_SMALL_BATCH = 8  # kPersistentSmallBatch
CPU_PROJECTED_BACKWARD_BATCH = 16  # kProjectedBackwardBatch: the projected persistent backward below it
CPU_AMX_MIN_HIDDEN = 384  # kAmxMinHidden, csrc/cpu/lstm_persistent.h
CPU_AMX_MIN_BATCH = 16  # kAmxMinBatch
CPU_AMX_MIN_SEQUENCE_ROWS = 1024  # kAmxMinSequenceRows
# What the CPU's AMX products need (csrc/cpu/amx_x3.h's hardware_available, less the OS's
# permission, which Linux kernels that list these flags grant).
CPU_AMX_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16")
CPU_AMX_BF16_UNITS = 16  # amx::kTileCols: the bfloat16 AMX loop's H granule (amx_bf16_supported)
CPU_AMX_BF16_BACKWARD_UNITS = 64  # kAmxBf16BackwardUnits, csrc/cpu/lstm.cpp
CPU_AMX_BF16_MIN_STEPS_ONE_ROW = 32  # kAmxBf16MinStepsOneRow
CUDA_PERSISTENT_MAX_BATCH = 64  # kMaxBatch, csrc/cuda/lstm_persistent_common.cuh
# csrc/cuda/lstm_loop.cuh (choose_loop)
CUDA_PERSISTENT_MAX_FORWARD_STATE = 64 * 1024  # kPersistentMaxForwardState
CUDA_PERSISTENT_MAX_BACKWARD_STATE = 32 * 1024  # kPersistentMaxBackwardState
CUDA_FUSED_MAX_FORWARD_HIDDEN_FP32 = 512  # kFusedMaxForwardHiddenFp32
CUDA_PERSISTENT_MAX_BACKWARD_BATCH_FP32 = 8  # kPersistentMaxBackwardBatchFp32
CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_FP32 = 512  # kPersistentMaxBackwardHiddenFp32
CUDA_FUSED_MIN_BACKWARD_BATCH_FP32 = 8  # kFusedMinBackwardBatchFp32
CUDA_FUSED_MAX_BACKWARD_BATCH_FP32 = 16  # kFusedMaxBackwardBatchFp32
CUDA_FUSED_MAX_BACKWARD_BH_FP32 = 8 * 1024  # kFusedMaxBackwardBHFp32
CUDA_PERSISTENT_MAX_STATE_MMA = 8 * 1024  # kPersistentMaxStateMma
CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA = 16  # kPersistentMaxForwardBatchMma
# lstm.cu's kX3StepsMinBatch: the cuBLAS loop's split TF32 forward steps, beyond the persistent forward's B
CUDA_X3_STEPS_MIN_BATCH = CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA + 1
# The direct forward kernel's x3 products on fp16 parts (Path::kHalfX3): one batch row per lane, at
# 8 k-steps per warp (H > 512).
CUDA_DIRECT_X3_HALF_MAX_BATCH = 8
CUDA_DIRECT_X3_HALF_ABOVE_HIDDEN = 512
# lstm.cu's kX3HalfDhMinBatch / kX3HalfDhMinUnits and kX3DhMinBatch / kX3DhMinUnits: the replayed
# cuBLAS backward's split dh GEMMs, on fp16 parts where a row part's units fit, else on TF32 parts
CUDA_X3_HALF_DH_MIN_BATCH = 32
CUDA_X3_HALF_DH_MIN_UNITS = 16384
CUDA_X3_DH_MIN_BATCH = 64
CUDA_X3_DH_MIN_UNITS = 49152
CUDA_PERSISTENT_MAX_FORWARD_HIDDEN_HALF = 1024  # kPersistentMaxForwardHiddenHalf
# cluster_forward_applies, csrc/cuda/lstm_persistent.cuh: the persistent forward's cluster kernel
# (16-bit; float32 with or without TF32 up to H = 512, with TF32 at H = 1024 on scaled fp16 operands,
# or up to B = 32 on TF32 operands under SEQKERNELS_LSTM_CLUSTER_HALF=0) at
# 16 < B <= 64, these H, equal batch sizes, sm_90 with >= 128 SMs (kClusterForwardBlocks); at
# H = 1024 also from kClusterForwardMinBatchOneTile (16-bit operands: 16-bit types, and float32 with TF32
# on scaled fp16 operands) or kClusterForwardMinBatchOneTileTf32 (TF32 operands) to B = 16 (one m16
# tile), where the direct kernel runs otherwise
CUDA_CLUSTER_FORWARD_MAX_BATCH = 64
CUDA_CLUSTER_FORWARD_MIN_BATCH_ONE_TILE = 2
CUDA_CLUSTER_FORWARD_MIN_BATCH_ONE_TILE_TF32 = 8
CUDA_CLUSTER_FORWARD_HIDDEN = (256, 512, 1024)
CUDA_CLUSTER_FORWARD_HIDDEN_FLOAT32 = (256, 512)
CUDA_CLUSTER_FORWARD_MAX_BATCH_TF32_1024 = 32
CUDA_CLUSTER_FORWARD_MIN_SMS = 128
# cluster_polls_data, csrc/cuda/lstm_persistent.cuh: where a block gathers at most this many bytes of
# h_{t-1} a step (its rows of its K range), the cluster kernels poll h_{t-1}'s poisoned words without
# waiting for the step flags first
CUDA_CLUSTER_POLL_DATA_MAX_BYTES = 32 * 1024
# kRowSplitBackwardPollDataMaxBytes: the row-split backward's bound on the dG it gathers (its whole range)
CUDA_ROW_SPLIT_BACKWARD_POLL_DATA_MAX_BYTES = 64 * 1024
# cluster_whole_k, csrc/cuda/lstm_persistent.cuh: up to this B the cluster kernel's one-m16-tile
# instances on 16-bit operands (H = 1024) multiply all of K in each block (no partial sums between
# the pair); SEQKERNELS_LSTM_CLUSTER_WHOLE_K=0 never, =1 at any B (diagnostic)
CUDA_CLUSTER_WHOLE_K_MAX_BATCH = 8
# one_cluster_forward_applies, csrc/cuda/lstm_one_cluster.cuh: 16-bit types up to B = kOneClusterMaxRows
# at these H, any batch sizes (packed: at most kMaxSegments distinct ones), sm_90 (one thread-block cluster of H / 32 blocks per 8 batch rows,
# all resident at once: the occupancy API's answer at launch)
CUDA_ONE_CLUSTER_MAX_ROWS = 64
CUDA_ONE_CLUSTER_GROUP_ROWS = 8  # kGroupRows, csrc/cuda/lstm_one_cluster.cu
CUDA_ONE_CLUSTER_HIDDEN = (128, 256, 512)
CUDA_ONE_CLUSTER_SPLIT_K_HIDDEN = 512  # split_k_wanted, csrc/cuda/lstm_one_cluster.cu: warp pairs split K
# one_cluster_wide_sizes, csrc/cuda/lstm_one_cluster.cuh: above B = 16 the 16-bit backward takes the
# persistent loop for the one-cluster backward kernel at H = 256 up to B = kOneClusterMaxRows and at H = 512 up to
# this B (one_cluster_backward_wide), and beyond it up to kOneClusterMaxRows with its clusters in waves
# (one_cluster_waves); a 16-bit packed forward there takes it for the one-cluster forward kernel
CUDA_ONE_CLUSTER_WIDE_MAX_BATCH_512 = 32
# run_backward, csrc/cuda/lstm_one_cluster.cu: 16-bit backward calls of the persistent loop at these H
ONE_CLUSTER_BACKWARD = ("the one-cluster backward kernel where its clusters are resident, packed: at most 64 batch "
                        "sizes, sm_90")
# row_split_backward_applies, csrc/cuda/lstm_persistent.cuh: the persistent backward's row-split kernel
# (16-bit types at H = kRowSplitBackwardHidden up to B = kRowSplitBackwardMaxBatch, equal batch sizes,
# sm_90 with >= 128 SMs), which choose_loop's backward rule takes wherever it applies
CUDA_ROW_SPLIT_BACKWARD_HIDDEN = 1024
CUDA_ROW_SPLIT_BACKWARD_MAX_BATCH = 16
ROW_SPLIT_BACKWARD = ("the row-split backward kernel: 128 blocks of 16 units, each taking half of the batch rows "
                      "for all of K = 4H, equal batch sizes, sm_90 with >= 128 SMs")
CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_TF32 = 1024  # kSplitBackwardMaxHidden, csrc/cuda/lstm_persistent.cuh
CUDA_PERSISTENT_MAX_HIDDEN_MMA = 1024  # kPersistentMaxHiddenMma, csrc/cuda/lstm_persistent.cuh
CUDA_PERSISTENT_BACKWARD_SMALL_BATCH_TF32 = 4  # kPersistentBackwardSmallBatchTf32
CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32 = 16  # kPersistentMaxBackwardBatchTf32
CUDA_CLUSTER_HIDDEN_MULTIPLE = 32  # kClusterHiddenMultiple
CUDA_PERSISTENT_MAX_BACKWARD_BATCH_HALF = 16  # kPersistentMaxBackwardBatchHalf
CUDA_PERSISTENT_MAX_BACKWARD_BH_HALF = 8 * 1024  # kPersistentMaxBackwardBHHalf
CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_HALF = 768  # kPersistentMaxBackwardHiddenHalf
CUDA_FUSED_MAX_BACKWARD_HIDDEN_TF32 = 768  # kFusedMaxBackwardHiddenTf32
CUDA_FUSED_BACKWARD_WIDE_HIDDEN_TF32 = 896  # kFusedBackwardWideHiddenTf32
CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32_WIDE = 5  # kPersistentMaxBackwardBatchTf32Wide
CUDA_CUBLAS_MIN_BACKWARD_BATCH_TF32_WIDE = 8  # kCublasMinBackwardBatchTf32Wide
CUDA_HALF_DH_PARTS = 4  # kHalfDhParts
CUDA_HALF_DH_MIN_UNITS = 64  # kHalfDhMinUnits
CUDA_HALF_DH_MAX_UNITS = 256  # kHalfDhMaxUnits
CUDA_FUSED_MAX_FORWARD_BH = 32 * 1024  # kFusedMaxForwardBH
CUDA_FUSED_MAX_HIDDEN_HALF = 1280  # kFusedMaxHiddenHalf
CUDA_FUSED_BACKWARD_SMALL_BATCH_HALF = 4  # kFusedBackwardSmallBatchHalf
CUDA_FUSED_MAX_BACKWARD_HIDDEN_SMALL_BATCH_HALF = 1792  # kFusedMaxBackwardHiddenSmallBatchHalf
CUDA_FUSED_MAX_FORWARD_HIDDEN_TF32 = 1024  # kFusedMaxForwardHiddenTf32
CUDA_FUSED_MAX_BACKWARD_BATCH = 32  # kFusedMaxBackwardBatch
CUDA_FUSED_MAX_BACKWARD_BH = 20 * 1024  # kFusedMaxBackwardBH
# a ragged packed sequence whose cuBLAS steps are not replayed (T < CUDA_REPLAY_MIN_STEPS), 16-bit: the
# fused forward to this B*H, the fused backward to the next at any B (kFusedMaxForwardBHRaggedHalf,
# kFusedMaxBackwardBHRaggedHalf)
CUDA_FUSED_MAX_FORWARD_BH_RAGGED_HALF = 64 * 1024
CUDA_FUSED_MAX_BACKWARD_BH_RAGGED_HALF = 96 * 1024
CUDA_REPLAY_MIN_STEPS = 16  # kReplaySteps, csrc/cuda/replayed_steps.cuh
CUDA_FUSED_MAX_BACKWARD_BH_TF32 = 8 * 1024  # kFusedMaxBackwardBHTf32
_BACKENDS = {"auto": "auto", "persistent": "persistent", "fused": "fused", "gemm": "gemm", "cublas": "gemm"}


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


# Ops whose kernels, registered for every dispatch key, run another op of the library.
_CALLS = {"lstm_layer": "lstm_forward", "lstm_padded": "lstm_forward", "lstm_cell": "lstm_forward",
          "lstm_backward_recorded": "lstm_backward"}


def _registered(op: str, key: str) -> bool:
    """Whether the op runs on dispatch key ``key``: a kernel for that key, or one for every key
    (CompositeImplicitAutograd: what a schema defined with its function gets, e.g.
    release_step_graphs, which takes no tensor). lstm_layer's, lstm_padded's, lstm_cell's and
    lstm_backward_recorded's kernels are registered for every key (CompositeExplicitAutograd, CompositeImplicitAutograd in
    Python) and run where the op they call does (_CALLS)."""
    op = _CALLS.get(op, op)
    name = f"seqkernels::{op}"
    try:
        return any(torch._C._dispatch_has_kernel_for_dispatch_key(name, k) for k in (key, "CompositeImplicitAutograd"))
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
        # CPU ConvLSTM convolutions: Winograd's or oneDNN's (csrc/cpu/winograd.h)
        "SEQKERNELS_CONV_ALGO": os.environ.get("SEQKERNELS_CONV_ALGO", "auto (unset)"),
        "CUDA available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info["GPU"] = f"{props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} SMs)"
        info["cuDNN RNN may use TF32 (float32 follows it)"] = _rnn_tf32_allowed()
    info["LSTM time loops"] = {
        "cpu": "persistent (float32, bfloat16, float16; no proj_size, B <= 256 and T >= 4, or T >= 8 below B = 8, "
        "under auto; float32 products on AMX tiles from B = 16 and H = 384 where the CPU has AMX-BF16, bfloat16 on "
        "AMX tiles where H % 16 == 0, float16 on the float32 loop) or gemm (BLAS)",
        "cuda": "persistent (no proj_size, B <= 64, B <= 32 at H = 1024), fused (one kernel per step: bf16, "
        "fp16, float32; no proj_size) or cublas; `python -m seqkernels --batch B --hidden H` tells which auto "
        "picks" if torch.cuda.is_available() else "no GPU here",
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
    auto (default), persistent, fused, gemm or cublas (the same loop); anything else is an error."""
    value = os.environ.get("SEQKERNELS_LSTM_BACKEND", "auto")
    if value not in _BACKENDS:
        raise ValueError(f"SEQKERNELS_LSTM_BACKEND must be auto, persistent, fused, gemm or cublas, got '{value}'")
    return _BACKENDS[value]


def _rnn_tf32_allowed() -> bool:
    """Whether float32 RNNs may use TF32 (what the CUDA kernels follow, as cuDNN's RNN does)."""
    rnn = getattr(torch.backends.cudnn, "rnn", None)
    precision = getattr(rnn, "fp32_precision", None)
    if isinstance(precision, str) and precision not in ("none", ""):
        return precision == "tf32"
    try:
        return bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:  # legacy and per-backend flags mixed
        return True


def _cuda_loop(batch: int, hidden: int, elem: int, mma: bool, half: bool, proj_size: int, backward: bool,
               backend: str, clusters: bool, ragged: bool = False, steps: int = 256) -> tuple[str, str]:
    """choose_loop of csrc/cuda/lstm_loop.cuh, then the chosen loop's own limits that Python can
    see (lstm_persistent_common.cuh's common_preconditions, lstm_fused_step.cu's applies), with the reason."""
    loop, why = _choose_cuda_loop(batch, hidden, elem, mma, half, proj_size, backward, backend, clusters, ragged,
                                  steps)
    if loop == "persistent" and (proj_size > 0 or batch > CUDA_PERSISTENT_MAX_BATCH):
        return "cublas", f"{why}; but the persistent kernel takes no projection and B <= {CUDA_PERSISTENT_MAX_BATCH}"
    if loop == "fused" and (proj_size > 0 or elem == 8 or hidden % (16 // elem) != 0):
        return "cublas", (f"{why}; but the fused-step loop needs no projection, bf16/fp16 or float32, and "
                          f"H % {16 // elem} == 0")
    if loop == "persistent":
        why += "; subject to the occupancy check at launch (cuBLAS loop if the grid cannot be co-resident)"
    return loop, why


def _half_dh_units_fit(hidden: int, parts: int) -> bool:
    """half_dh_units_fit (csrc/cuda/lstm_loop.cuh): whether the cuBLAS loop's TF32 dh GEMM can take
    scaled fp16 operands in `parts` K parts (H / parts units a block, whole warps, 64 to 256)."""
    units = hidden // parts
    return hidden % parts == 0 and units % 32 == 0 and CUDA_HALF_DH_MIN_UNITS <= units <= CUDA_HALF_DH_MAX_UNITS


def cluster_half_products() -> bool:
    """cluster_half_products (csrc/cuda/lstm_persistent.cuh): whether float32 with TF32 multiplies on
    scaled fp16 operands in the cluster forward kernel (SEQKERNELS_LSTM_CLUSTER_HALF, diagnostic)."""
    return os.environ.get("SEQKERNELS_LSTM_CLUSTER_HALF", "") != "0"


def _sixteen_bit_operands(elem: int, x3: bool = False) -> bool:
    """cluster_operands (csrc/cuda/lstm_persistent.cuh): whether the cluster kernels multiply 16-bit
    operands: 16-bit types, and float32 with TF32 (not `x3`, without it) on scaled fp16 operands."""
    return elem == 2 or (not x3 and cluster_half_products())


def direct_x3_half_products() -> bool:
    """direct_x3_half_products (csrc/cuda/lstm_persistent.cuh): whether float32 without TF32 multiplies
    on fp16 parts in the direct forward kernel at B <= 8 and H > 512, unless
    SEQKERNELS_LSTM_DIRECT_X3_HALF=0 (diagnostic: TF32 parts)."""
    return os.environ.get("SEQKERNELS_LSTM_DIRECT_X3_HALF", "") != "0"


def cluster_whole_k(batch: int) -> bool:
    """cluster_whole_k (csrc/cuda/lstm_persistent.cuh): whether the cluster forward kernel's
    one-m16-tile instances on 16-bit operands multiply all of K in each block
    (SEQKERNELS_LSTM_CLUSTER_WHOLE_K, diagnostic: "0" never, set otherwise at any B)."""
    setting = os.environ.get("SEQKERNELS_LSTM_CLUSTER_WHOLE_K", "")
    return setting != "0" if setting else batch <= CUDA_CLUSTER_WHOLE_K_MAX_BATCH


def cluster_row_split() -> bool:
    """cluster_row_split (csrc/cuda/lstm_persistent.cuh): whether the calls on 16-bit operands (16-bit
    types; float32 with TF32 on scaled fp16 operands) at H = 1024, B <= 16 run the row-split kernel
    (the pair splits the batch rows, each block all of K; from B = 1, where the direct kernel ran
    before it), unless SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT=0 (diagnostic, which also keeps it from
    B > 16: row_split_wide)."""
    return os.environ.get("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "") != "0"


def row_split_wide() -> bool:
    """row_split_wide (csrc/cuda/lstm_persistent.cuh): whether the row-split kernel also takes the
    calls on 16-bit operands at 16 < B <= 64, H = 1024, unless SEQKERNELS_LSTM_ROW_SPLIT_WIDE=0
    (diagnostic)."""
    return os.environ.get("SEQKERNELS_LSTM_ROW_SPLIT_WIDE", "") != "0"


def one_cluster_backward_switch() -> bool:
    """one_cluster_backward_applies's switch (csrc/cuda/lstm_one_cluster.cu): whether the 16-bit
    backward may run the one-cluster backward kernel, unless SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD=0
    (diagnostic); above B = 16 the rule takes the persistent loop only for it."""
    return os.environ.get("SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD", "") != "0"


def row_split_backward() -> bool:
    """row_split_backward_applies's switch (csrc/cuda/lstm_persistent.cuh): whether the 16-bit backward
    at H = 1024, B <= 16 may run the row-split backward kernel, unless
    SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD=0 (diagnostic)."""
    return os.environ.get("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD", "") != "0"


def _row_split(batch: int, elem: int) -> str:
    """The row-split forward kernel's line (16-bit operands: 16-bit types, or float32 with TF32 on scaled
    fp16 operands; H = 1024; csrc/cuda/lstm_persistent_cluster.cu)."""
    rows = (batch + 1) // 2
    tiles = f"; {-(-rows // 8)} n8 tiles of rows a block" if batch > 16 else ""
    operands = "16-bit types" if elem == 2 else "float32 with TF32 on scaled fp16 operands"
    return (f"the row-split forward kernel: {operands}, H = 1024, equal batch sizes, sm_90 with >= 128 SMs; "
            f"the pair splits the batch rows, each block all of K, each warp gathering its own K eighth{tiles}"
            f"{_cluster_polls(rows, 1024, 2)}")


def _cluster_polls(rows: int, k_range: int, operand_bytes: int, what: str = "h_{t-1}",
                   max_bytes: int = CUDA_CLUSTER_POLL_DATA_MAX_BYTES) -> str:
    """cluster_polls_data (csrc/cuda/lstm_persistent.cuh) for a block that gathers `rows` rows of
    `k_range` values of `what` (h_{t-1}; the backward's dG) a step, `operand_bytes` each, polling up
    to `max_bytes`: the CLI's clause."""
    setting = os.environ.get("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", "")
    gathered = rows * k_range * operand_bytes
    if setting:
        polls, why = setting != "0", f"SEQKERNELS_LSTM_CLUSTER_POLL_DATA={setting}"
    else:
        polls = gathered <= max_bytes
        why = (f"a block gathers {gathered / 1024:g} KiB of {what} a step, {'<=' if polls else '>'} "
               f"{max_bytes // 1024} KiB")
    return (f"; it polls {what} itself, not the step flags ({why})" if polls
            else f"; it waits for the step flags ({why})")


def one_cluster_waves(batch: int, hidden: int) -> bool:
    """one_cluster_waves (csrc/cuda/lstm_one_cluster.cu): whether the one-cluster kernels may run their
    clusters in more than one wave (H = 512 above B = 32, up to B = 64; unless
    SEQKERNELS_LSTM_ONE_CLUSTER_WAVES=0, diagnostic), so that they need one resident cluster, not all."""
    return (os.environ.get("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES", "") != "0" and hidden == 512
            and CUDA_ONE_CLUSTER_WIDE_MAX_BATCH_512 < batch <= CUDA_ONE_CLUSTER_MAX_ROWS)


def paired_groups(batch: int, hidden: int) -> bool:
    """paired_groups (csrc/cuda/lstm_one_cluster.cu): whether the one-cluster kernels may run two batch groups
    in each cluster (equal batch sizes) where one group a cluster cannot have all its clusters resident at
    once: H = 512 above B = 32, up to B = 64; SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS=0 (diagnostic) never, =1 from
    B = 1 and first."""
    mode = os.environ.get("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS", "")
    return (mode != "0" and hidden == 512 and batch <= CUDA_ONE_CLUSTER_MAX_ROWS
            and (mode not in ("", "0") or batch > CUDA_ONE_CLUSTER_WIDE_MAX_BATCH_512))


def _one_cluster_fallbacks(batch: int, hidden: int) -> list[str]:
    """Where not all of the one-cluster kernels' clusters (one per batch group) are resident at once:
    paired groups (unpacked calls), then waves, as their launches try them."""
    pairs = -(-batch // (2 * CUDA_ONE_CLUSTER_GROUP_ROWS))
    return ([f"{pairs} of two batch groups each (equal batch sizes)"] if paired_groups(batch, hidden) else []) + (
        ["in waves"] if one_cluster_waves(batch, hidden) else [])


def _cluster_forward(batch: int, hidden: int, elem: int, clusters: bool, x3: bool = False) -> str | None:
    """cluster_forward_applies (csrc/cuda/lstm_persistent.cuh) at B > 16: why the forward's cluster
    kernel takes the call (16-bit types, or float32 with TF32 or without it, `x3`), or None. 16-bit
    types at H <= 512 first try the one-cluster kernel (_one_cluster)."""
    if not (clusters and CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA < batch <= CUDA_CLUSTER_FORWARD_MAX_BATCH):
        return None
    hiddens = {2: CUDA_CLUSTER_FORWARD_HIDDEN, 4: CUDA_CLUSTER_FORWARD_HIDDEN_FLOAT32}.get(elem, ())
    if hidden in hiddens:
        why = (f"{CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA} < B = {batch} <= {CUDA_CLUSTER_FORWARD_MAX_BATCH} and H = "
               f"{hidden} in {{{', '.join(map(str, hiddens))}}}")
    elif elem == 4 and not x3 and hidden == 1024 and cluster_half_products():
        why = (f"{CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA} < B = {batch} <= {CUDA_CLUSTER_FORWARD_MAX_BATCH} and H = 1024 "
               "with TF32 (scaled fp16 operands)")
    elif elem == 4 and not x3 and hidden == 1024 and batch <= CUDA_CLUSTER_FORWARD_MAX_BATCH_TF32_1024:
        why = (f"{CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA} < B = {batch} <= {CUDA_CLUSTER_FORWARD_MAX_BATCH_TF32_1024} "
               "and H = 1024 with TF32 (TF32 operands: SEQKERNELS_LSTM_CLUSTER_HALF=0)")
    else:
        return None
    sixteen = _sixteen_bit_operands(elem, x3)
    if sixteen and hidden == 1024 and cluster_row_split() and row_split_wide():
        cluster = _row_split(batch, elem)
    else:
        cluster = ("the cluster forward kernel: sm_90 with >= 128 SMs, equal batch sizes"
                   f"{_cluster_polls(batch, hidden // 2, 2 if sixteen else 4)}")
    if elem == 2 and hidden in CUDA_ONE_CLUSTER_HIDDEN:
        return f"{why} ({_one_cluster(batch, hidden)}; else {cluster})"
    return f"{why} ({cluster})"


def _one_cluster_wide(batch: int, hidden: int) -> bool:
    """one_cluster_wide_sizes (csrc/cuda/lstm_one_cluster.cuh): above B = 16, H = 256 up to B = 64 and
    H = 512 up to B = 32, or to B = 64 where the clusters may run in waves."""
    return batch > CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA and (
        (hidden == 256 and batch <= CUDA_ONE_CLUSTER_MAX_ROWS)
        or (hidden == 512 and (batch <= CUDA_ONE_CLUSTER_WIDE_MAX_BATCH_512 or one_cluster_waves(batch, hidden))))


def _one_cluster(batch: int, hidden: int) -> str:
    """The one-cluster forward kernel's line (csrc/cuda/lstm_one_cluster.cuh) for 16-bit types at
    B <= 64 and H in {128, 256, 512}."""
    groups = -(-batch // CUDA_ONE_CLUSTER_GROUP_ROWS)
    split_k = "; warp pairs split K" if hidden == CUDA_ONE_CLUSTER_SPLIT_K_HIDDEN else ""
    resident = "if all are resident at once" + "".join(f", else {f}" for f in _one_cluster_fallbacks(batch, hidden))
    return (f"the one-cluster forward kernel: B = {batch} <= {CUDA_ONE_CLUSTER_MAX_ROWS} and H = {hidden} in "
            f"{{{', '.join(map(str, CUDA_ONE_CLUSTER_HIDDEN))}}}, packed: at most 64 batch sizes, sm_90, {groups} "
            f"cluster{'s' if groups > 1 else ''} of {hidden // 32} blocks {resident}{split_k}")


def _forward_kernel_at_small_batch(batch: int, hidden: int, elem: int, clusters: bool, ragged: bool = False) -> str:
    """The persistent forward's kernel at B <= 16 with tensor cores (cluster_forward_applies,
    csrc/cuda/lstm_persistent.cuh): the one-cluster kernel (16-bit types, H <= 512,
    csrc/cuda/lstm_one_cluster.cuh), the cluster kernel in one m16 tile at H = 1024 from its
    threshold (16-bit, or TF32; equal batch sizes only, as the row-split kernel), else the direct kernel."""
    if clusters and elem == 2 and hidden in CUDA_ONE_CLUSTER_HIDDEN:
        return _one_cluster(batch, hidden)
    if ragged:
        return "the direct forward kernel (the row-split and cluster kernels take equal batch sizes only)"
    sixteen = _sixteen_bit_operands(elem)
    min_batch = CUDA_CLUSTER_FORWARD_MIN_BATCH_ONE_TILE if sixteen else CUDA_CLUSTER_FORWARD_MIN_BATCH_ONE_TILE_TF32
    if clusters and hidden == 1024 and cluster_row_split() and sixteen:
        return _row_split(batch, elem)
    if clusters and hidden == 1024 and batch >= min_batch:
        whole_k = sixteen and cluster_whole_k(batch)
        polls = _cluster_polls(batch, hidden if whole_k else hidden // 2, 2 if sixteen else 4)
        if whole_k:
            polls += "; each block multiplies all of K (no partial sums between the pair)"
        return (f"the cluster forward kernel in one m16 tile: H = 1024 and B >= {min_batch}, equal batch sizes, "
                f"sm_90 with >= 128 SMs{polls}")
    return "the direct forward kernel"


def _choose_cuda_loop(batch: int, hidden: int, elem: int, mma: bool, half: bool, proj_size: int, backward: bool,
                      backend: str, clusters: bool, ragged: bool = False, steps: int = 256) -> tuple[str, str]:
    """choose_loop of csrc/cuda/lstm_loop.cuh, with the reason. ``ragged``: a packed sequence whose batch
    sizes shrink, which the forward's cluster and row-split kernels and the row-split backward do not take
    (``equal_clusters``); below CUDA_REPLAY_MIN_STEPS steps its cuBLAS steps are not replayed (the 16-bit
    fused limits widen: ``unreplayed``)."""
    if backend == "gemm":
        return "cublas", "SEQKERNELS_LSTM_BACKEND forces the cuBLAS loop"
    if backend in ("persistent", "fused"):
        return backend, f"SEQKERNELS_LSTM_BACKEND={backend}"
    if proj_size > 0:
        return "cublas", "only the cuBLAS loop has a projection (proj_size > 0)"
    state = batch * hidden * elem
    equal_clusters = clusters and not ragged
    unreplayed = ragged and steps < CUDA_REPLAY_MIN_STEPS
    one_cluster_backward = backward and half and clusters and hidden in CUDA_ONE_CLUSTER_HIDDEN
    bh = batch * hidden
    kib = f"state B*H*{elem} bytes = {state / 1024:g} KiB"
    if not mma and elem == 4:
        # float32 without TF32: the direct persistent forward and the fused loop multiply on tensor
        # cores all the same (three TF32 MMAs per product).
        what = "auto, float32 without TF32"
        if backward:
            if batch <= CUDA_PERSISTENT_MAX_BACKWARD_BATCH_FP32 and hidden <= CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_FP32:
                return "persistent", (f"{what}: B = {batch} <= {CUDA_PERSISTENT_MAX_BACKWARD_BATCH_FP32} and H = "
                                      f"{hidden} <= {CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_FP32}")
            if batch >= CUDA_FUSED_MIN_BACKWARD_BATCH_FP32 and (batch <= CUDA_FUSED_MAX_BACKWARD_BATCH_FP32
                                                                 or bh <= CUDA_FUSED_MAX_BACKWARD_BH_FP32):
                return "fused", (f"{what}: B = {batch} >= {CUDA_FUSED_MIN_BACKWARD_BATCH_FP32} and (B <= "
                                 f"{CUDA_FUSED_MAX_BACKWARD_BATCH_FP32} or B*H = {bh} <= "
                                 f"{CUDA_FUSED_MAX_BACKWARD_BH_FP32})")
            return "cublas", (f"{what}: neither the persistent nor the fused backward's bounds (its dh steps, "
                              f"replayed, as split GEMMs: on fp16 parts from B = {CUDA_X3_HALF_DH_MIN_BATCH} with "
                              f"B*H >= {CUDA_X3_HALF_DH_MIN_UNITS} where a part's units fit, else on TF32 parts "
                              f"from B = {CUDA_X3_DH_MIN_BATCH} with B*H >= {CUDA_X3_DH_MIN_UNITS})")
        if batch <= CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA:
            parts = ("fp16" if batch <= CUDA_DIRECT_X3_HALF_MAX_BATCH and hidden > CUDA_DIRECT_X3_HALF_ABOVE_HIDDEN
                     and direct_x3_half_products() else "TF32")
            return "persistent", (f"{what}: B = {batch} <= {CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA} (the direct "
                                  f"forward kernel up to H = 1024, its products on {parts} parts)")
        if (why := _cluster_forward(batch, hidden, elem, equal_clusters, x3=True)) is not None:
            return "persistent", f"{what}: {why}"
        if hidden <= CUDA_FUSED_MAX_FORWARD_HIDDEN_FP32 and bh <= CUDA_FUSED_MAX_FORWARD_BH:
            return "fused", (f"{what}: B > {CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA}, H = {hidden} <= "
                             f"{CUDA_FUSED_MAX_FORWARD_HIDDEN_FP32} and B*H = {bh} <= {CUDA_FUSED_MAX_FORWARD_BH}")
        return "cublas", (f"{what}: B > {CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA}, H = {hidden} > "
                          f"{CUDA_FUSED_MAX_FORWARD_HIDDEN_FP32} or B*H = {bh} > {CUDA_FUSED_MAX_FORWARD_BH} "
                          f"(its steps as split TF32 GEMMs from B = {CUDA_X3_STEPS_MIN_BATCH})")
    if not mma:
        limit = CUDA_PERSISTENT_MAX_BACKWARD_STATE if backward else CUDA_PERSISTENT_MAX_FORWARD_STATE
        if state <= limit:
            return "persistent", f"auto, float64: {kib} <= {limit // 1024} KiB"
        return "cublas", f"auto, float64: {kib} > {limit // 1024} KiB"
    if hidden > CUDA_PERSISTENT_MAX_HIDDEN_MMA:
        pass  # beyond the tensor-core persistent kernels' limit (they would leave it to cuBLAS)
    elif not half and not backward:
        if batch <= CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA and state <= CUDA_PERSISTENT_MAX_FORWARD_STATE:
            return "persistent", (f"auto: TF32, B = {batch} <= {CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA} and {kib} "
                                  f"<= {CUDA_PERSISTENT_MAX_FORWARD_STATE // 1024} KiB "
                                  f"({_forward_kernel_at_small_batch(batch, hidden, elem, clusters, ragged)})")
        if (why := _cluster_forward(batch, hidden, elem, equal_clusters)) is not None:
            return "persistent", f"auto: TF32, {why}"
    elif (half and not backward and batch <= CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA
          and hidden <= CUDA_PERSISTENT_MAX_FORWARD_HIDDEN_HALF):
        return "persistent", (f"auto: B = {batch} <= {CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA} and H = {hidden} "
                              f"<= {CUDA_PERSISTENT_MAX_FORWARD_HIDDEN_HALF} "
                              f"({_forward_kernel_at_small_batch(batch, hidden, elem, clusters, ragged)})")
    elif half and not backward and (why := _cluster_forward(batch, hidden, elem, equal_clusters)) is not None:
        return "persistent", f"auto: {why}"
    elif half and not backward and ragged and clusters and _one_cluster_wide(batch, hidden):
        return "persistent", (f"auto: a ragged packed sequence, 16-bit, {CUDA_PERSISTENT_MAX_FORWARD_BATCH_MMA} < B = "
                              f"{batch}, at the one-cluster backward's sizes (packed_one_cluster_forward: "
                              f"{_one_cluster(batch, hidden)})")
    elif (backward and half and equal_clusters and hidden == CUDA_ROW_SPLIT_BACKWARD_HIDDEN
          and batch <= CUDA_ROW_SPLIT_BACKWARD_MAX_BATCH and row_split_backward()):
        return "persistent", (f"auto: backward, 16-bit, H = {hidden} and B = {batch} <= "
                              f"{CUDA_ROW_SPLIT_BACKWARD_MAX_BATCH}: {ROW_SPLIT_BACKWARD}"
                              f"{_cluster_polls((batch + 1) // 2, 4 * hidden, 2, 'dG', CUDA_ROW_SPLIT_BACKWARD_POLL_DATA_MAX_BYTES)}")
    elif one_cluster_backward and _one_cluster_wide(batch, hidden) and one_cluster_backward_switch():
        fallbacks = _one_cluster_fallbacks(batch, hidden)
        not_resident = (f" (where not all its clusters are resident at once: {', else '.join(fallbacks)})"
                        if fallbacks else "")
        limit_512 = (CUDA_ONE_CLUSTER_MAX_ROWS if one_cluster_waves(batch, hidden)
                     else CUDA_ONE_CLUSTER_WIDE_MAX_BATCH_512)
        return "persistent", (f"auto: backward, 16-bit, {CUDA_PERSISTENT_MAX_BACKWARD_BATCH_HALF} < B = {batch} <= "
                              f"{CUDA_ONE_CLUSTER_MAX_ROWS} at H = 256 or {limit_512} at H = 512 (H = {hidden}): "
                              f"{ONE_CLUSTER_BACKWARD}{not_resident}")
    elif state <= CUDA_PERSISTENT_MAX_STATE_MMA:
        kernel = f" ({ONE_CLUSTER_BACKWARD}; else the split or general kernel)" if one_cluster_backward else ""
        return "persistent", f"auto: {kib} <= {CUDA_PERSISTENT_MAX_STATE_MMA // 1024} KiB{kernel}"
    elif (backward and not half and hidden <= CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_TF32
          and (batch <= CUDA_PERSISTENT_BACKWARD_SMALL_BATCH_TF32
               or (batch <= (CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32_WIDE
                             if hidden > CUDA_FUSED_BACKWARD_WIDE_HIDDEN_TF32
                             else CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32)
                   and (hidden > CUDA_FUSED_MAX_BACKWARD_HIDDEN_TF32 or hidden % CUDA_CLUSTER_HIDDEN_MULTIPLE == 0)))):
        return "persistent", (f"auto: TF32 backward, H = {hidden} <= {CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_TF32} and "
                              f"B = {batch} <= {CUDA_PERSISTENT_BACKWARD_SMALL_BATCH_TF32}, or B <= "
                              f"{CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32} ({CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32_WIDE} "
                              f"at H > {CUDA_FUSED_BACKWARD_WIDE_HIDDEN_TF32}) with H > "
                              f"{CUDA_FUSED_MAX_BACKWARD_HIDDEN_TF32} or H % {CUDA_CLUSTER_HIDDEN_MULTIPLE} == 0 (the split "
                              "backward kernel, in clusters where they fit)")
    elif (backward and half and batch <= CUDA_PERSISTENT_MAX_BACKWARD_BATCH_HALF
          and bh <= CUDA_PERSISTENT_MAX_BACKWARD_BH_HALF and hidden <= CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_HALF
          and hidden % CUDA_CLUSTER_HIDDEN_MULTIPLE == 0):
        return "persistent", (f"auto: backward, B = {batch} <= {CUDA_PERSISTENT_MAX_BACKWARD_BATCH_HALF}, B*H = {bh} "
                              f"<= {CUDA_PERSISTENT_MAX_BACKWARD_BH_HALF}, H = {hidden} <= "
                              f"{CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_HALF} and H % {CUDA_CLUSTER_HIDDEN_MULTIPLE} == 0 "
                              + (f"({ONE_CLUSTER_BACKWARD}; else the split backward kernel in clusters)"
                                 if one_cluster_backward else "(the split backward kernel in clusters)"))
    if backward and half:
        if unreplayed and bh <= CUDA_FUSED_MAX_BACKWARD_BH_RAGGED_HALF and hidden <= CUDA_FUSED_MAX_HIDDEN_HALF:
            return "fused", (f"auto: a ragged packed sequence of T = {steps} < {CUDA_REPLAY_MIN_STEPS} (its cuBLAS "
                             f"steps are not replayed), not the persistent loop, B*H = {bh} <= "
                             f"{CUDA_FUSED_MAX_BACKWARD_BH_RAGGED_HALF} and H = {hidden} <= {CUDA_FUSED_MAX_HIDDEN_HALF}")
        if batch <= CUDA_FUSED_MAX_BACKWARD_BATCH and bh <= CUDA_FUSED_MAX_BACKWARD_BH:
            if hidden <= CUDA_FUSED_MAX_HIDDEN_HALF:
                return "fused", (f"auto: not the persistent loop, B = {batch} <= {CUDA_FUSED_MAX_BACKWARD_BATCH}, "
                                 f"B*H = {bh} <= {CUDA_FUSED_MAX_BACKWARD_BH} and H = {hidden} <= "
                                 f"{CUDA_FUSED_MAX_HIDDEN_HALF}")
            if (batch <= CUDA_FUSED_BACKWARD_SMALL_BATCH_HALF
                    and hidden <= CUDA_FUSED_MAX_BACKWARD_HIDDEN_SMALL_BATCH_HALF):
                return "fused", (f"auto: not the persistent loop, B = {batch} <= "
                                 f"{CUDA_FUSED_BACKWARD_SMALL_BATCH_HALF} and H = {hidden} <= "
                                 f"{CUDA_FUSED_MAX_BACKWARD_HIDDEN_SMALL_BATCH_HALF}")
        return "cublas", (f"auto: B = {batch} > {CUDA_FUSED_MAX_BACKWARD_BATCH}, B*H = {bh} > "
                          f"{CUDA_FUSED_MAX_BACKWARD_BH} or H = {hidden} > {CUDA_FUSED_MAX_HIDDEN_HALF} (and not B <= "
                          f"{CUDA_FUSED_BACKWARD_SMALL_BATCH_HALF} with H <= "
                          f"{CUDA_FUSED_MAX_BACKWARD_HIDDEN_SMALL_BATCH_HALF})")
    if backward:
        if bh <= CUDA_FUSED_MAX_BACKWARD_BH_TF32 and hidden <= CUDA_FUSED_MAX_BACKWARD_HIDDEN_TF32:
            return "fused", (f"auto: TF32, B*H = {bh} <= {CUDA_FUSED_MAX_BACKWARD_BH_TF32} and H <= "
                             f"{CUDA_FUSED_MAX_BACKWARD_HIDDEN_TF32}")
        half_dh = batch >= CUDA_CUBLAS_MIN_BACKWARD_BATCH_TF32_WIDE and _half_dh_units_fit(hidden, CUDA_HALF_DH_PARTS)
        if (CUDA_FUSED_BACKWARD_WIDE_HIDDEN_TF32 < hidden <= CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_TF32
                and batch <= CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32 and not half_dh):
            return "fused", (f"auto: TF32, {CUDA_FUSED_BACKWARD_WIDE_HIDDEN_TF32} < H = {hidden} <= "
                             f"{CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_TF32} and "
                             f"{CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32_WIDE} < B = {batch} <= "
                             f"{CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32}")
        return "cublas", (f"auto: TF32, B*H = {bh} > {CUDA_FUSED_MAX_BACKWARD_BH_TF32} or H = {hidden} > "
                          f"{CUDA_FUSED_MAX_BACKWARD_HIDDEN_TF32}, and not {CUDA_FUSED_BACKWARD_WIDE_HIDDEN_TF32} < H <= "
                          f"{CUDA_PERSISTENT_MAX_BACKWARD_HIDDEN_TF32} with B <= "
                          f"{CUDA_PERSISTENT_MAX_BACKWARD_BATCH_TF32} (from B = "
                          f"{CUDA_CUBLAS_MIN_BACKWARD_BATCH_TF32_WIDE} where H / {CUDA_HALF_DH_PARTS} is a multiple of "
                          f"32 in [{CUDA_HALF_DH_MIN_UNITS}, {CUDA_HALF_DH_MAX_UNITS}] the cuBLAS loop's "
                          "dh GEMM runs on scaled fp16 operands)")
    max_hidden = CUDA_FUSED_MAX_HIDDEN_HALF if half else CUDA_FUSED_MAX_FORWARD_HIDDEN_TF32
    if (half and unreplayed and CUDA_FUSED_MAX_FORWARD_BH < bh <= CUDA_FUSED_MAX_FORWARD_BH_RAGGED_HALF
            and hidden <= max_hidden):
        return "fused", (f"auto: a ragged packed sequence of T = {steps} < {CUDA_REPLAY_MIN_STEPS} (its cuBLAS "
                         f"steps are not replayed), B*H = {bh} <= {CUDA_FUSED_MAX_FORWARD_BH_RAGGED_HALF} and "
                         f"H = {hidden} <= {max_hidden}")
    if bh <= CUDA_FUSED_MAX_FORWARD_BH and hidden <= max_hidden:
        return "fused", f"auto: B*H = {bh} <= {CUDA_FUSED_MAX_FORWARD_BH} and H = {hidden} <= {max_hidden}"
    return "cublas", f"auto: B*H = {bh} > {CUDA_FUSED_MAX_FORWARD_BH} or H = {hidden} > {max_hidden}"


def _cpu_flags() -> set[str]:
    """The ISA flags /proc/cpuinfo lists (empty off x86 Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_amx(flags: set[str]) -> bool:
    """Whether the CPU's products may run on AMX tiles here (amx_mode() != 0 with the AVX-512 kernels)."""
    return ("avx512f" in flags and os.environ.get("SEQKERNELS_CPU_AVX512") != "0"
            and set(CPU_AMX_FLAGS) <= flags and os.environ.get("SEQKERNELS_CPU_AMX", "") != "0")


def cpu_products(batch: int, hidden: int, steps: int = 256) -> str:
    """Which kernels the persistent CPU loop's products run on for B = batch, H = hidden and
    T = steps, on this CPU and under SEQKERNELS_CPU_AVX512 / SEQKERNELS_CPU_AMX. Mirrors
    cpu_kernels, amx_products and amx_sequence_products (csrc/cpu/lstm_persistent.h) and their
    use in csrc/cpu/lstm.cpp."""
    flags = _cpu_flags()
    if "avx512f" not in flags or os.environ.get("SEQKERNELS_CPU_AVX512") == "0":
        return "AVX2"
    if not _cpu_amx(flags):
        return "AVX-512"
    forced = os.environ.get("SEQKERNELS_CPU_AMX", "") != ""
    sequence = forced or (batch * steps >= CPU_AMX_MIN_SEQUENCE_ROWS and hidden >= CPU_AMX_MIN_HIDDEN)
    if sequence and (forced or batch >= CPU_AMX_MIN_BATCH):
        return "AMX tiles"
    if sequence:
        return f"AVX-512, the whole-sequence products on AMX tiles (T*B >= {CPU_AMX_MIN_SEQUENCE_ROWS} rows)"
    return "AVX-512"


def _both(choice: tuple[str, str]) -> dict:
    """The same (loop, reason) for the forward and the backward op."""
    return {"forward": choice, "backward": choice}


def _cpu_choice(batch: int, hidden: int, dtype: torch.dtype, proj_size: int, backend: str, steps: int) -> dict:
    """lstm_loop_choice on the CPU: use_persistent_forward, use_persistent_backward, amx_bf16_loop_applies,
    amx_bf16_backward_applies and half_via_float_loop (csrc/cpu/lstm.cpp)."""
    dtype_name = str(dtype).replace("torch.", "")
    if backend in ("gemm", "fused"):
        choice = ("gemm", f"SEQKERNELS_LSTM_BACKEND={backend}: the BLAS loop (the CPU has no fused-step loop)")
        return _both(choice)
    if dtype == torch.float64:
        choice = ("gemm", "float64 takes the BLAS loop (the persistent CPU loops are float32, bfloat16, float16)")
        return _both(choice)
    if proj_size > 0 and dtype != torch.float32:
        choice = ("gemm", f"with a projection only float32 has a persistent CPU loop ({dtype_name}: the BLAS loop)")
        return _both(choice)
    projection = f"proj_size = {proj_size}" if proj_size > 0 else "no projection"
    # persistent_loop_wanted
    if backend == "persistent":
        why = f"SEQKERNELS_LSTM_BACKEND=persistent, and it applies ({dtype_name}, {projection})"
    elif batch > CPU_PERSISTENT_MAX_BATCH:
        choice = ("gemm", f"auto: B = {batch} > {CPU_PERSISTENT_MAX_BATCH}, where the BLAS loop is faster")
        return _both(choice)
    else:
        min_steps = CPU_PERSISTENT_MIN_STEPS_SMALL_BATCH if batch < CPU_PERSISTENT_SMALL_BATCH else CPU_PERSISTENT_MIN_STEPS
        if steps < min_steps:
            choice = ("gemm", f"auto: T = {steps} < {min_steps} steps at B = {batch}: too few to pay for packing "
                              "the weights (the persistent loop packs them on every call)")
            return _both(choice)
        why = f"auto: {dtype_name}, {projection}, B = {batch} <= {CPU_PERSISTENT_MAX_BATCH}, T = {steps} >= {min_steps}"
    if dtype == torch.float32 and proj_size > 0:
        # use_persistent_forward / use_persistent_backward: forward_persistent_projected and, under auto
        # below CPU_PROJECTED_BACKWARD_BATCH rows, backward_persistent_projected.
        forward = ("persistent", f"{why}; the projection h_t = m_t W_hr^T as a second phase of each step (dot "
                                 "products), the recurrent products on the tile kernels")
        if backend != "persistent" and batch >= CPU_PROJECTED_BACKWARD_BATCH:
            return {"forward": forward,
                    "backward": ("gemm", f"auto: proj_size > 0 and B = {batch} >= {CPU_PROJECTED_BACKWARD_BATCH}: "
                                         "the BLAS loop (the persistent backward's dot products were as fast or "
                                         "slower there)")}
        return {"forward": forward,
                "backward": ("persistent", f"{why}; two phases a step: dL/dh's columns (dot products with "
                                           "W_hh^T, plus grad_y), then dL/dm = dL/dh W_hr and the gate backward "
                                           "of each part's units")}
    if dtype == torch.float32:
        choice = ("persistent", f"{why}; products on {cpu_products(batch, hidden, steps)}")
        return _both(choice)
    if dtype == torch.bfloat16 and _cpu_amx(_cpu_flags()) and hidden % CPU_AMX_BF16_UNITS == 0:
        if backend != "persistent" and batch == 1 and steps < CPU_AMX_BF16_MIN_STEPS_ONE_ROW:
            choice = ("gemm", f"auto: one sequence of T = {steps} < {CPU_AMX_BF16_MIN_STEPS_ONE_ROW} steps: MKL's "
                              "bfloat16 matrix-vector products beat the AMX loop's packing")
            return _both(choice)
        forward = ("persistent", f"{why}; bfloat16 on AMX tiles")
        if hidden % CPU_AMX_BF16_BACKWARD_UNITS == 0:
            return _both(forward)
        return {"forward": forward, "backward": ("gemm", f"the AMX backward needs H % {CPU_AMX_BF16_BACKWARD_UNITS} "
                                                         f"== 0 (H = {hidden}): the BLAS loop")}
    choice = ("persistent", f"{why}; {dtype_name} on the float32 loop (operands converted), products on "
                            f"{cpu_products(batch, hidden, steps)}")
    return _both(choice)


def lstm_loop_choice(batch: int, hidden: int, dtype: torch.dtype = torch.float32, proj_size: int = 0,
                     device: str = "cpu", backend: str | None = None, tf32: bool | None = None,
                     steps: int = 256, clusters: bool | None = None, ragged: bool = False) -> dict:
    """Which time loop an LSTM layer of this shape runs, and why, for the forward and the
    backward op: a dict ``{"forward": (loop, reason), "backward": (loop, reason)}``.

    Mirrors the C++ selection exactly (change both together):
      CPU:  use_persistent_forward, use_persistent_backward, amx_bf16_loop_applies,
            amx_bf16_backward_applies and half_via_float_loop, csrc/cpu/lstm.cpp, with
            kPersistentMaxBatch (csrc/cpu/lstm_persistent.h): persistent for float32 (with a
            projection the backward only below B = 16), and without projection for bfloat16
            (on AMX tiles where the CPU has them and H % 16 == 0, the backward H % 64 == 0;
            one sequence from T = 32) and float16 (and bfloat16 off the tiles: the float32 loop
            on converted operands); under auto only while B <= 256 and the sequence has at
            least 4 steps (8 below B = 8). The reason names the kernels of the float32 loop's
            products (cpu_products).
      CUDA: choose_loop, csrc/cuda/lstm_loop.cuh: persistent, fused (one kernel per step) or
            cublas, by dtype, B, H and the state size B * H * sizeof(dtype); forward and backward
            separately. What the chosen loop checks at launch is not mirrored: the persistent
            kernel's limits (B <= 64; 4 or 8 units per block, so B <= 32 where 8 are needed,
            e.g. at H = 1024) and its occupancy check; the fused loop's (bf16/fp16/TF32 only,
            H % 8 == 0 for 16-bit types and H % 4 == 0 for TF32, 16-byte aligned h0, shared
            memory). Where those fail, the cuBLAS loop runs.
    ``backend`` is SEQKERNELS_LSTM_BACKEND's value (default: read from the environment);
    ``tf32`` whether float32 RNNs may use TF32 (default: PyTorch's cuDNN RNN setting);
    ``steps`` the sequence length T (the CPU's choice depends on it; default the suite's 256);
    ``clusters`` whether the GPU runs the forward's cluster kernel (thread-block clusters,
    sm_90, and at least 128 SMs; default: the current CUDA device's answer, or True without one).
    ``ragged``: a PackedSequence whose batch sizes shrink (default: equal batch sizes at every step;
    CUDA only). The forward's cluster and row-split kernels and the row-split backward do not take it
    (packed_one_cluster_forward in their place at the one-cluster backward's sizes), and below
    T = 16 steps, where the cuBLAS loop does not replay its steps, its 16-bit calls beyond the rules
    above take the fused loop up to B*H = 65536 (forward) and 98304 (backward)
    (csrc/cuda/lstm_loop.cuh, kFusedMaxForwardBHRaggedHalf / kFusedMaxBackwardBHRaggedHalf).
    """
    backend = _BACKENDS[backend] if backend is not None else _backend_from_env()
    if batch < 1 or hidden < 1 or steps < 1:
        raise ValueError(f"batch, hidden and steps must be >= 1, got batch={batch}, hidden={hidden}, steps={steps}")
    if device == "cpu":
        return _cpu_choice(batch, hidden, dtype, proj_size, backend, steps)
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    elem = torch.empty((), dtype=dtype).element_size()
    half = dtype in (torch.float16, torch.bfloat16)
    if tf32 is None:
        tf32 = _rnn_tf32_allowed()
    mma = half or (dtype == torch.float32 and tf32)
    if clusters is None:
        clusters = _device_runs_clusters()
    return {op: _cuda_loop(batch, hidden, elem, mma, half, proj_size, op == "backward", backend, clusters, ragged,
                           steps)
            for op in ("forward", "backward")}


def _device_runs_clusters() -> bool:
    """Whether the current CUDA device meets cluster_forward_applies's device conditions (True
    without a CUDA device: the GPUs the package is tuned on, H100 and H200, do)."""
    if not torch.cuda.is_available():
        return True
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return props.major >= 9 and props.multi_processor_count >= CUDA_CLUSTER_FORWARD_MIN_SMS


def show_lstm_choice(batch: int, hidden: int, dtype: torch.dtype = torch.float32, proj_size: int = 0,
                     device: str = "cpu", steps: int = 256, ragged: bool = False) -> None:
    """Print lstm_loop_choice() for one shape."""
    dtype_name = str(dtype).replace("torch.", "")
    packed = ", a ragged PackedSequence" if ragged else ""
    print(f"LSTM time loop for T={steps}, B={batch}, H={hidden}, {dtype_name}, proj_size={proj_size}{packed} on "
          f"{device} (SEQKERNELS_LSTM_BACKEND={os.environ.get('SEQKERNELS_LSTM_BACKEND', 'auto')}):")
    if device == "cuda" and not torch.cuda.is_available():
        print("  (no GPU here: what the heuristic would pick on one)")
    for op, (loop, why) in lstm_loop_choice(batch, hidden, dtype, proj_size, device, steps=steps,
                                            ragged=ragged).items():
        print(f"  {op if op == 'forward' else 'backward (training)'}: {loop} ({why})")
