"""The three CUDA time loops of the LSTM, each forced with SEQKERNELS_LSTM_BACKEND: the
persistent kernel (csrc/cuda/lstm_persistent.cu: one cooperative launch per layer and
direction), the fused-step loop (csrc/cuda/lstm_fused_step.cu: one kernel per step, GEMM and
gate math fused, steps overlapped by programmatic dependent launch) and the cuBLAS loop
(csrc/cuda/lstm.cu: a GEMM and a pointwise kernel per step). A forced loop that does not
apply to a case (e.g. the fused loop in float64) runs the cuBLAS loop, which must be right too.

Ground truth: seqkernels.reference (a plain loop, autograd) and torch.nn.LSTM, both on the
CPU in float64 with the same weights. Tolerances, relative to max(1, max|expected|):
  float64                 1e-10
  float32, TF32 off       3e-5
  float32, TF32 on        5e-3 (TF32 operands carry 10 mantissa bits)
  bfloat16 / float16      err(kernel) <= 2 * err(the reference computed in that dtype on the
                          GPU) + eps, errors against the float64 reference (design.md's rule)
Everything here needs a GPU (marker `cuda`); without one the tests skip.

Shape legend: T steps, B batch, I input, H hidden, G = 4H, N packed rows.
"""
from __future__ import annotations

import contextlib
import copy
import os
import random
import re

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import seqkernels
from seqkernels import lstm_layer
from seqkernels._config import lstm_loop_choice
from seqkernels.reference import lstm_layer_reference
from _helpers import bytes_freed_by_release, check_cuda_graph_replays, lstm_training_results, max_abs

pytestmark = pytest.mark.cuda

BACKENDS = ("persistent", "fused", "cublas")
# "tf32" is float32 with TF32 allowed for RNNs (torch.backends.cudnn.allow_tf32, which the
# kernels follow exactly as cuDNN does); "float32" has it off.
PRECISIONS = ("float64", "float32", "tf32", "bfloat16", "float16")
DTYPE = {"float64": torch.float64, "float32": torch.float32, "tf32": torch.float32,
         "bfloat16": torch.bfloat16, "float16": torch.float16}
TOL = {"float64": 1e-10, "float32": 3e-5, "tf32": 5e-3}
LOW = ("bfloat16", "float16")


@pytest.fixture(autouse=True)
def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", request.param)
    return request.param


class _Precision:
    """Sets the TF32 switches for one precision and restores them afterwards."""

    def __init__(self, precision: str):
        self.tf32 = precision == "tf32"

    def __enter__(self):
        m = torch.backends.cuda.matmul
        self.saved = (torch.backends.cudnn.allow_tf32, m.allow_tf32, m.allow_bf16_reduced_precision_reduction,
                      m.allow_fp16_reduced_precision_reduction)
        torch.backends.cudnn.allow_tf32 = self.tf32
        m.allow_tf32 = False  # the low-precision baselines' matmuls: as accurate as they can be
        m.allow_bf16_reduced_precision_reduction = False
        m.allow_fp16_reduced_precision_reduction = False
        return self

    def __exit__(self, *exc):
        m = torch.backends.cuda.matmul
        (torch.backends.cudnn.allow_tf32, m.allow_tf32, m.allow_bf16_reduced_precision_reduction,
         m.allow_fp16_reduced_precision_reduction) = self.saved


@pytest.fixture(params=PRECISIONS)
def precision(request):
    with _Precision(request.param):
        yield request.param


def check(got: dict, ref64: dict, precision: str, what: str, baselines: list[dict] | None = None) -> None:
    """got (on the GPU, in the precision's dtype) against the float64 reference, key by key."""
    assert got.keys() == ref64.keys(), f"{what}: {sorted(got)} != {sorted(ref64)}"
    for key, ref in ref64.items():
        a = got[key].detach().double().cpu()
        r = ref.detach().double().cpu()
        assert a.shape == r.shape, f"{what} {key}: shape {tuple(a.shape)} != {tuple(r.shape)}"
        assert torch.isfinite(a).all(), f"{what} {key}: non-finite values"
        err = max_abs(a - r)
        scale = max(1.0, max_abs(r))
        if precision in LOW:
            base = max(max_abs(b[key].detach().double().cpu() - r) for b in baselines)
            bound = 2 * base + torch.finfo(DTYPE[precision]).eps * max_abs(r) + 1e-6
            assert err <= bound, f"{what} {key} ({precision}): error {err:.3g} > 2 * {base:.3g} + eps"
        else:
            bound = TOL[precision] * scale
            assert err <= bound, f"{what} {key} ({precision}): error {err:.3g} > {bound:.3g}"


# --------------------------------------------------------------------------------------
# The layer op against the reference loop
# --------------------------------------------------------------------------------------
def layer_case(batch_sizes: list[int], I: int, H: int, bias: bool, seed: int, P: int = 0):
    """float64 CPU inputs and weights (nn.LSTM's init range), and float64 upstream gradients.
    P > 0: a projection (w_hr [P, H]; h0, W_hh's columns, y and h_n of Hout = P)."""
    gen = torch.Generator().manual_seed(seed)
    N, B = sum(batch_sizes), batch_sizes[0]
    Hout = P or H
    bound = H**-0.5

    def u(*shape):
        return (torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound

    t = {
        "x": torch.randn(N, I, generator=gen, dtype=torch.float64),
        "h0": torch.randn(B, Hout, generator=gen, dtype=torch.float64) * 0.5,
        "c0": torch.randn(B, H, generator=gen, dtype=torch.float64) * 0.5,
        "w_ih": u(4 * H, I),
        "w_hh": u(4 * H, Hout),
    }
    if bias:
        t["b_ih"], t["b_hh"] = u(4 * H), u(4 * H)
    if P:
        t["w_hr"] = u(P, H)
    up = {"y": torch.randn(N, Hout, generator=gen, dtype=torch.float64),
          "h_n": torch.randn(B, Hout, generator=gen, dtype=torch.float64),
          "c_n": torch.randn(B, H, generator=gen, dtype=torch.float64)}
    return t, up


def run_layer(fn, tensors: dict, upstream: dict, batch_sizes: list[int], reverse: bool, dtype, device) -> dict:
    """fn(x, bs, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse=) -> (y, h_n, c_n); returns the
    outputs and the gradients of every tensor input for sum(output * upstream)."""
    leaves = {k: v.to(device=device, dtype=dtype).requires_grad_(True) for k, v in tensors.items()}
    bs = torch.tensor(batch_sizes, dtype=torch.int64)
    y, h, c = fn(leaves["x"], bs, leaves["h0"], leaves["c0"], leaves["w_ih"], leaves["w_hh"],
                 leaves.get("b_ih"), leaves.get("b_hh"), leaves.get("w_hr"), reverse=reverse)
    outs = {"y": y, "h_n": h, "c_n": c}
    loss = sum(o.double().mul(upstream[k].to(device)).sum() for k, o in outs.items())
    grads = torch.autograd.grad(loss, list(leaves.values()))
    res = {k: o.detach() for k, o in outs.items()}
    res.update({f"grad_{k}": g for k, g in zip(leaves, grads)})
    return res


def _reference(x, bs, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr=None, reverse=False):
    return lstm_layer_reference(x, bs, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse=reverse)


def compare_layer(batch_sizes, I, H, reverse, bias, precision, seed=0, what="lstm_layer", x_scale=1.0, P=0):
    dtype = DTYPE[precision]
    t, up = layer_case(batch_sizes, I, H, bias, seed, P)
    t["x"] *= x_scale
    got = run_layer(lstm_layer, t, up, batch_sizes, reverse, dtype, "cuda")
    ref64 = run_layer(_reference, t, up, batch_sizes, reverse, torch.float64, "cpu")
    baselines = None
    if precision in LOW:
        baselines = [run_layer(_reference, t, up, batch_sizes, reverse, dtype, "cuda")]
    check(got, ref64, precision, f"{what} B={batch_sizes[0]} H={H} reverse={reverse}", baselines)


# (B, H): every batch-size and hidden-size class of the persistent kernel: H = 1 and 7 (one
# block, padded units), 64 and 256 (4 units per block), 1024 (8 units per block, the X tile
# loaded in column chunks for float32 and at B = 32); B = 17, 32 and 64 need several m16
# tiles. B = 64 at H = 1024 is beyond the persistent kernel (U * B > 256): forced, it falls
# back to the cuBLAS loop, which must be right too. The fused-step loop: H = 1 and 7 are
# beyond it (H % 8 for 16-bit types, H % 4 for TF32); H = 64 / 256 / 1024 take 2 / 2 / 8
# units per block; B = 17, 32, 64 take 2 and 4 m16 tiles per block, B = 200 two batch blocks
# of 8 tiles (one partly empty), H = 40 a K tail inside a chunk.
SHAPES = [(1, 1), (3, 7), (16, 64), (17, 256), (64, 256), (1, 1024), (16, 1024), (32, 1024), (64, 1024), (200, 64),
          (5, 40)]


@pytest.mark.parametrize("B,H", SHAPES)
def test_layer_matches_reference(backend, precision, B, H):
    compare_layer([B] * 5, 9, H, reverse=False, bias=True, precision=precision, seed=B * 1000 + H)


@pytest.mark.parametrize("B,H", [(3, 7), (17, 256), (16, 1024)])
def test_layer_reverse_matches_reference(backend, precision, B, H):
    compare_layer([B] * 5, 9, H, reverse=True, bias=True, precision=precision, seed=B * 1000 + H + 1)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_sizes,H", [([17, 17, 9, 3, 3, 1], 64), ([5, 4, 4, 2, 1], 7), ([64, 40, 40, 1], 256)])
def test_layer_packed_matches_reference(backend, precision, batch_sizes, H, reverse):
    """Packed rows (sequences ending at different steps), both directions: sequences that
    start late in reverse take h0/c0, the others keep their state."""
    compare_layer(batch_sizes, 6, H, reverse=reverse, bias=False, precision=precision, seed=sum(batch_sizes))


@pytest.mark.parametrize("precision_name", ["float32", "bfloat16"])
def test_layer_long_sequence(backend, precision_name):
    """300 steps: the exchange buffers alternate many times."""
    with _Precision(precision_name):
        compare_layer([2] * 300, 4, 32, reverse=False, bias=True, precision=precision_name, seed=7)


def test_single_step(backend, precision):
    compare_layer([3], 5, 40, reverse=False, bias=True, precision=precision, seed=11)


# --------------------------------------------------------------------------------------
# The module against nn.LSTM (float64 on the CPU)
# --------------------------------------------------------------------------------------
def module_results(module, x, hx, upstream, device, dtype, packed_lengths=None):
    x = x.to(device=device, dtype=dtype).requires_grad_(True)
    hx = tuple(s.to(device=device, dtype=dtype).requires_grad_(True) for s in hx)
    inp = pack_padded_sequence(x, packed_lengths, enforce_sorted=False) if packed_lengths is not None else x
    out, (h, c) = module(inp, hx)
    out = out.data if packed_lengths is not None else out
    outs = {"output": out, "h_n": h, "c_n": c}
    loss = sum(o.double().mul(upstream[k].to(device)).sum() for k, o in outs.items())
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(loss, [x, *hx, *params.values()])
    res = {k: o.detach() for k, o in outs.items()}
    res["grad_x"], res["grad_h0"], res["grad_c0"] = grads[0], grads[1], grads[2]
    res.update({f"grad_{k}": g for k, g in zip(params, grads[3:])})
    return res


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("B,H", [(3, 16), (17, 64)])
def test_module_matches_nn_lstm(backend, precision, B, H, packed):
    """Two layers, bidirectional (reverse direction), optionally a PackedSequence with
    unsorted lengths: outputs, h_n, c_n and all gradients against nn.LSTM in float64."""
    dtype = DTYPE[precision]
    torch.manual_seed(B + H + packed)
    T, I = 6, 5
    ref = nn.LSTM(I, H, num_layers=2, bidirectional=True).double()
    ours = seqkernels.LSTM(I, H, num_layers=2, bidirectional=True).to(device="cuda", dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(T, B, I, dtype=torch.float64)
    hx = (torch.randn(4, B, H, dtype=torch.float64), torch.randn(4, B, H, dtype=torch.float64))
    lengths = torch.randint(1, T + 1, (B,)) if packed else None
    if packed:
        lengths[0] = T
    n_rows = int(lengths.sum()) if packed else None
    upstream = {"output": torch.randn(n_rows, 2 * H, dtype=torch.float64) if packed
                else torch.randn(T, B, 2 * H, dtype=torch.float64),
                "h_n": torch.randn(4, B, H, dtype=torch.float64), "c_n": torch.randn(4, B, H, dtype=torch.float64)}
    got = module_results(ours, x, hx, upstream, "cuda", dtype, lengths)
    ref64 = module_results(ref, x, hx, upstream, "cpu", torch.float64, lengths)
    baselines = None
    if precision in LOW:
        peer = copy.deepcopy(ref).to(device="cuda", dtype=dtype)  # cuDNN in the same dtype
        baselines = [module_results(peer, x, hx, upstream, "cuda", dtype, lengths)]
    check(got, ref64, precision, f"seqkernels.LSTM B={B} H={H} packed={packed}", baselines)


# --------------------------------------------------------------------------------------
# Which path ran: the profiler sees the kernels by name
# --------------------------------------------------------------------------------------
def kernel_counts(fn) -> dict[str, int]:
    """How many times each CUDA kernel (by name) ran during fn() (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.key: e.count for e in prof.key_averages()}


def kernel_names(fn) -> set[str]:
    """The names of the CUDA kernels that ran during fn()."""
    return set(kernel_counts(fn))


def loop_kernels(fn) -> set[str]:
    """Which native loop kernels ran during fn(): "persistent forward", "fused backward", ..."""
    names = kernel_names(fn)
    found = set()
    for loop, pattern in (("persistent", "lstm_persistent_{}_"), ("fused", "lstm_fused_{}_")):
        for kind in ("forward", "backward"):
            if any(pattern.format(kind) in n for n in names):
                found.add(f"{loop} {kind}")
    return found


def persistent_kernels(fn) -> set[str]:
    """Which persistent kernels ("forward", "backward") ran during fn()."""
    return {k.split()[1] for k in loop_kernels(fn) if k.startswith("persistent")}


def _train_call(dtype, B, H, T=4, proj_size=0):
    torch.manual_seed(0)
    model = seqkernels.LSTM(H, H, proj_size=proj_size).to(device="cuda", dtype=dtype)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype, requires_grad=True)

    def run():
        y, _ = model(x)
        y.float().sum().backward()

    return run


@pytest.mark.parametrize(
    "precision_name,B,H",
    [("bfloat16", 1, 1024), ("bfloat16", 16, 1024), ("bfloat16", 32, 1024), ("bfloat16", 64, 256),
     ("float16", 17, 256), ("tf32", 16, 1024), ("tf32", 32, 1024), ("float32", 16, 1024), ("float32", 1, 256),
     ("float64", 3, 7), ("float64", 16, 256), ("bfloat16", 16, 256), ("tf32", 64, 256), ("bfloat16", 256, 256),
     ("bfloat16", 1, 1280), ("tf32", 16, 1280), ("bfloat16", 2, 1792), ("float32", 1, 1024), ("float32", 32, 1024)],
)
def test_loop_choice_is_taken(monkeypatch, precision_name, B, H):
    """Forced, the persistent kernels run (within their limits); auto runs, for the forward and
    the backward op separately, what seqkernels._config.lstm_loop_choice (the Python mirror of
    csrc/cuda/lstm_loop.cuh) says; cublas / gemm run neither native loop."""
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()  # warm-up (cuBLAS handles, profiler start-up stay out of the check)
        monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
        choice = lstm_loop_choice(B, H, dtype, 0, "cuda")
        auto = {f"{loop} {op}" for op, (loop, _) in choice.items() if loop != "cublas"}
        # The persistent kernels' limits: B <= 64; H <= 1024 on tensor cores.
        persistent = {"persistent forward", "persistent backward"} if B <= 64 and H <= 1024 else set()
        for value, expected in (("persistent", persistent), ("auto", auto), ("cublas", set()), ("gemm", set())):
            monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", value)
            assert loop_kernels(run) == expected, f"SEQKERNELS_LSTM_BACKEND={value}: {choice}"


@pytest.mark.parametrize("precision_name,B,H,applies", [
    ("bfloat16", 1, 1024, True), ("bfloat16", 64, 1024, True), ("float16", 17, 256, True), ("tf32", 16, 1024, True),
    ("tf32", 256, 512, True), ("float32", 16, 256, True), ("float32", 1, 1024, True), ("float32", 2, 30, False),
    ("float64", 3, 64, False), ("bfloat16", 4, 36, False),
])
def test_fused_path_is_taken(monkeypatch, precision_name, B, H, applies):
    """Forced, the fused-step kernels run where they apply: bf16, fp16 and float32 (TF32, or
    without it three TF32 MMAs per product) with H % 8 == 0 (16-bit) or H % 4 == 0 (float32);
    elsewhere the cuBLAS loop runs (no persistent or fused kernel)."""
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()
        monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fused")
        assert loop_kernels(run) == ({"fused forward", "fused backward"} if applies else set())
        monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
        assert not any(k.startswith("fused") for k in loop_kernels(run))


@pytest.mark.parametrize("precision_name,batch_sizes,H,loops", [
    ("float16", [48, 40, 7], 768, {"fused forward", "fused backward"}),
    ("bfloat16", [72, 72, 30, 1], 512, {"fused forward", "fused backward"}),
    ("float16", [128, 100, 9], 768, {"fused backward"}),  # forward B*H = 98304 > 65536: cuBLAS
    ("bfloat16", [100, 99, 99], 1024, set()),  # B*H > 98304
    ("float16", [48] * 3, 768, set()),  # equal batch sizes: the cuBLAS loop
    ("float16", [48] * 10 + [40] * 6 + [7] * 4, 768, set()),  # T = 20: the replayed cuBLAS loop
])
def test_ragged_16_bit_takes_the_fused_loop(monkeypatch, precision_name, batch_sizes, H, loops):
    """auto, 16-bit, a ragged packed sequence of T < 16 (whose cuBLAS steps are not replayed): the fused
    forward up to B*H = 65536 and the fused backward up to B*H = 98304 at any B (lstm_loop.cuh,
    kFusedMaxForwardBHRaggedHalf / kFusedMaxBackwardBHRaggedHalf); from T = 16 the padded rules; right
    against the reference."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    with _Precision(precision_name):
        def run():
            compare_layer(batch_sizes, 5, H, reverse=False, bias=True, precision=precision_name, seed=H,
                          what="ragged, 16-bit, auto")

        assert loop_kernels(run) == loops


def test_fused_path_with_projection_falls_back(monkeypatch):
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fused")
    with _Precision("bfloat16"):
        assert loop_kernels(_train_call(torch.bfloat16, 4, 32, proj_size=8)) == set()


def test_persistent_falls_back_cleanly(monkeypatch):
    """Projection, B > 64, and B > 32 at H = 1024 (one gate item per thread: U * B <= 256)
    are not on the persistent path, but for the forward's cluster kernel on 16-bit operands (bf16,
    fp16, and float32 with TF32 on scaled fp16 operands; H in {256, 512, 1024}): forced, it falls
    back to the cuBLAS loop (whose results the references above check too)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    assert persistent_kernels(_train_call(torch.float32, 4, 32, proj_size=8)) == set()
    assert persistent_kernels(_train_call(torch.float32, 65, 32)) == set()
    assert persistent_kernels(_train_call(torch.bfloat16, 33, 1000, T=2)) == set()
    with _Precision("tf32"):
        run = _train_call(torch.float32, 33, 1024, T=2)
        assert persistent_kernels(run) == {"forward"}  # the cluster kernel, scaled fp16 operands
        monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_HALF", "0")  # TF32 operands: to B = 32 at H = 1024
        assert persistent_kernels(run) == set()


def _persistent_variants(fn, direction: str, variant: str) -> set[str]:
    """Which persistent kernels of a direction ("forward", "backward") ran during fn():
    `variant` (the "direct" forward or the "split" backward kernel, clustered or not) and/or
    "general"."""
    names = kernel_names(fn)
    return ({variant} if any(f"lstm_persistent_{direction}_{variant}_" in n for n in names) else set()) | (
        {"general"} if any(f"lstm_persistent_{direction}_kernel" in n for n in names) else set())


def _direct_branch_free_rows(fn) -> set[int]:
    """The kBranchFreeRows template argument (the last) of the direct forward kernels that ran in fn()."""
    rows = set()
    for n in kernel_names(fn):
        if "lstm_persistent_forward_direct_kernel" in n:
            m = re.search(r"(\d+)>\(", n) or re.search(r"(\d+)>$", n)
            assert m, n
            rows.add(int(m.group(1)))
    return rows


@pytest.mark.parametrize("precision_name,B,H,rows", [
    ("bfloat16", 1, 1024, 1), ("tf32", 2, 512, 1), ("tf32", 4, 512, 1), ("bfloat16", 5, 1024, 1),
    ("bfloat16", 8, 512, 1), ("tf32", 8, 1024, 0), ("bfloat16", 9, 512, 2), ("bfloat16", 16, 256, 2),
    ("tf32", 16, 1024, 0), ("tf32", 5, 1024, 1), ("bfloat16", 8, 768, 1), ("float16", 16, 640, 2),
    ("bfloat16", 6, 1024, 0),
    ("float16", 12, 1024, 0), ("bfloat16", 8, 900, 0), ("float32", 8, 512, 1), ("float32", 16, 256, 2),
    ("float32", 8, 1024, 1), ("float32", 16, 1024, 2), ("float32", 12, 600, 2),
])
def test_direct_forward_polling_instance_follows_batch(monkeypatch, precision_name, B, H, rows):
    """The direct forward kernel's polling instance (its last template argument, chosen by A/Bs
    on an H200): row gq branch-free at B <= 8 (1), rows gq and gq + 8 branch-free above (2),
    except 16-bit exchanges (16-bit types, and float32 with TF32 on scaled fp16 operands) at H > 768
    from B = 6: the per-word loop (0). (Not the cluster kernel, which takes H = 1024 from B = 2 in
    16-bit types and TF32.)"""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER", "0")
    with _Precision(precision_name):
        assert _direct_branch_free_rows(_train_call(DTYPE[precision_name], B, H, T=3)) == {rows}


def _split_cluster_sizes(fn) -> set[int]:
    """The cluster sizes of the split backward kernels that ran during fn(): CL, the last template
    argument of lstm_persistent_backward_split_cluster_kernel, or 1 for the kernel without
    clusters."""
    sizes = set()
    for n in kernel_names(fn):
        if "lstm_persistent_backward_split_cluster_kernel" in n:
            # <scalar_t, (...::Path)P, NTW, CL>
            m = re.search(r"split_cluster_kernel<.*?, (\d+), (\d+)>", n)
            assert m, n
            sizes.add(int(m.group(2)))
        elif "lstm_persistent_backward_split_kernel" in n:
            sizes.add(1)
    return sizes


@pytest.mark.parametrize("precision_name,B,H,direct", [
    ("bfloat16", 1, 1024, True), ("float16", 16, 256, True), ("bfloat16", 5, 40, True), ("tf32", 16, 512, True),
    ("tf32", 4, 1024, True), ("tf32", 12, 1024, True), ("tf32", 1, 520, True),
    ("bfloat16", 17, 200, False), ("tf32", 17, 1024, False), ("float64", 2, 16, False),
    # float32 with TF32 off: three TF32 MMAs per product (two with one row per lane) up to H = 1024.
    ("float32", 4, 256, True), ("float32", 16, 512, True), ("float32", 17, 64, False), ("float32", 1, 520, True),
    ("float32", 8, 1024, True), ("float32", 9, 520, True), ("float32", 16, 1024, True), ("float32", 2, 1032, False),
])
def test_direct_forward_kernel_is_taken(monkeypatch, precision_name, B, H, direct):
    """The persistent forward runs its direct kernel (A fragments straight from the exchange
    buffer, one barrier per step) on tensor cores at B <= 16 and H <= 1024 (TF32 beyond H = 512
    with half of W_hh's fragments in shared memory; float32 without TF32 with each product as
    three TF32 MMAs), the general kernel elsewhere; the diagnostic
    SEQKERNELS_LSTM_PERSISTENT_DIRECT=0 keeps the general one. Both give the reference's values
    (test_layer_matches_reference and the rest run whichever applies)."""
    dtype = DTYPE[precision_name]
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "0")  # (it takes tf32 B = 17, H = 1024)
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER", "0")  # (it takes 16-bit B <= 16 at H in {128, 256, 512})
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()
        assert _persistent_variants(run, "forward", "direct") == ({"direct"} if direct else {"general"})
        monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_DIRECT", "0")
        assert _persistent_variants(run, "forward", "direct") == {"general"}


@pytest.mark.parametrize("precision_name,batch_sizes,H", [
    ("bfloat16", [9, 9, 7, 4, 4, 1], 48), ("tf32", [9, 9, 7, 4, 4, 1], 48),
    # TF32 (h exchanged as pairs of TF32 values) beyond H = 512 (half of the W_hh fragments in
    # shared memory, 8 units per block; 604 units: a padded last block) and at H = 300 (4 units
    # per block, each block's slice padded to an L2 sector), B <= 8 and B > 8.
    ("tf32", [7, 7, 5, 2, 2, 1], 604), ("tf32", [12, 12, 9, 4, 1], 604), ("tf32", [7, 7, 5, 2, 2, 1], 300),
    ("tf32", [12, 12, 9, 4, 1], 300),
    # Polling instances: row gq branch-free (B <= 8), rows gq and gq + 8 branch-free (B > 8: the
    # shapes above), the per-word loop (16-bit, H > 768, B >= 6; 900 units: 113 blocks of 8, the
    # last one padded).
    ("bfloat16", [2, 2, 1, 1], 48), ("tf32", [4, 3, 1], 604), ("float16", [1, 1, 1], 1024),
    ("bfloat16", [4, 4, 2], 1024), ("bfloat16", [8, 8, 6, 3, 1], 300), ("tf32", [8, 7, 5, 2], 1024),
    ("float16", [12, 12, 9, 4, 1], 640), ("bfloat16", [12, 12, 9, 4, 1], 1024), ("float16", [7, 7, 5, 2, 2, 1], 900),
    ("tf32", [16, 16, 12, 5, 1], 1024),  # (ragged: equal batch sizes take the cluster kernel there)
    # float32 with TF32 off (h as 30-bit values split into big and small TF32 values, three MMAs
    # per product; float32's 3e-5 bound): 4 units per block with 2 and 4 k-steps per warp, a
    # padded last block (H = 300, 75 blocks), B <= 8 and B > 8.
    ("float32", [3, 3, 2, 1], 40), ("float32", [7, 7, 5, 2, 2, 1], 300), ("float32", [12, 12, 9, 4, 1], 300),
    ("float32", [8, 7, 5, 2], 512), ("float32", [16, 16, 11, 3, 1], 512), ("float32", [5, 5, 1], 128),
    # ... and with 8 k-steps per warp (5 of them with W_hh's fragments in shared memory): H = 1024
    # and H = 1000 (8 units per block, a padded last block), H = 520 (130 blocks of 4 at B <= 8
    # on 132 SMs, 65 of 8 beyond); B <= 8 and B > 8 in one call, rows that start late (reverse).
    ("float32", [8, 7, 5, 2], 1024), ("float32", [3, 3, 1], 1000), ("float32", [6, 6, 2], 520),
    ("float32", [16, 16, 11, 3, 1], 1024), ("float32", [13, 12, 9, 8, 4], 1000), ("float32", [10, 9, 2], 520),
])
def test_direct_and_general_forward_match_reference(monkeypatch, precision_name, batch_sizes, H):
    """Both persistent forward kernels on one packed, reversed input (rows that start late take
    h0/c0, a padded last block), each against the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision(precision_name):
        for direct in ("1", "0"):
            monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_DIRECT", direct)
            compare_layer(batch_sizes, 5, H, reverse=True, bias=True, precision=precision_name, seed=11,
                          what=f"SEQKERNELS_LSTM_PERSISTENT_DIRECT={direct}")


@pytest.mark.parametrize("B,H", [(8, 512), (16, 256), (4, 1024), (16, 1024)])
def test_float32_direct_forward_is_as_accurate_as_fma(monkeypatch, B, H):
    """float32 with TF32 off: the direct kernel's three TF32 MMAs per product against the
    general kernel's FFMA, both against float64 over 96 steps (errors accumulate through the
    recurrence). TF32 alone (one MMA) would be ~100x further off."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    t, up = layer_case([B] * 96, 16, H, bias=True, seed=B + H)
    ref64 = run_layer(_reference, t, up, [B] * 96, False, torch.float64, "cpu")
    errs = {}
    with _Precision("float32"):
        for direct in ("1", "0"):
            monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_DIRECT", direct)
            got = run_layer(lstm_layer, t, up, [B] * 96, False, torch.float32, "cuda")
            errs[direct] = max(max_abs(got[k].double().cpu() - ref64[k]) / max(1.0, max_abs(ref64[k]))
                               for k in ("y", "h_n", "c_n"))
    assert errs["1"] <= 2 * errs["0"] + 1e-6, f"direct (3xTF32) {errs['1']:.3g} against FFMA {errs['0']:.3g}"


def _direct_paths(fn) -> set[str]:
    """The arithmetic paths of the direct forward kernels that ran during fn(): their second
    template argument (Path) as "16-bit", "TF32", "x3" (on TF32 parts), "scaled fp16" or "x3 fp16"
    (x3 on fp16 parts)."""
    names = {0: "16-bit", 1: "TF32", 3: "x3", 4: "scaled fp16", 5: "x3 fp16"}
    paths = set()
    for n in kernel_names(fn):
        if "lstm_persistent_forward_direct_kernel" in n:
            m = re.search(r"Path\)(\d+)", n)
            assert m, n
            paths.add(names[int(m.group(1))])
    return paths


@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("batch_sizes,H,reverse", [
    ([1] * 6, 1024, False), ([4, 4, 3, 1], 1024, True), ([8, 7, 5, 2], 604, True), ([12, 12, 9, 4, 1], 300, True),
    ([16] * 5, 512, False), ([3, 3, 1], 48, True), ([8, 8, 6, 3], 1000, True),
])
def test_direct_forward_tf32_operands(monkeypatch, half, batch_sizes, H, reverse):
    """float32 with TF32 on the direct kernel: by default the 16-bit path's fp16 MMAs on W_hh scaled
    per warp and h0 per row by powers of two (Path::kHalfScaled), with SEQKERNELS_LSTM_DIRECT_HALF=0
    on TF32 operands: which ran, and the outputs and every gradient of a packed input (reversed:
    rows that start late read h0) against the float64 reference within TF32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "0")  # (it takes H = 1024 from B = 2)
    if not half:
        monkeypatch.setenv("SEQKERNELS_LSTM_DIRECT_HALF", "0")
    with _Precision("tf32"):
        assert _direct_paths(_train_call(torch.float32, batch_sizes[0], H, T=3)) == {"scaled fp16" if half else "TF32"}
        compare_layer(batch_sizes, 8, H, reverse=reverse, bias=True, precision="tf32", seed=H + len(batch_sizes),
                      what=f"direct forward, {'scaled fp16' if half else 'TF32'} operands")


@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("batch_sizes,H,reverse", [
    ([1] * 6, 1024, False), ([4, 4, 3, 1], 1024, True), ([8, 7, 5, 2], 604, True), ([3, 3, 1], 48, True),
    ([8, 8, 6, 3], 1000, True), ([6, 6, 2], 520, False), ([2] * 5, 300, False), ([12, 12, 9, 4, 1], 600, True),
])
def test_direct_forward_x3_operands(monkeypatch, half, batch_sizes, H, reverse):
    """float32 without TF32 on the direct kernel: at B <= 8 and H > 512 (8 k-steps per warp) by
    default the x3 products on fp16 parts (Path::kHalfX3: W_hh scaled per warp and h0 per row, each
    value an fp16 value and 2^11 times its remainder), with SEQKERNELS_LSTM_DIRECT_X3_HALF=0 and
    elsewhere on TF32 parts: which ran, and the outputs and every gradient of a packed input
    (reversed: rows that start late read h0; 4 and 8 units per block, padded last blocks) against
    the float64 reference within float32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    if not half:
        monkeypatch.setenv("SEQKERNELS_LSTM_DIRECT_X3_HALF", "0")
    fp16_parts = half and batch_sizes[0] <= 8 and H > 512
    with _Precision("float32"):
        assert _direct_paths(_train_call(torch.float32, batch_sizes[0], H, T=3)) == {"x3 fp16" if fp16_parts else "x3"}
        compare_layer(batch_sizes, 8, H, reverse=reverse, bias=True, precision="float32", seed=H + len(batch_sizes),
                      what=f"direct forward, x3 on {'fp16' if fp16_parts else 'TF32'} parts")


@pytest.mark.parametrize("batch_sizes,H", [([4] * 4, 1024), ([8, 8, 6, 5], 600), ([1] * 4, 520)])
def test_direct_forward_x3_half_products_carry_nan(monkeypatch, batch_sizes, H):
    """The direct kernel's x3 products on fp16 parts: a NaN in x (step 1) makes its row's h_1 NaN, and
    the exchange carries it (x3_bits keeps a NaN a NaN; the consumer's fp16 parts of it are NaN) into
    every unit of that row from step 2 on, as the float64 reference has it; the other rows stay
    within float32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision("float32"):
        assert _direct_paths(_train_call(torch.float32, batch_sizes[0], H, T=3)) == {"x3 fp16"}
    t, _ = layer_case(batch_sizes, 9, H, bias=True, seed=62)
    row = batch_sizes[-1] - 1  # present at every step
    t["x"][batch_sizes[0] + row, 4] = float("nan")  # step 1
    got, ref = _float32_forward_and_reference(t, batch_sizes)
    assert torch.isnan(ref[1][row]).all() and torch.isfinite(ref[1][:row]).all()  # h_n
    for name, g, r in zip(("y", "h_n", "c_n"), got, ref):
        g, r = g.double().cpu(), r.double()
        assert torch.equal(torch.isnan(g), torch.isnan(r)), f"{name}: NaN where the reference has none, or not"
        ok = ~torch.isnan(r)
        assert max_abs(g[ok] - r[ok]) <= TOL["float32"] * max(1.0, max_abs(r[ok])), name


@pytest.mark.parametrize("batch_sizes,I,H", [([4] * 4, 9, 1024), ([8] * 4, 12, 520), ([2] * 4, 9, 700)])
def test_direct_forward_x3_half_products_scale_h0_and_w_hh(monkeypatch, batch_sizes, I, H):
    """The direct kernel's x3 products on fp16 parts (float32 without TF32, B <= 8, H > 512): an h0 row beyond
    fp16's range (~1e5) and one far below it (~1e-5), W_hh at 1e-5 of nn.LSTM's range: within
    float32's bound of the float64 reference. Unscaled, row 0 would overflow to inf and W_hh's small
    parts fall below fp16's subnormals."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    _check_scaled_h0_and_w_hh(batch_sizes, I, H, 31, lambda run: _direct_paths(run) == {"x3 fp16"},
                              f"direct forward, x3 on fp16 parts B={batch_sizes[0]} H={H}", precision="float32")


@pytest.mark.parametrize("batch_sizes,H,parts", [([4] * 4, 1024, "x3 fp16"), ([8, 8, 6], 600, "x3 fp16"),
                                                   ([2] * 3, 520, "x3 fp16"), ([4] * 4, 256, "x3"),
                                                   ([12] * 3, 1024, "x3"), ([16, 16, 11], 512, "x3")])
def test_direct_forward_x3_keep_infs(monkeypatch, batch_sizes, H, parts):
    """The direct kernel's x3 products (on fp16 parts at B <= 8, H > 512, else on TF32 parts, at
    B <= 8 one row per lane, above two): an inf in h0 (multiplied as 0 on the tensor cores, its
    products with W_hh added in float32 by the gate threads) reaches the first step's
    pre-activations as in a float32 GEMM (the row's gates saturate, its outputs stay finite), not
    as inf - inf = NaN between the parts."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision("float32"):
        assert _direct_paths(_train_call(torch.float32, batch_sizes[0], H, T=3)) == {parts}
    _check_inf_in_h0_as_float32(batch_sizes, H)


@pytest.mark.parametrize("batch_sizes,I,H", [([4] * 4, 9, 1024), ([12] * 4, 12, 512), ([2] * 4, 9, 300)])
def test_direct_forward_half_products_scale_h0_and_w_hh(monkeypatch, batch_sizes, I, H):
    """The direct kernel's scaled fp16 operands: an h0 row beyond fp16's range (~1e5) and one far
    below it (~1e-5), W_hh at 1e-5 of nn.LSTM's range (fp16 subnormals unscaled): within TF32's bound
    of the float64 reference. Unscaled, row 0 would overflow to inf and W_hh keep ~2 significant bits."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "0")
    _check_scaled_h0_and_w_hh(batch_sizes, I, H, 29, lambda run: _direct_paths(run) == {"scaled fp16"},
                              f"direct forward, scaled fp16 operands B={batch_sizes[0]} H={H}")


@pytest.mark.parametrize("batch_sizes,H", [([4] * 4, 1024), ([12, 12, 9], 512)])
def test_direct_forward_half_products_keep_infs(monkeypatch, batch_sizes, H):
    """The direct kernel's scaled fp16 operands: an inf in h0 (which sets no scale) reaches the first
    step's pre-activations as in a TF32 GEMM (the row's gates saturate, its outputs stay finite)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "0")
    _check_inf_in_h0_as_float32(batch_sizes, H, "tf32")


@pytest.mark.parametrize("loop", ["persistent", "fused", "cublas"])
@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_saturated_gates_match_reference(monkeypatch, loop, precision):
    """Inputs a thousand times nn.LSTM's scale drive pre-activations far below -88.7, where expf
    overflows to inf: every CUDA cell's sigmoid must give 0 there (its division fast path once
    gave NaN), and the outputs and gradients follow the float64 reference. (Not TF32: its
    operand rounding at this input scale moves the unsaturated gates by more than its bound.)"""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
    with _Precision(precision):
        compare_layer([4, 4, 3, 1], 24, 64, reverse=False, bias=True, precision=precision, seed=3, what=loop,
                      x_scale=1e3)


def _float32_forward_and_reference(t: dict, batch_sizes: list[int], precision: str = "float32"):
    """lstm_layer's (y, h_n, c_n) on the GPU in float32 with TF32 off (or on: precision "tf32"),
    without gradients, and the float64 reference's, for layer_case tensors (forward direction)."""
    bs = torch.tensor(batch_sizes, dtype=torch.int64)
    args = [t[k] for k in ("x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh")]
    ref = _reference(args[0], bs, *args[1:], reverse=False)
    with _Precision(precision), torch.no_grad():
        on_gpu = [a.to("cuda", torch.float32) for a in args]
        got = lstm_layer(on_gpu[0], bs, *on_gpu[1:], reverse=False)
    return got, ref


def _check_inf_in_h0_as_float32(batch_sizes: list[int], H: int, precision: str = "float32", I: int = 9,
                                x_inf: bool = False) -> None:
    """With an inf in h0 (row 1, unit 5; and with x_inf a -inf in x, packed row 2, column 7), the
    GPU's float32 forward (TF32 off, or on: precision "tf32") gives what a float32 (TF32) GEMM gives:
    finite y, h_n and c_n (the rows' gates saturate) within that precision's bound of the float64
    reference."""
    t, _ = layer_case(batch_sizes, I, H, bias=True, seed=61)
    t["h0"][1, 5] = float("inf")
    if x_inf:
        t["x"][2, 7] = float("-inf")
    got, ref = _float32_forward_and_reference(t, batch_sizes, precision)
    for name, g, r in zip(("y", "h_n", "c_n"), got, ref):
        g, r = g.double().cpu(), r.double()
        assert torch.isfinite(r).all() and torch.isfinite(g).all(), f"{name}: not finite"
        assert max_abs(g - r) <= TOL[precision] * max(1.0, max_abs(r)), name


# The forward's input projection in float32 without TF32 runs as three TF32 GEMMs on exact
# splits from 2^32 flops (lstm.cu's input_projection), in row chunks of at most 2048 rows at
# I = 2048: N = 1120 (one chunk) and N = 2080 (two, a packed batch).
_SPLIT_PROJECTION_CASES = [([16] * 70, 2048, 256), ([32] * 40 + [20] * 40, 2048, 256)]


@pytest.mark.parametrize("loop", ["persistent", "fused", "cublas"])
@pytest.mark.parametrize("batch_sizes,I,H", _SPLIT_PROJECTION_CASES)
def test_float32_input_projection_in_tf32_gemms_matches_reference(monkeypatch, loop, batch_sizes, I, H):
    """float32 without TF32, a projection of more than 2^32 flops (3xTF32): every loop's outputs
    and gradients against the float64 reference within float32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
    with _Precision("float32"):
        compare_layer(batch_sizes, I, H, reverse=False, bias=True, precision="float32", seed=5, what=loop)


@pytest.mark.parametrize("batch_sizes,I,H", _SPLIT_PROJECTION_CASES)
def test_float32_input_projection_in_tf32_gemms_keeps_inf_and_nan(monkeypatch, batch_sizes, I, H):
    """An inf and a NaN in x reach the split projection's pre-activations as a float32 GEMM
    gives them: the inf's row saturates its gates and stays finite (a cross term's inf · 0 would
    have made it NaN wherever W_ih holds an exact TF32 value), the NaN's row turns NaN, as in
    the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    t, _ = layer_case(batch_sizes, I, H, bias=True, seed=6)
    t["x"][5, 7] = float("inf")  # step 0, row 5
    t["x"][batch_sizes[0] + 3, 11] = float("nan")  # step 1, row 3
    got, ref = _float32_forward_and_reference(t, batch_sizes)
    assert torch.isfinite(ref[1][5]).all() and torch.isnan(ref[1][3]).all()  # h_n: the inf's row, the NaN's
    for name, g, r in zip(("y", "h_n", "c_n"), got, ref):
        g, r = g.double().cpu(), r.double()
        assert torch.equal(torch.isnan(g), torch.isnan(r)), f"{name}: NaN where the reference has none, or not"
        ok = ~torch.isnan(r)
        assert max_abs(g[ok] - r[ok]) <= TOL["float32"] * max(1.0, max_abs(r[ok])), name


# The backward's whole-sequence products in float32 without TF32 (dW_ih and dW_hh, then dx) run as
# three TF32 GEMMs on exact splits where every GEMM of a row chunk has 2^32 flops (lstm.cu's
# x3_weight_grads and x3_input_grad; T = 256, B = 64, H = 1024 is such a size);
# SEQKERNELS_LSTM_X3_PRODUCTS=1 takes them (and the input projection's) at any size, =0 never.
# The weight gradients run on scaled fp16 parts first where their scratch fits within grad_x's
# bytes (half_x3_weight_grads; SEQKERNELS_LSTM_X3_HALF_PRODUCTS=1 at any size, =0 never): "tf32"
# below forces the TF32 parts for all three products, "half" the fp16 parts for the weight
# gradients.
def _set_products(monkeypatch, parts):
    if parts == "tf32":
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_PRODUCTS", "1")
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_HALF_PRODUCTS", "0")
    else:
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_HALF_PRODUCTS", "1")


@pytest.mark.parametrize("parts", ["tf32", "half"])
@pytest.mark.parametrize("loop", ["persistent", "fused", "cublas"])
@pytest.mark.parametrize("batch_sizes,I,H,reverse", [([4] * 6, 9, 36, False), ([7, 7, 5, 2, 2], 12, 64, True),
                                                     ([3] * 20, 33, 128, False)])
def test_float32_backward_products_in_split_gemms_match_reference(monkeypatch, parts, loop, batch_sizes, I, H,
                                                                  reverse):
    """Every loop's outputs and gradients with the split products at a small size (odd I: the
    split parts' rows unaligned), packed and reverse, against the float64 reference within
    float32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
    _set_products(monkeypatch, parts)
    with _Precision("float32"):
        compare_layer(batch_sizes, I, H, reverse=reverse, bias=True, precision="float32", seed=I + H, what=loop)


@pytest.mark.parametrize("parts", ["tf32", "half"])
def test_float32_backward_products_in_row_chunks_match_reference(monkeypatch, parts):
    """N = 2080 packed rows at I = 2048, H = 256: the weight gradients' split operands in row chunks
    (TF32: 5, fp16: 4, the last one short), dx's in 4, against the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    _set_products(monkeypatch, parts)
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_PRODUCTS", "1")
    with _Precision("float32"):
        compare_layer([32] * 40 + [20] * 40, 2048, 256, reverse=False, bias=True, precision="float32", seed=47)


@pytest.mark.parametrize("B,H,env,weights,inputs", [
    (64, 512, None, True, True), (32, 512, None, True, True), (16, 512, None, False, False),
    (32, 256, None, True, True), (16, 256, None, True, False), (32, 1024, None, False, False),
    (64, 1024, None, True, True), (2, 32, "1", True, True), (64, 512, "0", False, False)])
def test_float32_products_on_half_parts_are_taken(monkeypatch, B, H, env, weights, inputs):
    """Where the backward's products run on fp16 parts (T = 256, I = H), or as
    SEQKERNELS_LSTM_X3_HALF_PRODUCTS says; never with TF32. The weight gradients (three column
    splits a chunk): where X ([4H, 2H] floats) and 256 rows of parts fit within grad_x's bytes,
    N >= 8H + 1536 rows. dx (its row split): where W_ih's parts and 256 rows' buffers fit within
    hprev's bytes, W_ih's parts a quarter of them at most (not at B = 16, H = 512 or B = 32,
    H = 1024). Both: products of at least 2^32 flops (B = 16, H = 256: dx 2.1e9)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    if env is None:
        monkeypatch.delenv("SEQKERNELS_LSTM_X3_HALF_PRODUCTS", raising=False)
    else:
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_HALF_PRODUCTS", env)
    for precision_name in ("float32", "tf32"):
        with _Precision(precision_name):
            run = _train_call(torch.float32, B, H, T=256)
            run()
            counts = kernel_counts(run)
        column_splits = sum(n for k, n in counts.items() if "split_half_columns" in k)
        row_splits = sum(n for k, n in counts.items() if "split_half_rows" in k)
        tf32 = precision_name == "tf32"
        assert (column_splits >= 3) == (weights and not tf32), f"{precision_name}: weight gradients"
        assert (row_splits > 0) == (inputs and not tf32), f"{precision_name}: dx"


def test_float32_backward_products_switch_decides(monkeypatch):
    """SEQKERNELS_LSTM_X3_PRODUCTS decides which products run: both agree with the float64
    reference, and their gradients differ in rounding (not bit for bit equal), so each is a
    different computation; below 2^32 flops the default is float32's GEMMs (as =0)."""
    batch_sizes, I, H = [6] * 8, 40, 48
    t, up = layer_case(batch_sizes, I, H, bias=True, seed=31)
    ref = run_layer(_reference, t, up, batch_sizes, False, torch.float64, "cpu")
    got = {}
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_HALF_PRODUCTS", "0")
    for env in ("0", "1", ""):
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_PRODUCTS", env)
        with _Precision("float32"):
            got[env] = run_layer(lstm_layer, t, up, batch_sizes, False, torch.float32, "cuda")
        check(got[env], ref, "float32", f"X3_PRODUCTS={env!r}")
    for key in ("grad_x", "grad_w_ih", "grad_w_hh"):
        assert not torch.equal(got["0"][key], got["1"][key]), f"{key}: the switch changed nothing"
        assert torch.equal(got["0"][key], got[""][key]), f"{key}: the default is not float32's GEMMs here"


@pytest.mark.parametrize("parts", ["tf32", "half"])
def test_float32_backward_products_with_projection_match_reference(monkeypatch, parts):
    """proj_size: the split products with hprev of P columns (the projected h), in training
    against nn.LSTM in float64 holding the same weights."""
    _set_products(monkeypatch, parts)
    torch.manual_seed(41)
    ref = nn.LSTM(20, 64, proj_size=24, dtype=torch.float64)
    model = seqkernels.LSTM(20, 64, proj_size=24).cuda()
    model.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn(11, 5, 20, dtype=torch.float64)
    with _Precision("float32"):
        got = lstm_training_results(model, x.float().cuda())
    for i, (g, r) in enumerate(zip(got, lstm_training_results(ref, x))):
        g = g.double().cpu()
        assert max_abs(g - r) <= TOL["float32"] * max(1.0, max_abs(r)), f"result {i}"


@pytest.mark.parametrize("parts", ["tf32", "half"])
def test_float32_backward_products_keep_inf(monkeypatch, parts):
    """An inf in grad_y at step 0 (row 2; backward's last step, so dG holds no NaN) makes dG's row
    ±inf, and dW and dx take it through the split products as float32 GEMMs do: inf where the
    float64 reference has inf, NaN where it has NaN, its values elsewhere. Row 2's x and h0 hold
    exact TF32 values (small parts 0), where a cross term inf · 0 would have made dW NaN (fp16
    parts: the last kernel keeps big·big alone where it is not finite)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    _set_products(monkeypatch, parts)
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_PRODUCTS", "1")
    batch_sizes, I, H = [4] * 6, 24, 32
    t, up = layer_case(batch_sizes, I, H, bias=True, seed=43)
    t["x"][2, :4] = 1.0
    t["h0"][2, :4] = 0.5
    up["y"][2, 5] = float("inf")
    with _Precision("float32"):
        got = run_layer(lstm_layer, t, up, batch_sizes, False, torch.float32, "cuda")
    ref = run_layer(_reference, t, up, batch_sizes, False, torch.float64, "cpu")
    assert torch.isinf(ref["grad_w_ih"][:, :4]).any() and torch.isinf(ref["grad_w_hh"][:, :4]).any()
    _check_nonfinite_as_reference(got, ref, ("grad_x", "grad_w_ih", "grad_w_hh", "grad_b_ih", "grad_h0"))


def _check_nonfinite_as_reference(got, ref, keys):
    """NaN and inf exactly where the float64 reference has them, its values elsewhere within
    float32's bound."""
    for key in keys:
        g, r = got[key].double().cpu(), ref[key]
        for what, f in (("NaN", torch.isnan), ("inf", torch.isinf)):
            assert torch.equal(f(g), f(r)), f"{key}: {what} elsewhere than the reference's"
        ok = torch.isfinite(r)
        assert max_abs(g[ok] - r[ok]) <= TOL["float32"] * max(1.0, max_abs(r[ok])), key


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.parametrize("precision_name,B,H,split", [
    ("bfloat16", 1, 1024, True), ("float16", 2, 512, True), ("bfloat16", 5, 36, True), ("bfloat16", 2, 768, False),
    ("tf32", 1, 256, True), ("tf32", 16, 1024, True), ("tf32", 8, 512, True), ("tf32", 2, 256, False),
    ("bfloat16", 4, 512, True), ("tf32", 8, 256, True), ("bfloat16", 16, 768, True),
    ("bfloat16", 17, 64, False), ("float32", 4, 256, False), ("float64", 2, 16, False),
])
def test_split_backward_kernel_is_taken(monkeypatch, precision_name, B, H, split):
    """The persistent backward runs its split kernel (each block's partial dh over its own gate
    rows exchanged, not dG) on tensor cores where it was measured faster: in thread-block
    clusters wherever they fit from B = 4 (sm_90; H > 128 and a block count that clusters of 8 or
    4 divide and the GPU can hold: on an H200 up to H = 768, not the 128 blocks of H = 1024),
    else without clusters at 16-bit B·H <= 1024 and TF32 B = 1 or H >= 512 (B <= 16,
    H <= 1024); the general kernel elsewhere. SEQKERNELS_LSTM_PERSISTENT_SPLIT=0 keeps the
    general one, =1 takes the split one wherever it can run. (The one-cluster backward, which takes
    16-bit types with equal batch sizes at H <= 512 first, off, and so is the row-split backward,
    which takes them at H = 1024, B <= 16.)"""
    without_clusters = B * H <= 1024 if precision_name in ("bfloat16", "float16") else (B == 1 or H >= 512)
    if split and not without_clusters and not _sm90():
        pytest.skip("the split kernel is taken here for its clusters (sm_90)")
    dtype = DTYPE[precision_name]
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.delenv("SEQKERNELS_LSTM_PERSISTENT_SPLIT", raising=False)
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD", "0")
    can_run = precision_name in ("bfloat16", "float16", "tf32") and B <= 16 and H <= 1024
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()
        assert _persistent_variants(run, "backward", "split") == ({"split"} if split else {"general"})
        monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_SPLIT", "0")
        assert _persistent_variants(run, "backward", "split") == {"general"}
        monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_SPLIT", "1")
        assert _persistent_variants(run, "backward", "split") == ({"split"} if can_run else {"general"})


@pytest.mark.parametrize("precision_name", ["bfloat16", "tf32"])
@pytest.mark.parametrize("H", [36, 300])
def test_split_and_general_backward_match_reference(monkeypatch, precision_name, H):
    """Both persistent backward kernels on one packed, reversed input (rows that start late,
    rows whose sequence ends early), each against the float64 reference: H = 36 has 9 blocks
    (an odd producer count: the last partial of a column is read alone) and a padded last block,
    H = 300 75 blocks and 5 column tiles per warp (SEQKERNELS_LSTM_PERSISTENT_SPLIT=1: the split
    kernel wherever it can run)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision(precision_name):
        for split in ("1", "0"):
            monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_SPLIT", split)
            compare_layer([9, 9, 7, 4, 4, 1], 5, H, reverse=True, bias=True, precision=precision_name, seed=13,
                          what=f"SEQKERNELS_LSTM_PERSISTENT_SPLIT={split}")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,batch_sizes,H", [
    # H = 286: 72 blocks of 4 units (9 clusters of 8, 18 of 4), a padded last block; H = 768: 96
    # blocks of 8 units (3 rounds of a consumer's loads at clusters of 4), 16 rows; H = 1024: 128
    # blocks, whose clusters may not fit.
    ("bfloat16", [9, 9, 7, 4, 4, 1], 286), ("tf32", [9, 9, 7, 4, 4, 1], 286),
    ("tf32", [16, 16, 12, 5, 1], 768), ("float16", [16, 16, 12, 5, 1], 768), ("tf32", [16, 16, 12, 5, 1], 1024),
])
def test_clustered_split_backward_matches_reference(monkeypatch, precision_name, batch_sizes, H):
    """The split backward kernel in clusters of 8 and of 4 blocks (partials added in distributed
    shared memory, one sum per cluster exchanged) and without clusters, on one packed, reversed
    input, each against the float64 reference; and which cluster size ran
    (SEQKERNELS_LSTM_PERSISTENT_CLUSTER: 8 or 4 that size only, 0 none). At H = 1024 clusters of
    8 or 4 need 16 or 32 of them resident at once, which depends on the GPU's GPCs (an H200:
    neither fits): there the kernel without clusters is the allowed fall-back."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_SPLIT", "1")
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, batch_sizes[0], H, T=3)
        run()
        for cluster in ("8", "4", "0"):
            monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER", cluster)
            ran = _split_cluster_sizes(run)
            if cluster == "0":
                assert ran == {1}
            elif H == 1024 and cluster in ("8", "4"):
                assert ran in ({int(cluster)}, {1}), ran
            else:
                assert ran == {int(cluster)}, ran
            compare_layer(batch_sizes, 5, H, reverse=True, bias=True, precision=precision_name, seed=17,
                          what=f"SEQKERNELS_LSTM_PERSISTENT_CLUSTER={cluster}")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name", ["tf32", "bfloat16"])
def test_clustered_split_backward_in_cuda_graph(monkeypatch, precision_name):
    """A training step whose backward runs the split kernel in clusters (B = 9, H = 286: 9
    clusters of 8), captured in a CUDA graph: replays on fresh input data agree with eager calls
    of an identical model."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision(precision_name):
        dtype = DTYPE[precision_name]
        run = _train_call(dtype, 9, 286, T=3)
        run()
        assert _split_cluster_sizes(run) == {8}
        torch.manual_seed(7)
        model = seqkernels.LSTM(286, 286).to(device="cuda", dtype=dtype)
        static_x = torch.randn(5, 9, 286, device="cuda", dtype=dtype)
        check_cuda_graph_replays(model, static_x)


# (precision, B, H, reverse, bias): the cluster forward kernel's instances at B > 16 (2 and 4 m16
# tiles, H = 256 / 512 / 1024), a partly empty last m16 tile (B = 17, 24, 33, 40), both directions,
# with and without bias.
_CLUSTER_FORWARD_CASES = [
    ("bfloat16", 64, 1024, False, True), ("float16", 64, 1024, True, True), ("bfloat16", 32, 1024, True, False),
    ("bfloat16", 33, 512, True, True), ("float16", 40, 512, False, True), ("bfloat16", 64, 512, False, False),
    ("bfloat16", 17, 256, False, True), ("float16", 24, 256, True, True), ("bfloat16", 64, 256, True, True),
    # float32 with TF32 (by default on scaled fp16 operands, test_cluster_forward_tf32_operands
    # below; on TF32 operands H <= 512, and H = 1024 up to B = 32)
    ("tf32", 64, 512, False, True), ("tf32", 33, 256, True, True), ("tf32", 24, 512, True, False),
    ("tf32", 32, 1024, True, True), ("tf32", 20, 1024, False, True),
    # float32 without TF32 (three TF32 MMAs per product, h exchanged whole; float32's 3e-5 bound)
    ("float32", 64, 512, False, True), ("float32", 33, 256, True, True), ("float32", 20, 512, True, False),
]


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,B,H,reverse,bias", _CLUSTER_FORWARD_CASES)
def test_cluster_forward_matches_reference(monkeypatch, precision_name, B, H, reverse, bias):
    """The persistent forward at 16 < B <= 64 (bf16 / fp16 with H in {256, 512, 1024}, float32 with
    or without TF32 with H in {256, 512}, with TF32 also at H = 1024 up to B = 32; equal batch
    sizes; the one-cluster kernel, which takes 16-bit types at H <= 512, off) runs its cluster
    kernel (64 clusters of two blocks, each block half of K, partial sums added by the owner block
    in distributed shared memory): which kernel ran, and the outputs and every gradient (the
    backward reads the gates and cells the forward saved) against the float64 reference;
    SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD=0 keeps the general kernel (where it applies:
    U * B <= 256) or the cuBLAS loop. The row split, which takes the 16-bit types at H = 1024, is off
    here (SEQKERNELS_LSTM_ROW_SPLIT_WIDE=0)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_ROW_SPLIT_WIDE", "0")
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()
        assert _persistent_variants(run, "forward", "cluster") == {"cluster"}
        compare_layer([B] * 6, 5, H, reverse=reverse, bias=bias, precision=precision_name, seed=B + H,
                      what="cluster forward")
        monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "0")
        assert "cluster" not in _persistent_variants(run, "forward", "cluster")


# (precision, B, H, reverse, bias): the one-cluster kernel (lstm_one_cluster.cu) at each of its
# hidden sizes (clusters of 4, 8 and 16 blocks), in one cluster (B <= 8, rows past B zero) and two
# to five (B = 9..40; the last group partly empty at B = 9, 13, 17 and 27).
_ONE_CLUSTER_CASES = [
    ("bfloat16", 1, 512, False, True), ("float16", 16, 512, True, True), ("bfloat16", 9, 512, False, False),
    ("bfloat16", 8, 256, True, True), ("float16", 13, 256, False, True), ("bfloat16", 5, 128, True, True),
    ("float16", 16, 128, False, False), ("float16", 6, 512, True, False), ("bfloat16", 40, 512, True, True),
    ("float16", 27, 256, False, True), ("bfloat16", 17, 128, True, False),
]


def _last_arguments(fn, kernel: str, value: str) -> set[str]:
    """The last template argument (matching the regex `value`) of the `kernel` instances that ran in fn()."""
    found = set()
    for n in kernel_names(fn):
        if kernel + "<" in n:
            m = re.search(re.escape(kernel) + r"<[^>]*, (" + value + ")>", n)
            assert m, n
            found.add(m.group(1))
    return found


def _last_bool_argument(fn, kernel: str) -> set[bool]:
    """The last template argument (true / false) of the `kernel` instances that ran in fn()."""
    return {v == "true" for v in _last_arguments(fn, kernel, "true|false")}


def _one_cluster_forward_flags(fn) -> set[tuple[bool, bool]]:
    """(kSplitK, kRagged), the template arguments before kGroups, of the one-cluster forward kernels that ran
    in fn()."""
    found = set()
    for n in kernel_names(fn):
        if "lstm_persistent_forward_one_cluster_kernel<" in n:
            m = re.search(r"lstm_persistent_forward_one_cluster_kernel<[^>]*, (true|false), (true|false), \d+>", n)
            assert m, n
            found.add((m.group(1) == "true", m.group(2) == "true"))
    return found


def _one_cluster_groups(fn) -> dict[str, set[int]]:
    """The kGroups template argument (batch groups a cluster, the last) of the one-cluster kernels that ran in
    fn(), by direction ("forward", "backward")."""
    found = {"forward": set(), "backward": set()}
    for n in kernel_names(fn):
        for direction in found:
            if f"lstm_persistent_{direction}_one_cluster_kernel<" in n:
                m = re.search(rf"lstm_persistent_{direction}_one_cluster_kernel<[^>]*, (\d+)>", n)
                assert m, n
                found[direction].add(int(m.group(1)))
    return found


def _one_cluster_split_k(fn) -> set[bool]:
    """The kSplitK template argument of the one-cluster forward kernels that ran in fn()."""
    return {split_k for split_k, _ in _one_cluster_forward_flags(fn)}


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("split_k", ["", "0", "1"], ids=["split-k-rule", "one-warp-per-tile", "split-k"])
@pytest.mark.parametrize("precision_name,B,H,reverse,bias", _ONE_CLUSTER_CASES)
def test_one_cluster_forward_matches_reference(monkeypatch, precision_name, B, H, reverse, bias, split_k):
    """bf16 / fp16 at B <= 64 (where its clusters are resident together: all these cases on an
    H100 / H200), H in {128, 256, 512}, equal batch sizes: the persistent forward runs the whole layer
    in one thread-block cluster per 8 batch rows (h exchanged in distributed shared memory): which
    kernel ran, and the outputs and every gradient (the backward reads the gates and cells it saved)
    against the float64 reference, for 6 steps and for 1, 2 and 67 (the mbarrier phases of the two
    buffers: none armed, one, many); SEQKERNELS_LSTM_ONE_CLUSTER=0 keeps the other kernels. Each case
    under the rule for warp pairs splitting K (at H = 512), with one warp per tile over all of K
    (SEQKERNELS_LSTM_ONE_CLUSTER_SPLIT_K=0) and with split K at every H (=1). The backward of these
    calls is the one-cluster backward kernel (W_hhᵀ resident, dG exchanged in the cluster: the
    weights' gradients from its dG and hprev, grad_h0 from its last product, grad_c0 its last dc);
    SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD=0 keeps the split or general kernel, compared once more."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_SPLIT_K", split_k)
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()
        assert _persistent_variants(run, "forward", "one_cluster") == {"one_cluster"}
        assert _persistent_variants(run, "backward", "one_cluster") == {"one_cluster"}
        assert _one_cluster_split_k(run) == {split_k == "1" or (split_k == "" and H == 512)}
        for steps in (6, 1, 2, 67):
            compare_layer([B] * steps, 5, H, reverse=reverse, bias=bias, precision=precision_name, seed=B + H + steps,
                          what=f"one-cluster forward and backward, {steps} steps")
        monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD", "0")
        assert "one_cluster" not in _persistent_variants(run, "backward", "one_cluster")
        compare_layer([B] * 6, 5, H, reverse=reverse, bias=bias, precision=precision_name, seed=B + H,
                      what="one-cluster forward, the split or general backward")
        monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER", "0")
        assert "one_cluster" not in _persistent_variants(run, "forward", "one_cluster")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("kernel,H,B,T,dtype", [("one_cluster", 256, 12, 33, torch.bfloat16),
                                                ("row_split", 1024, 11, 29, torch.float16)])
def test_backward_kernels_are_deterministic(monkeypatch, kernel, H, B, T, dtype):
    """Two training calls of the one-cluster backward and of the row-split backward (partial sums
    added in a fixed order in both) give bit-identical gradients."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    torch.manual_seed(3)
    model = seqkernels.LSTM(H, H).to(device="cuda", dtype=dtype)
    x = torch.randn(T, B, H, device="cuda", dtype=dtype, requires_grad=True)
    grads = []

    def step():
        model.zero_grad()
        x.grad = None
        y, _ = model(x)
        y.float().square().sum().backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for p in model.parameters()])

    assert any(f"backward_{kernel}" in n for n in kernel_names(step))
    step()
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def _sorted_lengths_batch_sizes(lengths: list[int]) -> list[int]:
    """A PackedSequence's batch sizes for these sequence lengths."""
    return [sum(n > t for n in lengths) for t in range(max(lengths))]


# (precision, batch sizes, H, reverse): packed sequences on the one-cluster kernels. Rows drop out
# inside a group of 8 (by one and by several at a step, down to one row), whole groups stop early
# (the second group of [16, 12, 3] runs 2 steps, of [20, 17, 9, 9, 4] 2 and 4 groups end at
# different steps), and random lengths (B = 16 and 37: 38 and 61 steps, up to 16 and 37 distinct
# batch sizes); in reverse the rows start late, from h0 and c0.
_ONE_CLUSTER_PACKED_CASES = [
    ("bfloat16", [8, 8, 5, 1], 512, False), ("float16", [8, 8, 5, 1], 512, True),
    ("float16", [16, 12, 3], 256, False), ("bfloat16", [16, 12, 3], 256, True),
    ("bfloat16", [13, 13, 9, 8, 8, 2, 2, 1], 128, True), ("float16", [20, 17, 9, 9, 4], 256, False),
    ("bfloat16", [11, 7, 7, 6, 3, 3, 3, 1], 512, True), ("float16", [2, 1, 1, 1, 1], 128, True),
    ("float16", _sorted_lengths_batch_sizes([38, 37, 33, 30, 30, 26, 19, 18, 15, 12, 9, 7, 5, 3, 2, 1]), 512, False),
    ("bfloat16", _sorted_lengths_batch_sizes(sorted(random.Random(5).choices(range(1, 62), k=37), reverse=True)),
     256, True),
]


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,batch_sizes,H,reverse", _ONE_CLUSTER_PACKED_CASES)
def test_one_cluster_packed_matches_reference(monkeypatch, precision_name, batch_sizes, H, reverse):
    """A packed sequence whose batch shrinks runs on the one-cluster kernels too (their instances with
    the step table): each group runs its longest sequence's steps and each row only its own. Which
    kernels ran, and the outputs, h_n, c_n and every gradient (grad_h0 / grad_c0 of rows that end
    early included) against the float64 reference; SEQKERNELS_LSTM_ONE_CLUSTER=0 keeps the direct
    kernel, compared once more."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision(precision_name):
        def run():
            compare_layer(batch_sizes, 5, H, reverse=reverse, bias=True, precision=precision_name,
                          seed=len(batch_sizes) + H, what="one-cluster, packed")

        assert _one_cluster_forward_flags(run) == {(H == 512, True)}
        assert _persistent_variants(run, "backward", "one_cluster") == {"one_cluster"}
        monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER", "0")
        monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_BACKWARD", "0")
        names = kernel_names(run)
        assert not any("one_cluster" in n for n in names)


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,batch_sizes,H,reverse,one_cluster", [
    ("bfloat16", [27, 20, 20, 5], 256, False, True), ("float16", [32, 30, 12, 1], 512, True, True),
    ("bfloat16", [64, 33, 9], 256, True, True), ("float16", [40, 40, 17], 512, False, True),
    ("bfloat16", [32] * 5, 256, False, True), ("float16", [64] * 4, 256, True, True),
    ("float16", [24] * 5, 512, False, True), ("bfloat16", [17] * 3, 512, True, True),
    ("bfloat16", [64] * 3, 512, False, True), ("float16", [64, 61, 30, 2], 512, True, True),
    ("float16", [72, 70, 8], 256, False, False), ("bfloat16", [65] * 3, 512, True, False)])
def test_above_16_takes_the_one_cluster_kernels(monkeypatch, precision_name, batch_sizes, H, reverse, one_cluster):
    """auto, 16-bit, 16 < B: the backward takes the persistent loop where the one-cluster backward kernel
    runs it (H = 256 and 512 up to B = 64: one_cluster_backward_wide; at H = 512 above B = 32 its clusters
    run in waves), and so does a packed sequence's forward for the one-cluster forward kernel
    (packed_one_cluster_forward), as its padded twin does; right against the reference. Beyond those
    sizes (B > 64), neither kernel."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    ragged = batch_sizes[-1] != batch_sizes[0]
    with _Precision(precision_name):
        def run():
            compare_layer(batch_sizes, 5, H, reverse=reverse, bias=True, precision=precision_name, seed=H,
                          what="16 < B, one-cluster kernels")

        assert _one_cluster_forward_flags(run) == ({(H == 512, ragged)} if one_cluster else set())
        backward = _persistent_variants(run, "backward", "one_cluster")
        assert backward == ({"one_cluster"} if one_cluster else set())


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,batch_sizes,reverse", [
    ("float16", [64] * 3, False), ("bfloat16", [48, 48, 33, 7], True)])
def test_one_cluster_waves_switch(monkeypatch, precision_name, batch_sizes, reverse):
    """H = 512 above B = 32 with SEQKERNELS_LSTM_ONE_CLUSTER_WAVES=0 (one_cluster_waves) and
    SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS=0 (paired_groups): the rules stop at B = 32 there again, so a packed
    B = 48 is not sent to the one-cluster kernels, and a padded B = 64's forward, which tries them first,
    needs all 8 clusters resident at once, more than an H200 holds. Neither runs; the loops that take the
    calls instead are right against the reference."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS", "0")
    with _Precision(precision_name):
        def run():
            compare_layer(batch_sizes, 5, 512, reverse=reverse, bias=True, precision=precision_name, seed=3,
                          what="H = 512, no waves")

        assert not any("one_cluster" in n for n in kernel_names(run))


def _fewer_than_8_clusters_of_16() -> bool:
    """Whether one-cluster kernels' 8 clusters of 16 blocks (H = 512, B = 57-64) cannot all be resident: GPUs
    of at most 132 SMs (an H100 / H200 holds 7), where paired_groups takes B = 64."""
    return torch.cuda.get_device_properties(0).multi_processor_count <= 132


# (precision, batch sizes (T = their count), reverse, SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS): B = 64 and 61 (a
# last group of 5 rows) under the rule; forced ("1"): one cluster whose second group is empty (B = 5) or
# part-filled (B = 12), three clusters with an empty last group (B = 36); T = 1 and 2 (the mbarrier phases:
# none armed, one).
_PAIRED_CASES = [("float16", [64] * 6, False, ""), ("bfloat16", [61] * 5, True, ""), ("float16", [5] * 4, False, "1"),
                 ("bfloat16", [12] * 3, True, "1"), ("float16", [36] * 5, True, "1"), ("bfloat16", [64], False, ""),
                 ("float16", [40] * 2, False, "1"), ("bfloat16", [64] * 67, True, "")]


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,batch_sizes,reverse,mode", _PAIRED_CASES)
def test_paired_groups_match_reference(monkeypatch, precision_name, batch_sizes, reverse, mode):
    """H = 512, equal batch sizes: the one-cluster kernels with two batch groups a cluster (paired_groups;
    one step of each group in turn, each with its own buffers and mbarriers): which kernels ran, and the
    outputs, h_n, c_n and every gradient against the float64 reference; SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS=0
    runs one group a cluster (in waves at B = 64 on an H200), compared once more."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.delenv("SEQKERNELS_LSTM_ONE_CLUSTER_WAVES", raising=False)
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS", mode)
    with _Precision(precision_name):
        def run():
            compare_layer(batch_sizes, 5, 512, reverse=reverse, bias=True, precision=precision_name,
                          seed=len(batch_sizes) + batch_sizes[0], what="paired groups")

        if mode == "1" or _fewer_than_8_clusters_of_16():
            assert _one_cluster_groups(run) == {"forward": {2}, "backward": {2}}
        else:
            run()
        monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS", "0")
        assert _one_cluster_groups(run) == {"forward": {1}, "backward": {1}}


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name", ["float16", "bfloat16"])
def test_paired_groups_are_deterministic(monkeypatch, precision_name):
    """Two identical training calls on paired groups (forced) give bit-identical outputs and gradients."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER_PAIRS", "1")
    dtype = DTYPE[precision_name]
    torch.manual_seed(11)
    model = seqkernels.LSTM(512, 512).to(device="cuda", dtype=dtype)
    x = torch.randn(9, 48, 512, device="cuda", dtype=dtype)

    def once():
        xg = x.clone().requires_grad_(True)
        model.zero_grad(set_to_none=True)
        y, (h, c) = model(xg)
        (y.float().square().sum() + h.float().sum() + c.float().sum()).backward()
        return [y, h, c, xg.grad] + [p.grad for p in model.parameters()]

    assert _one_cluster_groups(once) == {"forward": {2}, "backward": {2}}
    first, second = once(), once()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,B", [("bfloat16", 7), ("float16", 7), ("bfloat16", 20), ("float16", 64)])
def test_one_cluster_forward_in_cuda_graph(monkeypatch, precision_name, B):
    """Inference on the one-cluster kernel (one cluster, three at B = 20, at B = 64 four of two batch groups
    on an H200)
    captured in a CUDA graph: replays on fresh input data agree with eager calls of an identical model."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision(precision_name):
        dtype = DTYPE[precision_name]
        torch.manual_seed(7)
        model = seqkernels.LSTM(512, 512).to(device="cuda", dtype=dtype)
        static_x = torch.randn(5, B, 512, device="cuda", dtype=dtype)
        assert any("one_cluster" in n for n in kernel_names(lambda: model(static_x)))
        check_cuda_graph_replays(model, static_x)


# (precision, B, H, reverse, bias): the one-m16-tile instances (B <= 16), forced at every H and
# type (float32 with TF32 at H = 1024: half of W_hh's slice in shared memory); at H = 1024 from
# B = 2 (bf16 / fp16, and TF32 on scaled fp16 operands) without forcing.
_CLUSTER_FORWARD_FORCED_CASES = [
    ("bfloat16", 16, 1024, False, True), ("float16", 12, 1024, True, False), ("bfloat16", 1, 512, True, True),
    ("float16", 7, 256, False, True), ("tf32", 16, 512, True, True), ("tf32", 3, 256, False, True),
    ("float32", 16, 256, False, True), ("float32", 9, 512, True, True),
    ("tf32", 16, 1024, False, True), ("tf32", 7, 1024, True, False), ("tf32", 8, 1024, False, True),
    ("bfloat16", 6, 1024, True, True), ("float16", 5, 1024, False, True), ("bfloat16", 1, 1024, False, True),
]


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,B,H,reverse,bias", _CLUSTER_FORWARD_FORCED_CASES)
def test_cluster_forward_forced_matches_reference(monkeypatch, precision_name, B, H, reverse, bias):
    """The cluster kernel's one-m16-tile instances at B <= 16 (rows B..15 of the tile zero),
    forced with SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD=1: which kernel ran, and the outputs and
    every gradient against the float64 reference. Unset, it runs only at H = 1024, 16-bit types
    and TF32 (on scaled fp16 operands) from B = 2 (the direct kernel elsewhere at B <= 16). The
    row-split kernel, which takes the 16-bit types' calls at H = 1024, is off here."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "0")
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()
        auto = H == 1024 and B >= {"bfloat16": 2, "float16": 2, "tf32": 2}.get(precision_name, 17)
        assert ("cluster" in _persistent_variants(run, "forward", "cluster")) == auto
        monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "1")
        assert _persistent_variants(run, "forward", "cluster") == {"cluster"}
        compare_layer([B] * 6, 5, H, reverse=reverse, bias=bias, precision=precision_name, seed=B + H,
                      what="cluster forward, forced")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("poll_data", ["0", "1"], ids=["flags", "poll-data"])
@pytest.mark.parametrize("precision_name,B,H", [("bfloat16", 16, 1024), ("float16", 40, 256), ("tf32", 24, 1024)])
def test_cluster_forward_long_sequence_matches_reference(monkeypatch, precision_name, B, H, poll_data):
    """67 steps on the cluster kernel, whose exchange cycles through four buffers of h (each
    poisoned two steps before it is written again, the step flags only hints) 16 times: the
    outputs and every gradient against the float64 reference; with the step flags waited for
    first (SEQKERNELS_LSTM_CLUSTER_POLL_DATA=0), and without them (=1: the poisoned words polled;
    unset, the rule polls them where a block gathers at most 32 KiB of h_{t-1} a step). The
    row-split kernel is off here."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "1")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", poll_data)
    with _Precision(precision_name):
        run = _train_call(DTYPE[precision_name], B, H, T=3)
        run()
        assert _persistent_variants(run, "forward", "cluster") == {"cluster"}
        compare_layer([B] * 67, 5, H, reverse=False, bias=True, precision=precision_name, seed=67 + B,
                      what="cluster forward, 67 steps")


def _cluster_whole_k(fn) -> set[bool]:
    """The kWholeK template argument (the last) of the cluster forward kernels that ran in fn()."""
    return _last_bool_argument(fn, "lstm_persistent_forward_cluster_kernel")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("poll_data", ["0", "1"], ids=["flags", "poll-data"])
@pytest.mark.parametrize("precision_name,B,reverse", [("bfloat16", 16, False), ("float16", 8, True),
                                                      ("tf32", 12, False), ("bfloat16", 1, True)])
def test_cluster_forward_whole_k_matches_reference(monkeypatch, precision_name, B, reverse, poll_data):
    """The cluster kernel's instances at H = 1024 in one m16 tile on 16-bit operands (bf16, fp16,
    float32 with TF32 on scaled fp16 operands) multiply all of K in each block at B <= 8 (each block
    then reads all of h_{t-1} and sends no partial sums to its partner), K halves above;
    SEQKERNELS_LSTM_CLUSTER_WHOLE_K (diagnostic) "0" never, "1" at any B: which instance ran, and
    with whole K 67 steps (the four buffers of h cycled 16 times) against the float64 reference,
    outputs and every gradient, with the step flags of all 128 producers waited for first
    (SEQKERNELS_LSTM_CLUSTER_POLL_DATA=0) and with the poisoned words polled (=1). The row-split
    kernel, which takes the 16-bit types' calls at H = 1024, is off here."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", "1")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", poll_data)
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "0")
    monkeypatch.delenv("SEQKERNELS_LSTM_CLUSTER_WHOLE_K", raising=False)
    with _Precision(precision_name):
        run = _train_call(DTYPE[precision_name], B, 1024, T=3)
        run()
        assert _cluster_whole_k(run) == {B <= 8}
        monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_WHOLE_K", "0")
        assert _cluster_whole_k(run) == {False}
        monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_WHOLE_K", "1")
        assert _cluster_whole_k(run) == {True}
        compare_layer([B] * 67, 5, 1024, reverse=reverse, bias=True, precision=precision_name, seed=67 + B,
                      what="cluster forward, whole K, 67 steps")


def _row_split_tiles(fn) -> set[int]:
    """The NT template argument (n8 tiles of rows a block, the last) of the row-split kernels that ran in fn()."""
    return {int(v) for v in _last_arguments(fn, "lstm_persistent_forward_row_split_kernel", r"\d+")}


def _row_split_nt(B: int) -> int:
    """The row split's n8 tiles of rows a block at batch B (each block takes (B + 1) / 2 rows)."""
    return 1 if B <= 16 else 2 if B <= 32 else 4


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("poll_data", ["0", "1"], ids=["flags", "poll-data"])
@pytest.mark.parametrize("precision_name,B,reverse", [("bfloat16", 16, False), ("float16", 8, True),
                                                      ("bfloat16", 5, False), ("float16", 2, False),
                                                      ("bfloat16", 1, True), ("tf32", 16, True),
                                                      ("tf32", 5, False), ("tf32", 2, False),
                                                      ("tf32", 1, True)])
def test_cluster_forward_row_split_matches_reference(monkeypatch, precision_name, B, reverse, poll_data):
    """At H = 1024, B <= 16 the forward on 16-bit operands (16-bit types; float32 with TF32 on scaled
    fp16 operands) runs the row-split kernel (each block of a
    pair takes half of the batch rows, an odd B leaving one row fewer to block 1 and B = 1 none, for
    all of K and all of the cluster's units; W_hh as the MMA's A operand; each warp gathers its own
    K eighth); SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT=0 (diagnostic) never: which kernel ran, and 67
    steps (the four buffers of h cycled 16 times) against the float64 reference, outputs and every
    gradient, with the step flags of the producers of the warp's units waited for first
    (SEQKERNELS_LSTM_CLUSTER_POLL_DATA=0) and with the poisoned words polled (=1)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", poll_data)
    monkeypatch.delenv("SEQKERNELS_LSTM_PERSISTENT_CLUSTER_FORWARD", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", raising=False)

    with _Precision(precision_name):
        run = _train_call(DTYPE[precision_name], B, 1024, T=3)
        run()
        assert _row_split_tiles(run) == {1}  # one n8 tile of rows a block
        monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "0")
        assert _row_split_tiles(run) == set()
        monkeypatch.delenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT")
        compare_layer([B] * 67, 5, 1024, reverse=reverse, bias=True, precision=precision_name, seed=67 + B,
                      what="row-split forward, 67 steps")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("poll_data", ["0", "1"], ids=["flags", "poll-data"])
@pytest.mark.parametrize("precision_name,B,reverse,tiles", [("bfloat16", 17, False, 2), ("float16", 32, True, 2),
                                                            ("bfloat16", 33, True, 4), ("float16", 64, False, 4),
                                                            ("tf32", 24, True, 2), ("tf32", 49, False, 4)])
def test_row_split_wide_matches_reference(monkeypatch, precision_name, B, reverse, tiles, poll_data):
    """The row-split kernel also takes 16 < B <= 64 at H = 1024 (2 n8 tiles of rows a block to B = 32,
    4 to 64; B = 17 / 33 leave the last tile one row); SEQKERNELS_LSTM_ROW_SPLIT_WIDE=0 (diagnostic)
    gives those calls back to the cluster kernel: which instance ran, and 67 steps against the
    float64 reference, outputs and every gradient, with the step flags waited for first and with the
    poisoned words polled."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", poll_data)
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER", "0")
    monkeypatch.delenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", raising=False)
    monkeypatch.delenv("SEQKERNELS_LSTM_ROW_SPLIT_WIDE", raising=False)
    with _Precision(precision_name):
        run = _train_call(DTYPE[precision_name], B, 1024, T=3)
        run()
        assert _row_split_tiles(run) == {tiles}
        assert "cluster" not in _persistent_variants(run, "forward", "cluster")
        monkeypatch.setenv("SEQKERNELS_LSTM_ROW_SPLIT_WIDE", "0")
        assert _row_split_tiles(run) == set()
        assert _persistent_variants(run, "forward", "cluster") == {"cluster"}
        monkeypatch.delenv("SEQKERNELS_LSTM_ROW_SPLIT_WIDE")
        compare_layer([B] * 67, 5, 1024, reverse=reverse, bias=True, precision=precision_name, seed=71 + B,
                      what="wide row-split forward, 67 steps")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,B", [("float16", 40), ("bfloat16", 24), ("tf32", 12), ("tf32", 40),
                                              ("tf32", 1)])
def test_row_split_wide_in_cuda_graph(monkeypatch, precision_name, B):
    """Inference and a training step whose forward runs the row split (1 / 2 / 4 n8 tiles of rows a
    block; float32 with TF32 on scaled fp16 operands, its projection scaled too), captured in CUDA
    graphs: replays on fresh input data agree with eager calls."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, 1024, T=3)
        run()
        assert _row_split_tiles(run) == {_row_split_nt(B)}
        torch.manual_seed(11)
        model = seqkernels.LSTM(1024, 1024).to(device="cuda", dtype=dtype)
        static_x = torch.randn(5, B, 1024, device="cuda", dtype=dtype)
        check_cuda_graph_replays(model, static_x)


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("poll_data", ["0", "1"], ids=["flags", "poll-data"])
@pytest.mark.parametrize("precision_name,B,reverse", [("bfloat16", 16, False), ("float16", 8, True),
                                                      ("bfloat16", 5, True), ("float16", 15, False),
                                                      ("float16", 2, False), ("bfloat16", 1, True)])
def test_row_split_backward_matches_reference(monkeypatch, precision_name, B, reverse, poll_data):
    """At H = 1024, B <= 16, bf16 / fp16, the persistent backward runs the row-split backward kernel
    (128 blocks of 16 units, each taking half of the batch rows for all of K = 4H: an odd B leaves
    block 1 of a pair a row fewer, B = 1 none; dG exchanged between the blocks of a half every
    step); SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD=0 (diagnostic) never: which kernel ran, and 67 steps
    (the four exchange buffers cycled 16 times), 1 and 2 against the float64 reference, every
    gradient (dx, dW_ih, dW_hh and the biases from its dG and hprev, grad_h0 from its last product,
    grad_c0 its last dc), with the producers' step flags waited for first
    (SEQKERNELS_LSTM_CLUSTER_POLL_DATA=0) and with the poisoned words polled (=1)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_POLL_DATA", poll_data)
    monkeypatch.delenv("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD", raising=False)
    with _Precision(precision_name):
        run = _train_call(DTYPE[precision_name], B, 1024, T=3)
        run()
        assert _persistent_variants(run, "backward", "row_split") == {"row_split"}
        for steps in (67, 1, 2):
            compare_layer([B] * steps, 5, 1024, reverse=reverse, bias=True, precision=precision_name,
                          seed=steps + B, what=f"row-split backward, {steps} steps")
        monkeypatch.setenv("SEQKERNELS_LSTM_ROW_SPLIT_BACKWARD", "0")
        assert "row_split" not in _persistent_variants(run, "backward", "row_split")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
def test_row_split_backward_leaves_ragged_batches(monkeypatch):
    """A packed sequence whose batch shrinks is not the row-split backward's (every step full): the
    split or general backward kernel takes it, right against the reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision("bfloat16"):
        names = kernel_names(lambda: compare_layer([9, 9, 4, 1], 5, 1024, reverse=True, bias=True,
                                                   precision="bfloat16", what="ragged, not the row split"))
        assert not any("backward_row_split" in n for n in names)
        assert any("lstm_persistent_backward" in n for n in names)


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,B", [("bfloat16", 16), ("float16", 3)])
def test_row_split_backward_in_cuda_graph(monkeypatch, precision_name, B):
    """A training step whose backward runs the row-split backward kernel, captured in a CUDA graph
    (with inference): replays on fresh input data agree with eager calls."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)  # auto takes it
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, 1024, T=3)
        run()
        assert _persistent_variants(run, "backward", "row_split") == {"row_split"}
        torch.manual_seed(13)
        model = seqkernels.LSTM(1024, 1024).to(device="cuda", dtype=dtype)
        static_x = torch.randn(6, B, 1024, device="cuda", dtype=dtype)
        check_cuda_graph_replays(model, static_x)


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
def test_cluster_forward_x3_keeps_an_inf_in_h0_as_float32(monkeypatch):
    """float32 without TF32 on the cluster kernel: an inf in h0 reaches the first step's
    pre-activations as a float32 GEMM gives it (the row's gates saturate, its outputs stay
    finite), not as NaN (inf times W_hh's small part, 0 wherever W_hh is exact in TF32): the
    kernel multiplies h0's non-finite values in a pass of their own, with W_hh's TF32 part only."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    _check_inf_in_h0_as_float32([20] * 4, 256)


def _cluster_products(fn) -> set[str]:
    """The operands of the cluster forward kernels that ran during fn(): their last template
    argument (ClusterOperands) as "native" (16-bit, or TF32), "half" (scaled fp16) or "x3"."""
    products = set()
    for n in kernel_names(fn):
        if "lstm_persistent_forward_cluster_kernel" in n:
            m = re.search(r"ClusterOperands\)(\d+)", n)
            assert m, n
            products.add(("native", "native", "half", "x3")[int(m.group(1))])
    return products


def _scaled_operands_taken(row_split: bool, B: int):
    """taken(run) for float32 with TF32 on scaled fp16 operands: the row split in its n8 tiles for B,
    or (row_split False) the cluster kernel's scaled-operand instance."""
    if row_split:
        return lambda run: _row_split_tiles(run) == {_row_split_nt(B)}
    return lambda run: _cluster_products(run) == {"half"}


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("B,H,reverse", [(64, 1024, False), (40, 1024, True), (20, 1024, False), (64, 256, True),
                                         (33, 512, False), (8, 1024, True), (16, 1024, False)])
def test_cluster_forward_tf32_operands(monkeypatch, half, B, H, reverse):
    """float32 with TF32 on the cluster kernel: by default on fp16 operands scaled by powers of two
    (TF32's 10-bit mantissa; every H, B up to 64; the input projection likewise), with
    SEQKERNELS_LSTM_CLUSTER_HALF=0 on TF32 operands (no instance at H = 1024 beyond B = 32): which
    ran, and the outputs and every gradient against the float64 reference within TF32's bound. The
    row split, which takes the scaled fp16 operands' calls at H = 1024, is off here."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "0")
    if not half:
        monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_HALF", "0")
    with _Precision("tf32"):
        run = _train_call(torch.float32, B, H, T=3)
        run()
        fits = half or H < 1024 or B <= 32
        assert _cluster_products(run) == ({"half" if half else "native"} if fits else set())
        # its input projection too (I % 4 == 0), as an fp16 GEMM of rows scaled by powers of two
        assert any("scale_rows_to_half" in n for n in kernel_names(run)) == half
        compare_layer([B] * 6, 8, H, reverse=reverse, bias=True, precision="tf32", seed=B + H,
                      what=f"cluster forward, {'scaled fp16' if half else 'TF32'} operands")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("row_split", [True, False], ids=["row-split", "cluster"])
@pytest.mark.parametrize("B,I", [(8, 9), (64, 12), (5, 12)])
def test_cluster_forward_half_products_scale_h0_and_w_hh(monkeypatch, B, I, row_split):
    """The scaled fp16 operands of float32 with TF32 (the row-split kernel at H = 1024, and the
    cluster kernel with SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT=0): an h0 row beyond fp16's range (~1e5, row 0)
    and one far below it (~1e-5, row 1), with W_hh at 1e-5 of nn.LSTM's range (its largest value
    ~3e-7, an fp16 subnormal unscaled), so that row 0's h0·W_hh stays O(1) and its gates do not
    saturate; at I = 12 (the projection scaled too; I = 9 leaves it to TF32) x's packed rows 0 and 1
    likewise against W_ih: the outputs and every gradient against the float64 reference within
    TF32's bound. Unscaled, row 0 would overflow to inf (then NaN) and W_hh would keep ~2
    significant bits."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "1" if row_split else "0")
    _check_scaled_h0_and_w_hh([B] * 4, I, 1024, 83, _scaled_operands_taken(row_split, B),
                              f"scaled fp16 operands B={B}, {'row split' if row_split else 'cluster kernel'}")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("row_split,B,H", [("1", 5, 1024), ("1", 40, 1024), ("0", 8, 1024), ("0", 20, 256),
                                           ("0", 33, 512)])
def test_half_operands_scale_every_w_hh_slice(monkeypatch, row_split, B, H):
    """float32 with TF32 on scaled fp16 operands (the row-split kernel, and the cluster kernel with
    SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT=0): every row of W_hh holds one value 16x nn.LSTM's range, at
    column (37 row) % H (every column residue, spread over every warp's slice). Each warp scales its
    slice by its largest finite magnitude; a value its scan missed would overflow fp16 (16x the
    scaled maximum of [2^14, 2^15) is beyond 65504) and the outputs would not be finite. The
    outputs and every gradient against the float64 reference within TF32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", row_split)
    batch_sizes = [B] * 4
    t, up = layer_case(batch_sizes, 12, H, True, seed=B + H)
    rows = torch.arange(4 * H)
    cols = rows * 37 % H
    t["w_hh"][rows, cols] = torch.where(rows % 2 == 0, 16.0, -16.0).double() * H**-0.5
    _check_float32_call(t, up, batch_sizes, _scaled_operands_taken(row_split == "1", B),
                        f"W_hh's scan, B={B} H={H}, row split {row_split}")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("B", [5, 24])
def test_half_operands_leave_misaligned_w_hh(monkeypatch, B):
    """float32 with TF32 at H = 1024, W_hh 4 bytes past a 16-byte boundary (a view one float into
    its buffer): the scaled-operand kernels read W_hh as float4s, so neither the row split nor the
    cluster kernel takes the call, nor is the scaled fp16 projection computed for them
    (scale_rows_to_half_kernel: no other loop scales a misaligned W_hh either); what does take it
    (auto) gives the reference's values."""
    monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND", raising=False)
    batch_sizes = [B] * 4
    t, up = layer_case(batch_sizes, 12, 1024, True, seed=B)

    def misaligned_w_hh(x, bs, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
        w_view = torch.cat([w_hh.new_zeros(1), w_hh.flatten()])[1:].view_as(w_hh)
        assert w_view.data_ptr() % 16 == 4 and w_view.is_contiguous()
        return lstm_layer(x, bs, h0, c0, w_ih, w_view, b_ih, b_hh, w_hr, reverse=reverse)

    _check_float32_call(t, up, batch_sizes,
                        lambda run: not _row_split_tiles(run) and "half" not in _cluster_products(run) and
                        not any("scale_rows_to_half" in n for n in kernel_names(run)),
                        f"misaligned W_hh, B={B}", fn=misaligned_w_hh)


def _check_scaled_h0_and_w_hh(batch_sizes: list[int], I: int, H: int, seed: int, taken, what: str,
                              precision: str = "tf32") -> None:
    """float32 on scaled fp16 operands (with TF32; precision "float32": without it, x3 on fp16
    parts): W_hh at 1e-5 of nn.LSTM's range, h0's row 0 at 1e5 and row 1 at 1e-5 (and with
    I % 4 == 0, where the projection is scaled too, W_ih and x's packed rows 0 and 1 likewise):
    taken(run) holds for the call, and its outputs and every gradient are within the precision's
    bound of the float64 reference."""
    t, up = layer_case(batch_sizes, I, H, True, seed=seed)
    t["w_hh"] *= 1e-5
    t["h0"][0] *= 1e5
    t["h0"][1] *= 1e-5
    if I % 4 == 0:
        t["w_ih"] *= 1e-5
        t["x"][0] *= 1e5
        t["x"][1] *= 1e-5
    _check_float32_call(t, up, batch_sizes, taken, what, precision)


def _check_float32_call(t: dict, up: dict, batch_sizes: list[int], taken, what: str, precision: str = "tf32",
                        fn=lstm_layer) -> None:
    """fn (lstm_layer's signature) on the GPU in float32 under the precision (tf32 or float32) on the
    float64 case t, up: taken(run) holds for the call, and its outputs and every gradient are within
    the precision's bound of the float64 reference."""

    def run():
        return run_layer(fn, t, up, batch_sizes, False, torch.float32, "cuda")

    with _Precision(precision):
        got = run()
        assert taken(run)
    ref64 = run_layer(_reference, t, up, batch_sizes, False, torch.float64, "cpu")
    check(got, ref64, precision, what)


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("row_split", ["1", "0"], ids=["row-split", "cluster"])
@pytest.mark.parametrize("B", [40, 6])
def test_cluster_forward_half_products_keep_infs(monkeypatch, B, row_split):
    """float32 with TF32 on scaled fp16 operands (the row-split kernel at H = 1024, and the cluster
    kernel with SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT=0): an inf in h0 and one in x (which set no scale)
    reach the first step's pre-activations as in TF32 GEMMs (the rows' gates saturate, their outputs
    stay finite)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", row_split)
    with _Precision("tf32"):
        ran_row_split = bool(_row_split_tiles(_train_call(torch.float32, B, 1024, T=3)))
    assert ran_row_split == (row_split == "1")
    _check_inf_in_h0_as_float32([B] * 4, 1024, "tf32", I=12, x_inf=True)


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("batch_sizes,H", [([40, 40, 33, 20, 1], 256), ([64, 64, 17], 512)])
def test_cluster_forward_leaves_ragged_batches(monkeypatch, batch_sizes, H):
    """A packed sequence whose batch shrinks is not the cluster kernel's: the general persistent
    kernel or the cuBLAS loop takes it, with the reference's values."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    with _Precision("bfloat16"):
        t, up = layer_case(batch_sizes, 5, H, True, seed=3)

        def run():
            run_layer(lstm_layer, t, up, batch_sizes, False, torch.bfloat16, "cuda")

        assert "cluster" not in _persistent_variants(run, "forward", "cluster")
        compare_layer(batch_sizes, 5, H, reverse=False, bias=True, precision="bfloat16", seed=3,
                      what="ragged, cluster forward not taken")


@pytest.mark.skipif(not _sm90(), reason="thread-block clusters need sm_90")
@pytest.mark.parametrize("precision_name,B,H", [("bfloat16", 33, 256), ("tf32", 40, 1024)])
def test_cluster_forward_in_cuda_graph(monkeypatch, precision_name, B, H):
    """Inference and a training step whose forward runs the cluster kernel (bf16, the one-cluster
    kernel off; float32 with TF32 on scaled fp16 operands, the row split off), captured in CUDA
    graphs: replays on fresh input data agree with eager calls."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "persistent")
    monkeypatch.setenv("SEQKERNELS_LSTM_ONE_CLUSTER", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_CLUSTER_ROW_SPLIT", "0")
    dtype = DTYPE[precision_name]
    with _Precision(precision_name):
        run = _train_call(dtype, B, H, T=3)
        run()
        assert _persistent_variants(run, "forward", "cluster") == {"cluster"}
        torch.manual_seed(7)
        model = seqkernels.LSTM(H, H).to(device="cuda", dtype=dtype)
        static_x = torch.randn(5, B, H, device="cuda", dtype=dtype)
        check_cuda_graph_replays(model, static_x)


def test_backend_variable_is_validated(monkeypatch):
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fastest")
    x = torch.randn(3, 2, 4, device="cuda")
    model = seqkernels.LSTM(4, 8).cuda()
    with pytest.raises(RuntimeError, match="SEQKERNELS_LSTM_BACKEND"):
        model(x)


# --------------------------------------------------------------------------------------
# CUDA graphs and determinism
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision_name", ["tf32", "bfloat16", "float32"])
def test_cuda_graph_forward_and_training_step(backend, precision_name):
    """Capture inference and a training step (forward + backward) in CUDA graphs; replays on
    fresh input data agree with eager calls of an identical model."""
    with _Precision(precision_name):
        dtype = DTYPE[precision_name]
        torch.manual_seed(3)
        T, B, H = 7, 5, 96
        model = seqkernels.LSTM(H, H, num_layers=2, bidirectional=True).to(device="cuda", dtype=dtype)
        static_x = torch.randn(T, B, H, device="cuda", dtype=dtype)
        check_cuda_graph_replays(model, static_x)


@pytest.mark.parametrize("precision_name,B,H", [("bfloat16", 16, 256), ("tf32", 17, 1024), ("float32", 3, 64),
                                                ("float64", 2, 33), ("bfloat16", 64, 512), ("float16", 40, 1024)])
def test_bitwise_deterministic(backend, precision_name, B, H):
    with _Precision(precision_name):
        dtype = DTYPE[precision_name]
        torch.manual_seed(5)
        model = seqkernels.LSTM(H, H, bidirectional=True).to(device="cuda", dtype=dtype)
        x = torch.randn(9, B, H, device="cuda", dtype=dtype)
        first, second = lstm_training_results(model, x), lstm_training_results(model, x)
        for a, b in zip(first, second):
            assert torch.equal(a, b)


def test_backends_agree_on_the_env_default(monkeypatch):
    """auto (the default) gives the persistent kernel's results where it applies."""
    with _Precision("bfloat16"):
        torch.manual_seed(9)
        model = seqkernels.LSTM(64, 64).to(device="cuda", dtype=torch.bfloat16)
        x = torch.randn(5, 4, 64, device="cuda", dtype=torch.bfloat16)
        outs = {}
        for value in ("auto", "persistent"):
            monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", value)
            with torch.no_grad():
                outs[value] = model(x)[0]
        monkeypatch.delenv("SEQKERNELS_LSTM_BACKEND")
        with torch.no_grad():
            outs["unset"] = model(x)[0]
        assert torch.equal(outs["auto"], outs["persistent"]) and torch.equal(outs["unset"], outs["persistent"])
        assert os.environ.get("SEQKERNELS_LSTM_BACKEND") is None


# --------------------------------------------------------------------------------------
# The cuBLAS and fused loops replayed from CUDA graphs (csrc/cuda/replayed_steps.cuh)
# --------------------------------------------------------------------------------------
# With equal batch sizes, no projection and T >= 16, the cuBLAS loop and the fused-step loop
# capture 16 steps into a CUDA graph, keep it for later calls of the same sizes (the cuBLAS
# loop: and W_hh), and run the T % 16 steps left over eagerly. T = 37: two replayed chunks and
# five eager steps.
REPLAY_T = 37


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("B,H,bias", [(1, 7, True), (3, 64, False), (16, 256, True)])
def test_replayed_cublas_loop_matches_reference(monkeypatch, precision, B, H, bias, reverse):
    """Two calls of each case (the first captures the chunk, the second replays the kept one),
    outputs and every gradient against the float64 reference. H = 7: the scalar kernels."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    for call in range(2):
        compare_layer([B] * REPLAY_T, 5, H, reverse=reverse, bias=bias, precision=precision,
                      seed=B * 100 + H + call, what=f"replayed cuBLAS loop, call {call}")


# With a projection (proj_size) the cuBLAS loop, the only loop that has one, replays its steps
# too: a forward step is three nodes (h_{t-1}·W_hhᵀ, the gate kernel, m_t·W_hrᵀ into the kept h),
# a backward step four (dh, dh·W_hr, the gate kernel, dG·W_hh). T = 37: two replayed chunks and
# five eager steps; H = 7 with P = 3 (odd sizes), P = H - 1.
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("B,H,P,bias", [(1, 7, 3, True), (3, 64, 16, False), (16, 256, 128, True), (5, 48, 47, True)])
def test_replayed_cublas_loop_with_projection_matches_reference(precision, B, H, P, bias, reverse):
    """Two calls of each case (the first captures the chunks, the second replays the kept ones),
    outputs and every gradient (grad_w_hr among them) against the float64 reference."""
    for call in range(2):
        compare_layer([B] * REPLAY_T, 5, H, reverse=reverse, bias=bias, precision=precision,
                      seed=B * 100 + H + P + call, what=f"replayed projected cuBLAS loop, call {call}", P=P)


@pytest.mark.parametrize("batch_sizes,env,replayed", [([4] * 20, None, True), ([4] * 15, None, False),
                                                      ([4] * 19 + [3], None, False), ([4] * 20, "0", False)])
def test_projected_steps_are_replayed(monkeypatch, batch_sizes, env, replayed):
    """A projected call replays its steps from T = 16 with equal batch sizes (the projected step
    kernels run), else it runs the plain loop (its dh kernel, lstm_backward_dh_kernel);
    SEQKERNELS_LSTM_REPLAY_PROJECTION=0 keeps it on the plain loop."""
    if env is None:
        monkeypatch.delenv("SEQKERNELS_LSTM_REPLAY_PROJECTION", raising=False)
    else:
        monkeypatch.setenv("SEQKERNELS_LSTM_REPLAY_PROJECTION", env)
    t, up = layer_case(batch_sizes, 6, 32, True, seed=7, P=12)
    names = kernel_names(lambda: run_layer(lstm_layer, t, up, batch_sizes, False, torch.float32, "cuda"))
    for pass_ in ("forward", "backward"):
        assert any(f"lstm_{pass_}_replay_projected_step_kernel" in n for n in names) == replayed, pass_
    assert any("lstm_backward_dh_kernel" in n for n in names) == (not replayed)


# A ragged PackedSequence (without a projection) replays the cuBLAS loop's steps too: the GEMMs run
# over all B rows and each step kernel reads its rows from a step table; rows past a step's keep
# their state, in the backward's forward direction a row whose sequence ends at a step takes
# grad_h_n there, and in reverse a row that ends early keeps its grad_h0 before the next GEMM. T =
# 37 (two chunks, five eager steps); batch sizes that fall inside a chunk, at its edges and in the
# eager tail; one that falls at every step (B = 37); H = 7 scalar, 64 / 256 vectorised.
RAGGED_37 = [6] * 9 + [5] * 7 + [3] * 16 + [2] * 4 + [1]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_sizes,H,bias", [(RAGGED_37, 7, True), (RAGGED_37, 64, False),
                                                (list(range(37, 0, -1)), 256, True)])
def test_replayed_cublas_loop_ragged_matches_reference(monkeypatch, precision, batch_sizes, H, bias, reverse):
    """Two calls of each case (a capture, then a replay of the kept chunk), outputs and every
    gradient (grad_h0 and grad_c0 of rows that start or end at different steps among them)
    against the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    for call in range(2):
        compare_layer(batch_sizes, 5, H, reverse=reverse, bias=bias, precision=precision,
                      seed=len(set(batch_sizes)) + H + call, what=f"replayed ragged cuBLAS loop, call {call}")


# x3 steps: the cuBLAS loop's forward products in float32 without TF32 as one TF32 GEMM on the
# operands' stacked parts (lstm.cu's use_x3_steps: from B = 17, at any B with
# SEQKERNELS_LSTM_X3_STEPS=1): replayed (equal batch sizes, T = 37: two chunks and five eager
# steps) and plain (packed and ragged), both directions; H = 7 (scalar stores) and 64 / 256
# (16-byte stores in the replayed step kernel).
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_sizes,H", [([3] * REPLAY_T, 7), ([5] * REPLAY_T, 64), ([17, 17, 9, 3, 3, 1], 64),
                                           ([40, 40, 33, 8], 256)])
def test_x3_steps_match_reference(monkeypatch, batch_sizes, H, reverse):
    """Two calls of each case (a replayed one captures its chunks, then replays them): outputs
    and every gradient against the float64 reference within float32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_STEPS", "1")
    with _Precision("float32"):
        for call in range(2):
            compare_layer(batch_sizes, 5, H, reverse=reverse, bias=True, precision="float32",
                          seed=sum(batch_sizes) + H + call, what=f"x3 steps, call {call}")


def _cublas_training_runs(monkeypatch, switch, env, precision_name, B, H, T, kernel) -> bool:
    """Whether a training call of the cuBLAS loop runs a kernel whose name holds `kernel`, with the
    diagnostic `switch` set to env (unset where None)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    if env is None:
        monkeypatch.delenv(switch, raising=False)
    else:
        monkeypatch.setenv(switch, env)
    with _Precision(precision_name):
        run = _train_call(DTYPE[precision_name], B, H, T=T)
        run()
        return any(kernel in n for n in kernel_names(run))


@pytest.mark.parametrize("precision_name,B,env,taken", [
    ("float32", 17, None, True), ("float32", 16, None, False), ("float32", 4, "1", True),
    ("float32", 64, "0", False), ("tf32", 32, None, False), ("float64", 32, "1", False)])
def test_x3_steps_are_taken(monkeypatch, precision_name, B, env, taken):
    """Where the cuBLAS loop runs x3 steps: float32 without TF32 from B = 17, or as
    SEQKERNELS_LSTM_X3_STEPS says; never with TF32 or another dtype. They split W_hh at the start
    of the forward (the input projection is too small here to split)."""
    assert _cublas_training_runs(monkeypatch, "SEQKERNELS_LSTM_X3_STEPS", env, precision_name, B, 32, 4,
                                 "split_tf32") == taken


def test_x3_steps_keep_an_inf_in_h0_as_float32(monkeypatch):
    """An inf in h0 reaches the first step's pre-activations as a float32 GEMM gives it (±inf:
    the row's gates saturate and its outputs stay finite), not as NaN: the cross term takes the
    inf's big part as 0 and its small part is 0. Replayed and plain."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_STEPS", "1")
    for batch_sizes in ([4] * REPLAY_T, [4, 4, 3, 1]):
        _check_inf_in_h0_as_float32(batch_sizes, 64)


# x3 dh: the replayed cuBLAS loop's backward step GEMM dh = dG·W_hh in float32 without TF32 on
# exact split operands (lstm.cu's use_x3_dh; at any B with SEQKERNELS_LSTM_X3_DH=1): on scaled
# fp16 parts and their remainders where a row part's units fit (HalfDhStep's x3: 1 K part at
# B = 5, H = 64, 4 by default from B = 8, 8 forced), else one TF32 GEMM on stacked parts, W_hh's
# split transposed (H = 7, and H = 64 in 4 parts: 16-unit parts); in its default K parts and forced
# to 1, 4, 8 and 3 (3 does not divide K here: halves that do). The forward keeps float32's GEMMs
# (X3_STEPS=0) so that the gradients' error is the backward's, and the products their float32
# GEMMs or fp16 parts (X3_PRODUCTS=0), so that the only transposed TF32 split is W_hh's.
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("B,H,parts,half", [
    (3, 7, None, False), (5, 64, None, False), (5, 64, "1,1", True), (20, 64, "1,4", False), (40, 256, None, True),
    (40, 256, "1,3", True), (20, 512, "1,8", True), (64, 1024, None, True)])
def test_x3_dh_matches_reference(monkeypatch, B, H, parts, half, reverse):
    """Two calls of each case (the first captures its chunks, the second replays them; T = 37:
    two chunks and five eager steps): outputs and every gradient against the float64 reference
    within float32's bound; and the parts it ran on (fp16: scale_w_hh_parts_kernel; TF32:
    split_tf32_transposed)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_DH", "1")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_STEPS", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_PRODUCTS", "0")
    if parts is not None:
        monkeypatch.setenv("SEQKERNELS_LSTM_K_PARTS", parts)
    with _Precision("float32"):
        names = kernel_names(_train_call(torch.float32, B, H, T=20))
        assert any("scale_w_hh_parts_kernel" in n for n in names) == half, "fp16 parts"
        assert any("split_tf32_transposed" in n for n in names) == (not half), "TF32 parts"
        for call in range(2):
            compare_layer([B] * REPLAY_T, 5, H, reverse=reverse, bias=True, precision="float32",
                          seed=B + H + call, what=f"x3 dh, call {call}")


@pytest.mark.parametrize("I", [5, 100])
def test_x3_dh_with_split_products_matches_reference(monkeypatch, I):
    """x3 dh with the backward's split products forced: dx's W_ih parts go into the loop's idle
    W_hh parts where they fit (I = 5 <= H), else into a buffer of their own (I = 100 > H = 64);
    two calls, outputs and every gradient against the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_DH", "1")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_PRODUCTS", "1")
    with _Precision("float32"):
        for call in range(2):
            compare_layer([6] * REPLAY_T, I, 64, reverse=call == 1, bias=True, precision="float32", seed=I + call,
                          what=f"x3 dh and split products, call {call}")


@pytest.mark.parametrize("precision_name,B,H,env,taken", [
    ("float32", 64, 768, None, True), ("float32", 64, 512, None, False), ("float32", 48, 1024, None, False),
    ("float32", 4, 32, "1", True), ("float32", 64, 768, "0", False), ("tf32", 64, 768, None, False),
    ("float64", 32, 32, "1", False)])
def test_x3_dh_is_taken(monkeypatch, precision_name, B, H, env, taken):
    """Where the replayed backward runs x3 dh: float32 without TF32 from B = 64 with B·H >= 49152,
    or as SEQKERNELS_LSTM_X3_DH says; never with TF32 or another dtype. On TF32 parts
    (SEQKERNELS_LSTM_STEP_HALF=0) it splits W_hh transposed at the start of the backward (the only
    transposed split here: the weight gradients' split products are switched off)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_PRODUCTS", "0")
    monkeypatch.setenv("SEQKERNELS_LSTM_STEP_HALF", "0")
    assert _cublas_training_runs(monkeypatch, "SEQKERNELS_LSTM_X3_DH", env, precision_name, B, H, REPLAY_T,
                                 "split_tf32_transposed") == taken


@pytest.mark.parametrize("B,H,env,taken", [
    (32, 512, None, True), (64, 256, None, True), (32, 256, None, False), (16, 1024, None, False),
    (4, 256, "1", True), (4, 64, "1", False), (64, 512, "0", False)])
def test_x3_dh_on_half_parts_is_taken(monkeypatch, B, H, env, taken):
    """Where x3 dh runs on fp16 parts (its units fit: not B = 4, H = 64, whose 4 K parts have 16
    units): from B = 32 with B·H >= 16384, or as SEQKERNELS_LSTM_X3_DH says; it scales W_hh's
    parts at the start of the backward."""
    assert _cublas_training_runs(monkeypatch, "SEQKERNELS_LSTM_X3_DH", env, "float32", B, H, REPLAY_T,
                                 "scale_w_hh_parts_kernel") == taken


@pytest.mark.parametrize("H", [32, 256])
def test_x3_dh_keeps_inf_as_float32(monkeypatch, H):
    """An inf in grad_y at a middle step (row 2) reaches the earlier steps through dh: the x3
    dh GEMM gives inf and NaN where the float64 reference has them, and the reference's values
    elsewhere. On TF32 parts (H = 32) its cross terms take the inf's big part as 0, and its small
    part is 0; on fp16 parts (H = 256) the step keeps big·big alone where it is not finite."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_DH", "1")
    batch_sizes, I = [4] * REPLAY_T, 6
    t, up = layer_case(batch_sizes, I, H, bias=True, seed=53)
    up["y"][20 * 4 + 2, 5] = float("inf")
    with _Precision("float32"):
        got = run_layer(lstm_layer, t, up, batch_sizes, False, torch.float32, "cuda")
    ref = run_layer(_reference, t, up, batch_sizes, False, torch.float64, "cpu")
    assert not torch.isfinite(ref["grad_x"]).all() and torch.isfinite(ref["grad_x"]).any()
    _check_nonfinite_as_reference(got, ref, ("grad_x", "grad_w_ih", "grad_w_hh", "grad_b_ih", "grad_h0", "grad_c0"))


# The replayed cuBLAS loop's step GEMMs split along K (step_k_parts, forced): the step kernels
# sum the parts (forward: up to 4 row blocks of rec, with the x3 steps' halves; backward: up to
# 8 of dh, with x3 dh's halves), and the backward's grad_h0 is the parts of its last GEMM summed.
# The remaining T % 16 steps run the same split GEMM eagerly. "4,8" with x3: 2 forward parts and
# 4 backward ones (8 row blocks each); "3,3": parts that do not divide K fall back to halves that
# do (one here).
@pytest.mark.parametrize("parts", ["2,4", "4,8", "3,3"])
@pytest.mark.parametrize("precision_name,x3", [("tf32", None), ("bfloat16", None), ("float16", None),
                                               ("float32", "1"), ("float32", "0"), ("float64", None)])
def test_step_k_parts_match_reference(monkeypatch, parts, precision_name, x3):
    """Two calls (capture, then replay), both directions, outputs and every gradient against
    the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_K_PARTS", parts)
    if x3 is not None:
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_STEPS", x3)
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_DH", x3)
    with _Precision(precision_name):
        for call, reverse in ((0, False), (1, False), (2, True)):
            compare_layer([6] * REPLAY_T, 5, 64, reverse=reverse, bias=True, precision=precision_name,
                          seed=call + len(parts) * 7, what=f"K parts {parts}, call {call}")


@pytest.mark.parametrize("batch", [2, 8])
def test_tf32_forward_parts_rule_matches_reference(monkeypatch, batch):
    """The rule's own split (step_k_parts, no override): the TF32 forward in 2 parts at H = 512,
    2 <= B <= 8, captured then replayed, outputs and gradients against the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.delenv("SEQKERNELS_LSTM_K_PARTS", raising=False)
    with _Precision("tf32"):
        for call in range(2):
            compare_layer([batch] * REPLAY_T, 5, 512, reverse=False, bias=True, precision="tf32", seed=call + batch,
                          what=f"TF32 forward parts, call {call}")


def test_step_k_parts_setting_is_read(monkeypatch):
    """The diagnostic switch reaches the replayed loop's choice: a malformed value is an error
    naming it."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_K_PARTS", "4")
    t, up = layer_case([6] * REPLAY_T, 5, 64, True, 3)
    with pytest.raises(RuntimeError, match="SEQKERNELS_LSTM_K_PARTS"):
        run_layer(lstm_layer, t, up, [6] * REPLAY_T, False, torch.float64, "cuda")


# The fused loop's shapes: 2 units per block and one m16 tile (B = 1, H = 64), several tiles
# (B = 17), two batch blocks of 8 tiles (B = 200), 8 units per block (H = 1024 on 132 SMs).
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("B,H,bias", [(1, 64, True), (17, 256, False), (200, 64, True), (3, 1024, True)])
@pytest.mark.parametrize("precision_name", ["tf32", "bfloat16", "float16", "float32"])
def test_replayed_fused_loop_matches_reference(monkeypatch, precision_name, B, H, bias, reverse):
    """Two calls of each case (the first captures the chunks, the second replays the kept
    ones), outputs and every gradient against the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fused")
    with _Precision(precision_name):
        for call in range(2):
            compare_layer([B] * REPLAY_T, 5, H, reverse=reverse, bias=bias, precision=precision_name,
                          seed=B * 100 + H + call, what=f"replayed fused loop, call {call}")


# The fused backward with its W slice read from L2, where the slice would leave one block per SM
# (StepGeometry::w_global: 16-bit above H ~ 1700, TF32 above ~ 850): replayed (equal batch
# sizes, T = 37) and plain (a packed, ragged sequence), in both directions.
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_sizes", [[2] * REPLAY_T, [3, 3, 2, 1]])
@pytest.mark.parametrize("precision_name", ["bfloat16", "tf32", "float32"])
def test_fused_backward_with_its_slice_in_l2_matches_reference(monkeypatch, precision_name, batch_sizes, reverse):
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fused")
    with _Precision(precision_name):
        compare_layer(batch_sizes, 5, 1792, reverse=reverse, bias=True, precision=precision_name,
                      seed=len(batch_sizes), what="fused backward, W slice in L2")


@pytest.mark.parametrize("loop,precision_name", [("cublas", "float64"), ("cublas", "bfloat16"), ("fused", "tf32"),
                                                ("fused", "bfloat16"), ("fused", "float32")])
def test_replayed_loops_in_a_stacked_bidirectional_module(monkeypatch, loop, precision_name):
    """Two layers, both directions, T = 37, with initial states: every layer and direction
    replays its steps (the fused loop's four share one key, its packed W_hh refilled by each in
    turn). Two calls (capture, then the kept chunks): outputs, h_n, c_n and all gradients
    against nn.LSTM in float64."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
    dtype = DTYPE[precision_name]
    B, I, H = 5, 7, 64
    torch.manual_seed(50)
    ref = nn.LSTM(I, H, num_layers=2, bidirectional=True).double()
    ours = seqkernels.LSTM(I, H, num_layers=2, bidirectional=True).to(device="cuda", dtype=dtype)
    ours.load_state_dict(ref.state_dict())
    with _Precision(precision_name):
        for call in range(2):
            x = torch.randn(REPLAY_T, B, I, dtype=torch.float64)
            hx = (torch.randn(4, B, H, dtype=torch.float64), torch.randn(4, B, H, dtype=torch.float64))
            upstream = {"output": torch.randn(REPLAY_T, B, 2 * H, dtype=torch.float64),
                        "h_n": torch.randn(4, B, H, dtype=torch.float64),
                        "c_n": torch.randn(4, B, H, dtype=torch.float64)}
            got = module_results(ours, x, hx, upstream, "cuda", dtype)
            ref64 = module_results(ref, x, hx, upstream, "cpu", torch.float64)
            baselines = None
            if precision_name in LOW:
                peer = copy.deepcopy(ref).to(device="cuda", dtype=dtype)  # cuDNN in the same dtype
                baselines = [module_results(peer, x, hx, upstream, "cuda", dtype)]
            check(got, ref64, precision_name, f"replayed {loop} loop, stacked bidirectional, call {call}", baselines)


def _replay_names(fn) -> set[str]:
    return {n for n in kernel_names(fn) if "replay" in n}


def test_replayed_fused_loop_keys_follow_tf32(monkeypatch):
    """float32 with and without TF32 on one shape, alternately: the fused loop keeps separate
    chunks for the two (TF32 and three-MMA products, packed W of different layouts), and every
    call matches the float64 reference at its precision's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fused")
    for call, precision_name in enumerate(["tf32", "float32", "tf32", "float32"]):
        with _Precision(precision_name):
            compare_layer([4] * REPLAY_T, 5, 96, reverse=False, bias=True, precision=precision_name,
                          seed=40 + call, what=f"replayed fused loop, {precision_name}, call {call}")


def test_replayed_cublas_loop_is_taken(monkeypatch):
    """T >= 16 replays: equal batch sizes, with a projection too (its own step kernels:
    test_projected_steps_are_replayed), and a ragged PackedSequence without one (unless
    SEQKERNELS_LSTM_REPLAY_RAGGED=0); T < 16 runs the plain loop."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    names = _replay_names(_train_call(torch.float32, 4, 32, T=20))
    assert any("lstm_forward_replay_step_kernel" in n for n in names), names
    assert any("lstm_backward_replay_step_kernel" in n for n in names), names
    assert not _replay_names(_train_call(torch.float32, 4, 32, T=15))
    names = _replay_names(_train_call(torch.float32, 4, 32, T=20, proj_size=16))
    assert any("lstm_forward_replay_projected_step_kernel" in n for n in names), names
    assert any("lstm_backward_replay_projected_step_kernel" in n for n in names), names
    torch.manual_seed(0)
    model = seqkernels.LSTM(8, 16).cuda()
    x = torch.randn(20, 3, 8, device="cuda", requires_grad=True)

    def ragged_call():
        y, _ = model(pack_padded_sequence(x, torch.tensor([20, 20, 19]), enforce_sorted=True))
        y.data.sum().backward()

    names = _replay_names(ragged_call)
    assert any("lstm_forward_replay_step_kernel" in n for n in names), names
    assert any("lstm_backward_replay_step_kernel" in n for n in names), names
    monkeypatch.setenv("SEQKERNELS_LSTM_REPLAY_RAGGED", "0")
    assert not _replay_names(ragged_call)


def test_replayed_fused_loop_is_taken(monkeypatch):
    """Equal batch sizes and T >= 16 replay the fused loop's steps; a ragged PackedSequence and
    T < 16 run its plain loop (the same loop, launched step by step)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "fused")
    plain = ("lstm_fused_forward_step_kernel", "lstm_fused_backward_step_kernel")
    replayed = ("lstm_fused_forward_replay_step_kernel", "lstm_fused_backward_replay_step_kernel")

    def ran(names, kernels):
        return [k for k in kernels if any(k in n for n in names)]

    with _Precision("bfloat16"):
        names = kernel_names(_train_call(torch.bfloat16, 4, 32, T=20))
        assert ran(names, replayed) == list(replayed) and not ran(names, plain), names
        names = kernel_names(_train_call(torch.bfloat16, 4, 32, T=15))
        assert ran(names, plain) == list(plain) and not ran(names, replayed), names
        torch.manual_seed(0)
        model = seqkernels.LSTM(8, 16).to(device="cuda", dtype=torch.bfloat16)
        x = torch.randn(20, 3, 8, device="cuda", dtype=torch.bfloat16)
        packed = pack_padded_sequence(x, torch.tensor([20, 20, 19]), enforce_sorted=True)
        with torch.no_grad():
            names = kernel_names(lambda: model(packed))
        assert ran(names, plain) == [plain[0]] and not ran(names, replayed), names


@pytest.mark.parametrize("loop,precision_name", [("cublas", "float64"), ("fused", "tf32")])
def test_replayed_loop_across_calls_and_streams(monkeypatch, loop, precision_name):
    """Kept chunks must see each call's own input, state and weights: weights changed in place
    (load_state_dict: the same addresses; the cuBLAS loop's kept graph reads the new values, the
    fused loop packs them into its kept buffer at every call), other models of the same sizes
    (cuBLAS: other W_hh addresses, other keys; fused: the same key), a side stream, more keys
    than are kept (16 per thread: the least recently used dropped and captured again; other
    batch sizes are other keys for both loops), and seqkernels.release_step_graphs(). Every call
    trains (forward + backward) against nn.LSTM on the CPU in float64 with the same weights."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
    dtype, tol = DTYPE[precision_name], TOL[precision_name]
    side = torch.cuda.Stream()
    T, I, H = 21, 6, 32
    models = {}

    def call(key, seed, stream=None, new_values=False):
        B = 3 if key < 2 else key  # keys >= 2: a batch size of their own
        torch.manual_seed(seed)
        if key not in models or new_values:
            values = nn.LSTM(I, H).double().state_dict()
            models.setdefault(key, seqkernels.LSTM(I, H).to(device="cuda", dtype=dtype)).load_state_dict(values)
        model = models[key]
        ref = nn.LSTM(I, H).double()
        ref.load_state_dict({k: v.cpu().double() for k, v in model.state_dict().items()})
        inputs = [torch.randn(T, B, I, dtype=torch.float64), torch.randn(1, B, H, dtype=torch.float64),
                  torch.randn(1, B, H, dtype=torch.float64)]
        upstream = [torch.randn(T, B, H, dtype=torch.float64), torch.randn(1, B, H, dtype=torch.float64),
                    torch.randn(1, B, H, dtype=torch.float64)]

        def run(m, device, dt):
            x, h0, c0 = (t.to(device, dt).requires_grad_(True) for t in inputs)
            y, (h, c) = m(x, (h0, c0))
            loss = sum((o * u.to(device, dt)).sum() for o, u in zip((y, h, c), upstream))
            grads = torch.autograd.grad(loss, [x, h0, c0] + list(m.parameters()))
            return [o.detach().cpu().double() for o in (y, h, c)] + [g.cpu().double() for g in grads]

        expected = run(ref, "cpu", torch.float64)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            got = run(model, "cuda", dtype)
        torch.cuda.synchronize()
        for i, (g, e) in enumerate(zip(got, expected)):
            err = max_abs(g - e)
            assert err <= tol * max(1.0, max_abs(e)), f"call {seed} (model {key}) result {i}: error {err:.3g}"

    with _Precision(precision_name):
        call(0, 1)
        call(0, 2)
        call(0, 3, new_values=True)
        call(0, 4, stream=side)
        call(1, 5)
        call(0, 6)
        for k in range(2, 20):  # past the 16 kept keys
            call(k, 10 + k)
        call(0, 40)
        seqkernels.release_step_graphs()
        call(0, 41)
        call(1, 42, stream=side)


@pytest.mark.parametrize("loop", ["cublas", "fused"])
def test_release_step_graphs_frees_the_replayed_loops_buffers(monkeypatch, loop):
    """What a replayed forward and backward keep (the backward on autograd's device thread) goes
    back to PyTorch's allocator: the cuBLAS loop's state buffers (float32 here: forward h, c,
    rec; backward dh, dc, dG), the fused loop's W_hh packed for each pass (bf16 here: at least
    G·H values each)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop)
    seqkernels.release_step_graphs()
    B, H = 8, 128
    dtype = torch.float32 if loop == "cublas" else torch.bfloat16
    run = _train_call(dtype, B, H, T=32)
    for _ in range(2):
        run()
    freed = bytes_freed_by_release()
    size = torch.empty((), dtype=dtype).element_size()
    kept = (B * H * 2 + B * 4 * H) * size * 2 if loop == "cublas" else 2 * 4 * H * H * size
    assert freed >= kept, f"freed {freed} bytes, want >= {kept}"


def test_release_step_graphs_frees_the_x3_steps_buffers(monkeypatch):
    """The replayed cuBLAS loop with x3 steps and x3 dh keeps W_hh's parts ([4H, 2H] float32, and
    transposed [H, 8H]), h's ([2B, 2H]) and dG's ([2B, 8H]) besides its state buffers;
    release_step_graphs frees them."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_STEPS", "1")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_DH", "1")
    seqkernels.release_step_graphs()
    B, H = 8, 128
    with _Precision("float32"):
        run = _train_call(torch.float32, B, H, T=32)
        for _ in range(2):
            run()
    freed = bytes_freed_by_release()
    wx = 4 * H * 2 * H
    forward = B * H * 2 + 2 * B * 4 * H + 2 * B * 2 * H  # h, c, rec (two halves), h's parts
    backward = B * H * 3 + 2 * B * 8 * H + H * 8 * H  # dh (two halves), dc, dG's parts, W_hh's transposed
    kept = (wx + forward + backward) * 4
    assert freed >= kept, f"freed {freed} bytes, want >= {kept}"


# float32 with TF32: the replayed cuBLAS loop's forward multiplies rec = h_{t-1}·W_hhᵀ on fp16
# operands (lstm.cu, HalfRecStep): W_hh's rows and h0's scaled by powers of two, h_t in [-1, 1]
# unscaled; H % (8 · K parts) == 0.
def _half_rec_taken(fn) -> bool:
    pattern = re.compile(r"lstm_forward_replay_step_kernel<float, float, \d, (true|false), true>")
    return any(pattern.search(n) for n in kernel_names(fn))


@pytest.mark.parametrize("B,H,reverse", [(1, 64, False), (3, 40, True), (8, 512, True), (16, 1024, False)])
def test_replayed_forward_half_rec_matches_reference(monkeypatch, B, H, reverse):
    """The forward's fp16 product (2 K parts at B = 8, H = 512; 37 steps: two replayed chunks and
    5 eager steps), `infer` and `train`, against the float64 reference within TF32's bound; the
    diagnostic switch SEQKERNELS_LSTM_STEP_HALF=0 keeps TF32 operands."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    with _Precision("tf32"):
        assert _half_rec_taken(_train_call(torch.float32, B, H, T=20))
        compare_layer([B] * REPLAY_T, 9, H, reverse=reverse, bias=True, precision="tf32", seed=7 * B + H,
                      what="replayed forward, fp16 rec")
        t, _ = layer_case([B] * REPLAY_T, 9, H, True, seed=B)
        got, ref = _float32_forward_and_reference(t, [B] * REPLAY_T, "tf32")  # inference: no saved gates
        for name, g, r in zip(("y", "h_n", "c_n"), got, ref):
            assert max_abs(g.double().cpu() - r) <= TOL["tf32"] * max(1.0, max_abs(r)), name
        monkeypatch.setenv("SEQKERNELS_LSTM_STEP_HALF", "0")
        assert not _half_rec_taken(_train_call(torch.float32, B, H, T=20))


@pytest.mark.parametrize("B", [8, 64])
def test_replayed_half_steps_scale_h0_and_w_hh(monkeypatch, B):
    """The cuBLAS loop's fp16 products (forward and backward) with an h0 row beyond fp16's range
    (~1e5, row 0) and one far below it (~1e-5, row 1), and W_hh at 1e-5 of nn.LSTM's range (an fp16
    subnormal unscaled), so that row 0's h0·W_hh stays O(1): the outputs and every gradient against
    the float64 reference within TF32's bound."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    _check_scaled_h0_and_w_hh([B] * REPLAY_T, 9, 512, 84, _half_rec_taken, f"cuBLAS loop, fp16 products, B={B}")


def test_replayed_forward_half_rec_keeps_inf(monkeypatch):
    """An inf in h0 (which sets no scale) reaches the first step's pre-activations as in a TF32
    GEMM: the row's gates saturate, the outputs stay finite and match the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    _check_inf_in_h0_as_float32([8] * REPLAY_T, 512, "tf32")


# float32 with TF32: the replayed cuBLAS loop's backward multiplies dh = dG·W_hh on fp16 operands
# scaled by powers of two (lstm.cu, HalfDhStep): dG by (row, K part), W_hh by (K part, column), a
# part's U = H / parts units in one block (4 parts from B = 8, else 1; U % 32 == 0, 64 <= U <= 256).
def _half_dh_taken(fn) -> bool:
    return any("scale_w_hh_parts_kernel" in n for n in kernel_names(fn))


@pytest.mark.parametrize("B,H,reverse", [(4, 64, False), (8, 512, False), (16, 512, True), (64, 1024, False)])
def test_replayed_backward_half_dh_matches_reference(monkeypatch, B, H, reverse):
    """The scaled fp16 dh GEMM (1 part at B = 4, 4 parts from B = 8; 37 steps: two replayed chunks
    and 5 eager steps) against the float64 reference within TF32's bound; the diagnostic switch
    SEQKERNELS_LSTM_STEP_HALF=0 keeps TF32 operands, and so do 32-unit parts (H = 128 in 4)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    with _Precision("tf32"):
        assert _half_dh_taken(_train_call(torch.float32, B, H, T=20))
        compare_layer([B] * REPLAY_T, 9, H, reverse=reverse, bias=True, precision="tf32", seed=B + H,
                      what="replayed backward, fp16 dh")
        assert not _half_dh_taken(_train_call(torch.float32, 8, 128, T=20))
        monkeypatch.setenv("SEQKERNELS_LSTM_STEP_HALF", "0")
        assert not _half_dh_taken(_train_call(torch.float32, B, H, T=20))


@pytest.mark.parametrize("precision_name", ["tf32", "float32"])
def test_replayed_backward_half_dh_scales_rows_and_columns(monkeypatch, precision_name):
    """Batch rows of the upstream gradients at 1e5 and 1e-5 (2^33 apart: one scale for all rows
    would leave the small row's dG subnormal in fp16) and W_hh's columns 0-7 at 1e-9 of the rest
    (likewise for one scale per part): those rows' grad_h0, grad_c0 and grad_x and those columns'
    grad_h0 within the bound of the float64 reference, relative to their own size. TF32: the
    scaled fp16 product; float32 without TF32: x3 dh on fp16 parts (forced)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_DH", "1")
    B, H, T = 8, 512, REPLAY_T
    t, up = layer_case([B] * T, 9, H, True, seed=71)
    rows = torch.arange(T * B) % B  # the packed rows' batch rows
    for b, f in ((0, 1e5), (1, 1e-5)):
        up["y"][rows == b] *= f
        up["h_n"][b] *= f
        up["c_n"][b] *= f
    t["w_hh"][:, :8] *= 1e-9
    with _Precision(precision_name):
        got = run_layer(lstm_layer, t, up, [B] * T, False, torch.float32, "cuda")
    ref = run_layer(_reference, t, up, [B] * T, False, torch.float64, "cpu")

    def close(g, r, what):
        err, size = max_abs(g.double().cpu() - r), max_abs(r)
        assert size > 0 and err <= TOL[precision_name] * size, f"{what}: error {err:.3g} against values of {size:.3g}"

    for b in (0, 1):
        close(got["grad_h0"][b], ref["grad_h0"][b], f"grad_h0, row {b}")
        close(got["grad_c0"][b], ref["grad_c0"][b], f"grad_c0, row {b}")
        close(got["grad_x"][rows == b], ref["grad_x"][rows == b], f"grad_x, row {b}")
    close(got["grad_h0"][2:, :8], ref["grad_h0"][2:, :8], "grad_h0, columns 0-7")


@pytest.mark.parametrize("precision_name", ["tf32", "float32"])
def test_replayed_backward_half_dh_keeps_inf(monkeypatch, precision_name):
    """An inf in grad_y (batch row 2, step 30) reaches dh as in a TF32 (or float32) GEMM: the
    gradients it reaches turn non-finite where the float64 reference's do, and the other rows keep
    the reference's values within the bound. float32 without TF32: x3 dh on fp16 parts (forced)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", "cublas")
    monkeypatch.setenv("SEQKERNELS_LSTM_X3_DH", "1")
    B, H, T = 8, 512, REPLAY_T
    t, up = layer_case([B] * T, 9, H, True, seed=72)
    up["y"][30 * B + 2, 17] = float("inf")
    with _Precision(precision_name):
        got = run_layer(lstm_layer, t, up, [B] * T, False, torch.float32, "cuda")
    ref = run_layer(_reference, t, up, [B] * T, False, torch.float64, "cpu")
    assert not torch.isfinite(ref["grad_h0"][2]).any()
    for key in ("grad_x", "grad_h0", "grad_c0"):
        g, r = got[key].double().cpu(), ref[key]
        ok = torch.isfinite(r)
        assert torch.equal(torch.isfinite(g), ok), f"{key}: non-finite elsewhere than the reference's"
        assert max_abs(g[ok] - r[ok]) <= TOL[precision_name] * max(1.0, max_abs(r[ok])), key


def _force_replayed_loop(monkeypatch, loop):
    """SEQKERNELS_LSTM_BACKEND for `loop`: cublas, fused, or cublas-x3 (the cuBLAS loop with its x3
    steps at any batch size)."""
    monkeypatch.setenv("SEQKERNELS_LSTM_BACKEND", loop.split("-")[0])
    if loop == "cublas-x3":
        monkeypatch.setenv("SEQKERNELS_LSTM_X3_STEPS", "1")


@pytest.mark.parametrize("loop", ["cublas", "fused", "cublas-x3"])
@pytest.mark.parametrize("precision_name", ["tf32", "bfloat16", "float32"])
def test_replayed_loop_inside_a_users_cuda_graph(monkeypatch, loop, precision_name):
    """A caller's own CUDA graph holds the plain loop (the replayed one is skipped while the
    stream captures); its replays agree with eager calls, which replay kept chunks. cublas-x3:
    the cuBLAS loop with x3 steps (float32 only)."""
    if (loop == "cublas-x3") != (precision_name == "float32"):
        pytest.skip("x3 steps are float32 without TF32; float32 runs them only")
    _force_replayed_loop(monkeypatch, loop)
    with _Precision(precision_name):
        dtype = DTYPE[precision_name]
        torch.manual_seed(13)
        model = seqkernels.LSTM(48, 48, bidirectional=True).to(device="cuda", dtype=dtype)
        check_cuda_graph_replays(model, torch.randn(REPLAY_T, 4, 48, device="cuda", dtype=dtype))


@pytest.mark.parametrize("loop,precision_name", [("cublas", "tf32"), ("cublas", "bfloat16"), ("cublas", "float64"),
                                                ("fused", "tf32"), ("fused", "bfloat16"), ("cublas-x3", "float32")])
def test_replayed_loop_bitwise_deterministic(monkeypatch, loop, precision_name):
    _force_replayed_loop(monkeypatch, loop)
    with _Precision(precision_name):
        dtype = DTYPE[precision_name]
        torch.manual_seed(17)
        model = seqkernels.LSTM(40, 40, bidirectional=True).to(device="cuda", dtype=dtype)
        x = torch.randn(REPLAY_T, 5, 40, device="cuda", dtype=dtype)
        first, second, third = (lstm_training_results(model, x) for _ in range(3))
        for a, b, c in zip(first, second, third):
            assert torch.equal(a, b) and torch.equal(b, c)
