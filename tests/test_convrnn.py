"""Tests of the circulant ("wave") ConvRNN: the op (torch.ops.seqkernels.convrnn_forward /
convrnn_backward through seqkernels.convrnn), the template API seqkernels.convrnn_forward
and the module seqkernels.ConvRNN.

The reference is the pure-PyTorch loop of seqkernels.reference.convrnn (F.pad + F.conv1d
+ act), run in float64 as ground truth and in bfloat16/float16 to measure plain
low-precision error. Tolerances per dtype (design.md, "Tests"):
  float64   1e-10, relative to the largest magnitude of the expected tensor
  float32   2e-5, likewise
  bf16/fp16 err(kernel vs float64 reference) <= 2 * err(low-precision reference vs the
            float64 reference) + two units in the last place at the tensor's magnitude
            (flash-attention's rule; errors are max-abs over the tensor)

Shape legend: B batch, T steps, C channels, N ring size, K kernel width.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st
from torch import Tensor, nn

from _helpers import (
    assert_low_precision_close, assert_orders_close, check_cuda_graph_replays, gradients_of_gradients, max_abs,
)

import seqkernels
from seqkernels import ConvRNN, convrnn, convrnn_forward
from seqkernels.reference import convrnn_reference, convrnn_template_reference

LOW_PRECISION = (torch.bfloat16, torch.float16)
ALL_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5}
SMALL_TENSOR = 32

_forward_op = torch.ops.seqkernels.convrnn_forward
_backward_op = torch.ops.seqkernels.convrnn_backward
PAD = {"circular": 0, "zeros": 1}
ACT = {"tanh": 0, "relu": 1}


# --------------------------------------------------------------------------------------
# Comparison helpers
# --------------------------------------------------------------------------------------
def assert_close(actual: Tensor, expected: Tensor, dtype: torch.dtype, name: str) -> None:
    """|actual - expected| <= tol * (|expected| + max(1, max|expected|)), tol per dtype."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(
        actual.detach().double(),
        expected.detach().double(),
        rtol=tol,
        atol=tol * max(1.0, max_abs(expected)),
        msg=lambda m: f"{name} ({dtype}): {m}",
    )


def reduction_scales(ref64: dict, h0: Tensor | None) -> dict[str, float]:
    """grad_bias and grad_weight are sums over (b, t, n) of terms g * 1 and g * h: their
    rounding error scales with sum |terms|, not with the (possibly cancelling) result. The
    largest per-channel sum of |g| (g = grad_x), times max |h| for the weight."""
    g_sum = ref64["grad_x"].abs().sum(dim=(0, 1, 3)).max().item()
    h_max = max(max_abs(ref64["y"]), 0.0 if h0 is None else max_abs(h0))
    return {"grad_bias": g_sum, "grad_weight": g_sum * max(h_max, 1.0)}


def compare(
    actual: dict, ref64: dict, dtype: torch.dtype, what: str, baseline: dict | None = None, h0: Tensor | None = None
) -> None:
    """Every entry of actual against the float64 reference: tolerance for float32/float64,
    the low-precision rule (baseline = the reference run in dtype) for bf16/fp16. For
    tensors under SMALL_TENSOR elements the baseline error is at least the baseline's
    largest error over all entries (a handful of elements is a small sample of the error);
    for the reduced gradients (bias, weight) eps is one unit in the last place of the sum
    of their terms' magnitudes (reduction_scales)."""
    assert actual.keys() == ref64.keys(), f"{what}: {sorted(actual)} != {sorted(ref64)}"
    if dtype not in LOW_PRECISION:
        for key in ref64:
            assert_close(actual[key], ref64[key], dtype, f"{what}: {key}")
        return
    assert_low_precision_close(actual, ref64, baseline, dtype, what, sums=reduction_scales(ref64, h0),
                               small_tensor=SMALL_TENSOR, ulps=2, sum_ulps=1)


def make_tensors(B, T, C, N, K, bias, with_h0, device, dtype=torch.float64, w_scale=1.0) -> dict:
    """Fresh random inputs in float64 (cast later): x, h0 ~ N(0, 1), weight and bias
    ~ U(-w_scale/sqrt(C*K), w_scale/sqrt(C*K)) (conv1d's default init scale)."""
    bound = w_scale / math.sqrt(C * K)
    t = {
        "x": torch.randn(B, T, C, N, dtype=torch.float64),
        "weight": (torch.rand(C, C, K, dtype=torch.float64) * 2 - 1) * bound,
    }
    if bias:
        t["bias"] = (torch.rand(C, dtype=torch.float64) * 2 - 1) * bound
    if with_h0:
        t["h0"] = torch.randn(B, C, N, dtype=torch.float64)
    return {k: v.to(device=device, dtype=dtype) for k, v in t.items()}


def run(fn, tensors: dict, dtype: torch.dtype, padding_mode: str, nonlinearity: str, upstream: dict) -> dict:
    """fn(x, weight, h0, bias, padding_mode, nonlinearity) -> (y, h_T) on leaves cast to
    dtype; backpropagates sum(y * g_y) + sum(h_T * g_h) and returns outputs and gradients."""
    leaves = {k: v.detach().to(dtype).requires_grad_(True) for k, v in tensors.items()}
    y, h_T = fn(leaves["x"], leaves["weight"], leaves.get("h0"), leaves.get("bias"), padding_mode, nonlinearity)
    loss = (y * upstream["y"].to(dtype)).sum() + (h_T * upstream["h_T"].to(dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    result = {"y": y.detach(), "h_T": h_T.detach()}
    result.update({f"grad_{k}": g for k, g in zip(leaves, grads)})
    return result


def masked_relu_reference(mask: Tensor):
    """The reference loop with relu replaced by a fixed branch choice: h_t = pre_t * mask_t
    (mask [B, T, C, N] of 0/1). Equal to relu wherever mask == (pre > 0); its gradient
    takes the branches given by mask."""

    def fn(x, weight, h0, bias, padding_mode, nonlinearity):
        B, T, C, N = x.shape
        K = weight.shape[-1]
        h = x.new_zeros(B, C, N) if h0 is None else h0
        m = mask.to(x.dtype)
        mode = "circular" if padding_mode == "circular" else "constant"
        ys = []
        for t in range(T):
            hp = torch.nn.functional.pad(h, (K // 2, K - 1 - K // 2), mode=mode)
            h = (x[:, t] + torch.nn.functional.conv1d(hp, weight, bias)) * m[:, t]
            ys.append(h)
        return torch.stack(ys, dim=1), h

    return fn


# --------------------------------------------------------------------------------------
# Property tests against the reference
# --------------------------------------------------------------------------------------
@st.composite
def configs(draw):
    padding_mode = draw(st.sampled_from(["circular", "zeros"]))
    N = draw(st.one_of(st.sampled_from([1, 2]), st.integers(3, 9), st.sampled_from([16, 33])))
    max_k = N if padding_mode == "circular" else N + 3  # zero padding may be wider than the ring
    return dict(
        B=draw(st.integers(1, 3)),
        T=draw(st.one_of(st.just(1), st.integers(2, 7))),
        C=draw(st.integers(1, 3)),
        N=N,
        K=draw(st.integers(1, min(max_k, 6))),
        padding_mode=padding_mode,
        nonlinearity=draw(st.sampled_from(["tanh", "relu"])),
        bias=draw(st.booleans()),
        with_h0=draw(st.booleans()),
    )


@given(config=configs(), dtype=st.sampled_from(ALL_DTYPES), seed=st.integers(0, 2**31 - 1))
def test_convrnn_matches_reference(device, config, dtype, seed):
    """Values (y, h_T) and every gradient (x, weight, bias, h0) against the loop reference,
    with and without autograd recording."""
    torch.manual_seed(seed)
    c = config
    note(f"{c} {dtype}")
    tensors = make_tensors(c["B"], c["T"], c["C"], c["N"], c["K"], c["bias"], c["with_h0"], device)
    pad, act = c["padding_mode"], c["nonlinearity"]
    upstream = {
        "y": torch.randn(c["B"], c["T"], c["C"], c["N"], dtype=torch.float64, device=device),
        "h_T": torch.randn(c["B"], c["C"], c["N"], dtype=torch.float64, device=device),
    }
    got = run(convrnn, tensors, dtype, pad, act, upstream)
    if act == "relu" and dtype in LOW_PRECISION:
        # relu' jumps at 0: where a pre-activation is within rounding of 0, float64 and the
        # kernel may take different branches and a whole gradient entry differs. Hold the
        # float64 reference to the kernel's branches (its y > 0) to compare the arithmetic.
        ref64 = run(masked_relu_reference(got["y"] > 0), tensors, torch.float64, pad, act, upstream)
    else:
        ref64 = run(convrnn_reference, tensors, torch.float64, pad, act, upstream)
    baseline = run(convrnn_reference, tensors, dtype, pad, act, upstream) if dtype in LOW_PRECISION else None
    compare(got, ref64, dtype, "convrnn vs reference", baseline, tensors.get("h0"))
    with torch.no_grad():
        cast = {k: v.to(dtype) for k, v in tensors.items()}
        y, h_T = convrnn(cast["x"], cast["weight"], cast.get("h0"), cast.get("bias"), pad, act)
    assert torch.equal(y, got["y"]) and torch.equal(h_T, got["h_T"]), "no-grad forward differs from the grad one"
    assert torch.equal(h_T, y[:, -1]), "h_T is not the last step of y"


GRADCHECK_CASES = [
    # (B, T, C, N, K, padding_mode, nonlinearity, bias)
    (2, 4, 2, 5, 3, "circular", "tanh", True),
    (1, 3, 3, 4, 4, "circular", "relu", False),
    (2, 1, 1, 1, 1, "circular", "tanh", True),
    (3, 3, 2, 2, 2, "circular", "tanh", False),
    (2, 3, 2, 3, 5, "zeros", "tanh", True),
    (1, 5, 2, 6, 2, "zeros", "relu", True),
]


@pytest.mark.parametrize("B, T, C, N, K, padding_mode, nonlinearity, bias", GRADCHECK_CASES)
def test_gradcheck_convrnn(device, B, T, C, N, K, padding_mode, nonlinearity, bias):
    torch.manual_seed(1)
    tensors = make_tensors(B, T, C, N, K, bias, True, device)
    names = list(tensors)
    leaves = tuple(t.requires_grad_(True) for t in tensors.values())

    def fn(*ts):
        kw = dict(zip(names, ts))
        return convrnn(kw["x"], kw["weight"], kw["h0"], kw.get("bias"), padding_mode, nonlinearity)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_long_sequence_5000_steps(device):
    """5000 steps in one call, float32 against the float64 reference, values and gradients
    (a contracting recurrence, so that float32 rounding does not grow with T)."""
    torch.manual_seed(5)
    B, T, C, N, K = 2, 5000, 2, 8, 3
    tensors = make_tensors(B, T, C, N, K, True, True, device, w_scale=0.5)
    upstream = {
        "y": torch.randn(B, T, C, N, dtype=torch.float64, device=device),
        "h_T": torch.randn(B, C, N, dtype=torch.float64, device=device),
    }
    got = run(convrnn, tensors, torch.float32, "circular", "tanh", upstream)
    ref64 = run(convrnn_reference, tensors, torch.float64, "circular", "tanh", upstream)
    compare(got, ref64, torch.float32, "5000 steps")


LARGE_STATE_CASES = [
    # (B, T, C, N, K, padding_mode, nonlinearity): C·N >= 1024, where the CUDA forward splits a
    # sequence over a thread-block cluster (G = N's largest divisor in {8, 4} leaving segments of
    # >= K units, C·N / G <= 512; halos traded every H <= 4 steps, H = 1 where the block has no
    # threads for wider halos), else one block runs (tiled for K = 3).
    pytest.param(2, 9, 6, 256, 3, "circular", "tanh", id="G8-k3"),
    pytest.param(2, 7, 4, 256, 4, "circular", "relu", id="G8-even-k"),
    pytest.param(1, 6, 2, 512, 5, "zeros", "tanh", id="G8-zeros-k5"),
    pytest.param(1, 5, 26, 40, 5, "circular", "tanh", id="G8-segments-of-k"),
    pytest.param(1, 5, 16, 64, 3, "circular", "tanh", id="G8-k3-16-channels"),
    pytest.param(1, 6, 4, 1024, 3, "zeros", "tanh", id="G8-halo-every-step"),
    pytest.param(2, 5, 2, 516, 7, "circular", "tanh", id="G4"),
    pytest.param(1, 6, 2, 516, 4, "zeros", "relu", id="G4-zeros-even-k"),
    pytest.param(1, 6, 8, 130, 3, "zeros", "relu", id="N-not-split-one-block"),
    pytest.param(1, 4, 4, 257, 3, "circular", "tanh", id="odd-N-one-block"),
]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cluster", ["1", "0"], ids=["cluster", "one-block"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B, T, C, N, K, padding_mode, nonlinearity", LARGE_STATE_CASES)
def test_cuda_large_states_match_reference(monkeypatch, cluster, dtype, B, T, C, N, K, padding_mode, nonlinearity):
    """Large rings on CUDA, with the cluster forward allowed and turned off
    (SEQKERNELS_CONVRNN_CLUSTER=0): values and every gradient against the float64 reference."""
    monkeypatch.setenv("SEQKERNELS_CONVRNN_CLUSTER", cluster)  # read by the op at every call
    torch.manual_seed(B * 1000 + N + K)
    tensors = make_tensors(B, T, C, N, K, True, True, "cuda")
    upstream = {
        "y": torch.randn(B, T, C, N, dtype=torch.float64, device="cuda"),
        "h_T": torch.randn(B, C, N, dtype=torch.float64, device="cuda"),
    }
    got = run(convrnn, tensors, dtype, padding_mode, nonlinearity, upstream)
    ref64 = run(convrnn_reference, tensors, torch.float64, padding_mode, nonlinearity, upstream)
    compare(got, ref64, dtype, f"C={C} N={N} K={K} cluster={cluster}")


# --------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------
OPCHECK_CASES = [
    pytest.param(2, 3, 2, 5, 3, 0, 0, True, id="circular-tanh-bias"),
    pytest.param(1, 4, 3, 4, 2, 0, 1, False, id="circular-relu-even-k"),
    pytest.param(3, 2, 1, 2, 4, 1, 0, True, id="zeros-wide-kernel"),
    pytest.param(2, 1, 2, 1, 1, 1, 1, False, id="t1-n1"),
]


def _op_args(B, T, C, N, K, pad, act, bias, device, requires_grad):
    t = make_tensors(B, T, C, N, K, bias, True, device, dtype=torch.float32)
    t = {k: v.requires_grad_(requires_grad) for k, v in t.items()}
    return (t["x"], t["weight"], t.get("bias"), t["h0"], pad, act)


@pytest.mark.parametrize("B, T, C, N, K, pad, act, bias", OPCHECK_CASES)
def test_opcheck_convrnn_forward(device, B, T, C, N, K, pad, act, bias):
    torch.manual_seed(2)
    torch.library.opcheck(_forward_op.default, _op_args(B, T, C, N, K, pad, act, bias, device, True))


@pytest.mark.parametrize("B, T, C, N, K, pad, act, bias", OPCHECK_CASES)
def test_opcheck_convrnn_backward(device, B, T, C, N, K, pad, act, bias):
    torch.manual_seed(3)
    x, weight, b, h0, pad, act = _op_args(B, T, C, N, K, pad, act, bias, device, False)
    y, h_T = _forward_op(x, weight, b, h0, pad, act)
    args = (torch.randn_like(y), torch.randn_like(h_T), weight, h0, y, pad, act, bias)
    torch.library.opcheck(_backward_op.default, args)


def test_forward_op_outputs(device):
    """Shapes and dtypes of the raw ops' outputs; grad_bias is empty without a bias."""
    torch.manual_seed(4)
    x, weight, b, h0, pad, act = _op_args(2, 3, 2, 5, 3, 0, 0, True, device, False)
    y, h_T = _forward_op(x, weight, b, h0, pad, act)
    assert y.shape == (2, 3, 2, 5) and h_T.shape == (2, 2, 5) and y.dtype == x.dtype
    for has_bias in (True, False):
        gx, gw, gb, gh0 = _backward_op(torch.randn_like(y), torch.randn_like(h_T), weight, h0, y, pad, act, has_bias)
        assert gx.shape == x.shape and gw.shape == weight.shape and gh0.shape == h0.shape
        assert gb.shape == ((2,) if has_bias else (0,))


# (B, T, C, N, K, padding_mode): each CUDA backward path — the warp kernel with the weight
# gradient fused (C·K <= 4), the warp kernel with the separate reduction, the per-unit block
# kernel, the tiled block kernel (K = 3, C·N >= 1024).
BACKWARD_PATHS = [
    (5, 21, 1, 16, 3, "circular"),
    (3, 9, 2, 8, 5, "zeros"),
    (2, 7, 3, 20, 2, "circular"),
    (2, 6, 4, 256, 3, "circular"),
]


@pytest.mark.parametrize("B, T, C, N, K, padding_mode", BACKWARD_PATHS)
@pytest.mark.parametrize("layout", ["expanded", "strided"])
def test_backward_reads_gradients_of_any_layout(device, B, T, C, N, K, padding_mode, layout):
    """Upstream gradients as autograd hands them over without a copy: expanded (stride 0,
    from y.sum()) or a permuted view; every gradient against the float64 reference."""
    torch.manual_seed(11)
    tensors = make_tensors(B, T, C, N, K, True, True, device)
    if layout == "expanded":
        upstream = {"y": torch.full((1, 1, 1, 1), 0.75, dtype=torch.float64, device=device).expand(B, T, C, N),
                    "h_T": torch.full((1, 1, 1), -1.5, dtype=torch.float64, device=device).expand(B, C, N)}
    else:
        upstream = {"y": torch.randn(N, T, B, C, dtype=torch.float64, device=device).permute(2, 1, 3, 0),
                    "h_T": torch.randn(C, N, B, dtype=torch.float64, device=device).permute(2, 0, 1)}
    ref64 = run(convrnn_reference, tensors, torch.float64, padding_mode, "tanh", upstream)

    leaves = {k: v.detach().float().requires_grad_(True) for k, v in tensors.items()}
    y, h_T = convrnn(leaves["x"], leaves["weight"], leaves["h0"], leaves["bias"], padding_mode, "tanh")
    grad_y, grad_h_T = upstream["y"].float(), upstream["h_T"].float()
    if layout == "expanded":  # keep the stride-0 layout after the cast
        grad_y = grad_y[:1, :1, :1, :1].expand(B, T, C, N)
        grad_h_T = grad_h_T[:1, :1, :1].expand(B, C, N)
    assert not grad_y.is_contiguous() and not grad_h_T.is_contiguous()
    grads = torch.autograd.grad((y, h_T), list(leaves.values()), grad_outputs=(grad_y, grad_h_T))
    got = {"y": y.detach(), "h_T": h_T.detach()}
    got.update({f"grad_{k}": g for k, g in zip(leaves, grads)})
    compare(got, ref64, torch.float32, f"convrnn backward, {layout} upstream gradients")


@pytest.mark.parametrize("B, T, C, N, K", [(8, 20, 3, 16, 3), (9, 37, 1, 16, 3)])
def test_backward_is_deterministic(device, B, T, C, N, K):
    """The weight and bias gradients are reduced in a fixed order: bitwise equal across
    runs and (on the CPU) across thread counts."""
    torch.manual_seed(6)
    tensors = make_tensors(B, T, C, N, K, True, True, device, dtype=torch.float32)
    upstream = {
        "y": torch.randn(B, T, C, N, dtype=torch.float64, device=device),
        "h_T": torch.randn(B, C, N, dtype=torch.float64, device=device),
    }
    first = run(convrnn, tensors, torch.float32, "circular", "tanh", upstream)
    threads = torch.get_num_threads()
    try:
        for n in (1, max(2, threads)):
            if device == "cpu":
                torch.set_num_threads(n)
            again = run(convrnn, tensors, torch.float32, "circular", "tanh", upstream)
            for key in first:
                assert torch.equal(first[key], again[key]), f"{key} differs between runs ({n} threads)"
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("padding_mode,nonlinearity", [("circular", "tanh"), ("zeros", "relu")])
def test_double_backward_matches_reference(device, padding_mode, nonlinearity):
    """Gradients of gradients (create_graph=True; second and third order) with respect to x,
    weight, h0 and bias, against the float64 reference; and torch.autograd.gradgradcheck."""
    tensors = make_tensors(2, 3, 2, 5, 3, True, True, device, dtype=torch.float64)
    names = ["x", "weight", "h0", "bias"]
    leaves = [tensors[k].requires_grad_(True) for k in names]

    def loss_of(fn):
        def loss(x, weight, h0, bias):
            y, h_T = fn(x, weight, h0, bias, padding_mode, nonlinearity)
            return y.sin().sum() + (h_T * h0).sum()

        return loss

    assert_orders_close(gradients_of_gradients(loss_of(convrnn), leaves, order=3),
                        gradients_of_gradients(loss_of(convrnn_reference), leaves, order=3), names, assert_close)
    assert torch.autograd.gradgradcheck(loss_of(convrnn), tuple(leaves))


# --------------------------------------------------------------------------------------
# The template API
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("hidden_rank", [2, 3])
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_template_api_matches_its_semantics(device, hidden_rank, K):
    """convrnn_forward(x [B, T, N], kernel [1, 1, K], hidden [B, 1, N] or [B, N]) ->
    y [B, T + 1, N] with y[:, 0] = h0, against a direct implementation of the template's
    semantics, values and gradients in x, kernel and hidden."""
    torch.manual_seed(7)
    B, T, N = 3, 6, 7
    x = torch.randn(B, T, N, dtype=torch.float64, device=device, requires_grad=True)
    kernel = (torch.randn(1, 1, K, dtype=torch.float64, device=device) * 0.6).requires_grad_(True)
    shape = (B, 1, N) if hidden_rank == 3 else (B, N)
    hidden = torch.randn(*shape, dtype=torch.float64, device=device, requires_grad=True)
    y = convrnn_forward(x, kernel, hidden)
    assert y.shape == (B, T + 1, N)
    assert torch.equal(y[:, 0].detach(), hidden.detach().reshape(B, N)), "y[:, 0] must be h0"
    expected = convrnn_template_reference(x, kernel, hidden)
    assert_close(y, expected, torch.float64, "template y")
    g = torch.randn_like(y)
    got = torch.autograd.grad((y * g).sum(), (x, kernel, hidden))
    exp = torch.autograd.grad((expected * g).sum(), (x, kernel, hidden))
    for name, a, e in zip(("x", "kernel", "hidden"), got, exp):
        assert_close(a, e, torch.float64, f"template grad_{name}")
    # The template's op is convrnn with C = 1, circular padding, tanh, no bias.
    y4, h_T = convrnn(x.unsqueeze(2), kernel, hidden.reshape(B, 1, N))
    assert torch.equal(y[:, 1:], y4[:, :, 0]) and torch.equal(y[:, -1], h_T[:, 0])


def test_template_api_float32_benchmark_shape(device):
    torch.manual_seed(8)
    x = torch.randn(32, 128, 16, device=device)
    kernel = torch.randn(1, 1, 3, device=device) * 0.5
    hidden = torch.randn(32, 16, device=device)
    y = convrnn_forward(x, kernel, hidden)
    assert y.shape == (32, 129, 16) and y.dtype == torch.float32
    assert_close(y, convrnn_template_reference(x.double(), kernel.double(), hidden.double()), torch.float32, "y")


# --------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------
def test_module_parameters_and_default_init():
    torch.manual_seed(9)
    m = ConvRNN(4, 5)
    assert m.weight.shape == (4, 4, 5) and m.bias.shape == (4,)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    bound = 1 / math.sqrt(4 * 5)  # conv1d's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert m.weight.abs().max() <= bound and m.bias.abs().max() <= bound
    assert m.weight.std() > bound / 4, "weights look degenerate"
    assert ConvRNN(2, 3, bias=False).bias is None
    m64 = ConvRNN(2, 3, dtype=torch.float64)
    assert m64.weight.dtype == torch.float64
    assert "kernel_size=5" in repr(m)


def test_module_matches_functional_and_reference(device):
    torch.manual_seed(10)
    m = ConvRNN(3, 3, padding_mode="zeros", nonlinearity="relu", device=device, dtype=torch.float64)
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64, device=device)
    h0 = torch.randn(2, 3, 8, dtype=torch.float64, device=device)
    y, h_T = m(x, h0)
    y_ref, h_ref = convrnn_reference(x, m.weight, h0, m.bias, "zeros", "relu")
    assert_close(y, y_ref, torch.float64, "module y")
    assert_close(h_T, h_ref, torch.float64, "module h_T")
    # h0=None means zeros.
    y0, _ = m(x)
    assert torch.equal(y0, m(x, torch.zeros_like(h0))[0])


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
def test_nan_in_the_input_is_not_swallowed(device, nonlinearity):
    """A NaN input element makes its own output NaN (relu(NaN) is NaN, as in torch.relu) and
    stays in its batch row: the other row is finite. (How far it spreads along the ring is the
    convolution's business and not asserted.)"""
    torch.manual_seed(12)
    m = ConvRNN(2, 3, padding_mode="circular", nonlinearity=nonlinearity, device=device)
    x = torch.randn(2, 5, 2, 9, device=device)  # [B, T, C, N]
    x[0, 2, 1, 4] = float("nan")
    with torch.no_grad():
        y, h_T = m(x)
    assert torch.isnan(y[0, 2, 1, 4]), "the NaN element's own output is not NaN"
    assert torch.isnan(h_T[0]).any(), "the NaN did not reach the final state of its row"
    assert torch.isfinite(y[1]).all() and torch.isfinite(h_T[1]).all(), "the NaN reached the other batch row"
    assert torch.isfinite(y[0, :2]).all(), "NaN before the step that has it"


def test_module_batch_first_false(device):
    torch.manual_seed(11)
    bf = ConvRNN(2, 3, device=device)
    tf = ConvRNN(2, 3, batch_first=False, device=device)
    tf.load_state_dict(bf.state_dict())
    x = torch.randn(4, 6, 2, 9, device=device)  # [B, T, C, N]
    h0 = torch.randn(4, 2, 9, device=device)  # [B, C, N] in both layouts
    y, h_T = bf(x, h0)
    y2, h_T2 = tf(x.transpose(0, 1), h0)
    assert y2.shape == (6, 4, 2, 9) and h_T2.shape == (4, 2, 9)
    assert torch.equal(y2.transpose(0, 1), y) and torch.equal(h_T2, h_T)


@pytest.mark.parametrize("K", [2, 3, 4, 5])
def test_shift_init_moves_activity_around_the_ring(K):
    """init="shift": each channel shifts its ring by one unit per step (the wave RNN)."""
    m = ConvRNN(2, K, nonlinearity="relu", init="shift", dtype=torch.float64)
    assert torch.count_nonzero(m.weight) == 2 and torch.count_nonzero(m.bias) == 0
    N, T = 6, 8
    h0 = torch.zeros(1, 2, N, dtype=torch.float64)
    h0[0, 0, 0] = 1.0
    h0[0, 1, 3] = 2.0
    y, _ = m(torch.zeros(1, T, 2, N, dtype=torch.float64), h0)
    for t in range(T):
        assert torch.equal(y[0, t], torch.roll(h0[0], t + 1, dims=-1)), f"step {t}"
    with pytest.raises(ValueError, match="shift"):
        ConvRNN(2, 1, init="shift")


def test_module_noncontiguous_input_and_no_grad(device):
    torch.manual_seed(12)
    m = ConvRNN(2, 3, device=device)
    x = torch.randn(5, 3, 2, 7, device=device).transpose(0, 1)  # [B, T, C, N], non-contiguous
    with torch.no_grad():
        y, _ = m(x)
    assert_close(y, convrnn_reference(x.double(), m.weight.double(), None, m.bias.double())[0], torch.float32, "y")


def test_empty_batch_and_zero_steps():
    w = torch.randn(2, 2, 3)
    y, h_T = convrnn(torch.randn(0, 4, 2, 5), w)
    assert y.shape == (0, 4, 2, 5) and h_T.shape == (0, 2, 5)
    h0 = torch.randn(3, 2, 5)
    y, h_T = convrnn(torch.randn(3, 0, 2, 5), w, h0)
    assert y.shape == (3, 0, 2, 5) and torch.equal(h_T, h0)
    assert convrnn_forward(torch.randn(3, 0, 5), torch.randn(1, 1, 3), torch.randn(3, 5)).shape == (3, 1, 5)


# --------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------
class _WaveModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 2 * 8)
        self.rnn = ConvRNN(2, 3)
        self.head = nn.Linear(2 * 8, 3)

    def forward(self, x, h0=None):
        B, T, _ = x.shape
        y, h_T = self.rnn(self.inp(x).view(B, T, 2, 8), h0)
        return self.head(y.flatten(2)), h_T


@pytest.mark.parametrize(
    "backend, with_state", [("aot_eager", False), ("aot_eager", True), ("inductor", True)]
)
def test_torch_compile_fullgraph(device, backend, with_state):
    torch.manual_seed(13)
    torch._dynamo.reset()
    model = _WaveModel().to(device)
    x = torch.randn(3, 7, 5, device=device)
    h0 = torch.randn(3, 2, 8, device=device) if with_state else None

    def run_model(fn):
        xi = x.clone().requires_grad_()
        hi = h0.clone().requires_grad_() if h0 is not None else None
        model.zero_grad()
        out, h_T = fn(xi, hi)
        (out.square().sum() + h_T.sum()).backward()
        grads = [xi.grad] + ([hi.grad] if hi is not None else []) + [p.grad.clone() for p in model.parameters()]
        return [out.detach(), h_T.detach()] + grads

    eager = run_model(model)
    compiled = run_model(torch.compile(model, backend=backend, fullgraph=True))
    for i, (a, e) in enumerate(zip(compiled, eager)):
        assert_close(a, e, torch.float32, f"compiled result {i}")


# --------------------------------------------------------------------------------------
# Bad input: a clear ValueError or RuntimeError, never a crash, never broadcasting
# --------------------------------------------------------------------------------------
def _good(dtype=torch.float32):
    return dict(
        x=torch.randn(3, 4, 2, 5, dtype=dtype),
        weight=torch.randn(2, 2, 3, dtype=dtype),
        h0=torch.randn(3, 2, 5, dtype=dtype),
        bias=torch.randn(2, dtype=dtype),
    )


def _with(**changes):
    kw = _good()
    kw.update(changes)
    return kw


FUNCTIONAL_BAD = [
    pytest.param(_with(x=torch.randn(3, 4, 5)), ValueError, "4-D", id="x-3d"),
    pytest.param(_with(weight=torch.randn(2, 3)), ValueError, "3-D", id="weight-2d"),
    pytest.param(_with(weight=torch.randn(2, 3, 3)), ValueError, "weight", id="weight-in-channels"),
    pytest.param(_with(weight=torch.randn(3, 2, 3)), ValueError, "weight", id="weight-out-channels"),
    pytest.param(_with(weight=torch.randn(2, 2, 0)), ValueError, "K", id="weight-k0"),
    pytest.param(_with(h0=torch.randn(1, 2, 5)), ValueError, "h0", id="h0-batch-1-not-broadcast"),
    pytest.param(_with(h0=torch.randn(3, 2, 4)), ValueError, "h0", id="h0-ring"),
    pytest.param(_with(h0=torch.randn(3, 5)), ValueError, "h0", id="h0-2d"),
    pytest.param(_with(bias=torch.randn(3)), ValueError, "bias", id="bias-size"),
    pytest.param(_with(bias=torch.randn(1)), ValueError, "bias", id="bias-not-broadcast"),
    pytest.param(_with(weight=torch.randn(2, 2, 6)), ValueError, "circular", id="circular-k-gt-n"),
    pytest.param(_with(padding_mode="reflect"), ValueError, "padding_mode", id="padding-mode"),
    pytest.param(_with(nonlinearity="sigmoid"), ValueError, "nonlinearity", id="nonlinearity"),
    pytest.param(_with(padding_mode=0), ValueError, "padding_mode", id="padding-mode-int"),
    pytest.param(_with(x=torch.randn(3, 4, 0, 5), weight=torch.randn(0, 0, 3), h0=None, bias=None),
                 ValueError, "C >= 1", id="no-channels"),
    pytest.param(_with(weight=torch.randn(2, 2, 3, dtype=torch.float64)), RuntimeError, "dtype", id="weight-dtype"),
    pytest.param(_with(h0=torch.randn(3, 2, 5, dtype=torch.float16)), RuntimeError, "dtype", id="h0-dtype"),
    pytest.param(_with(bias=torch.randn(2, dtype=torch.float64)), RuntimeError, "dtype", id="bias-dtype"),
    pytest.param(dict(x=torch.ones(3, 4, 2, 5, dtype=torch.int32), weight=torch.ones(2, 2, 3, dtype=torch.int32),
                      h0=None, bias=None), RuntimeError, "float", id="int-dtype"),
]


@pytest.mark.parametrize("kwargs, exc, match", FUNCTIONAL_BAD)
def test_functional_rejects_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        convrnn(**kwargs)


def test_zero_padding_may_be_wider_than_the_ring():
    kw = _with(weight=torch.randn(2, 2, 9), padding_mode="zeros")
    y, _ = convrnn(**kw)
    ref, _ = convrnn_reference(**{k: v.double() if isinstance(v, Tensor) else v for k, v in kw.items()})
    assert_close(y, ref, torch.float32, "K > N with zero padding")


def test_device_mismatch_raises(device):
    # x alone on another device than the CPU tensors: on the CPU run that is the meta device,
    # whose kernel (the op's fake function) checks devices too.
    kw = _with()
    kw["x"] = kw["x"].to("meta" if device == "cpu" else device)
    with pytest.raises(RuntimeError, match="is on"):
        convrnn(**kw)


TEMPLATE_BAD = [
    pytest.param(torch.randn(2, 3, 1, 5), torch.randn(1, 1, 3), torch.randn(2, 5), id="x-4d"),
    pytest.param(torch.randn(2, 3, 5), torch.randn(3), torch.randn(2, 5), id="kernel-1d"),
    pytest.param(torch.randn(2, 3, 5), torch.randn(2, 1, 3), torch.randn(2, 5), id="kernel-channels"),
    pytest.param(torch.randn(2, 3, 5), torch.randn(1, 1, 3), torch.randn(1, 5), id="hidden-batch-1"),
    pytest.param(torch.randn(2, 3, 5), torch.randn(1, 1, 3), torch.randn(2, 2, 5), id="hidden-channels"),
    pytest.param(torch.randn(2, 3, 5), torch.randn(1, 1, 3), torch.randn(5), id="hidden-1d"),
    pytest.param(torch.randn(2, 3, 5), torch.randn(1, 1, 6), torch.randn(2, 5), id="k-gt-n"),
]


@pytest.mark.parametrize("x, kernel, hidden", TEMPLATE_BAD)
def test_template_api_rejects_bad_input(x, kernel, hidden):
    with pytest.raises(ValueError):
        convrnn_forward(x, kernel, hidden)


MODULE_BAD = [
    pytest.param(dict(channels=0, kernel_size=3), id="channels-0"),
    pytest.param(dict(channels=2, kernel_size=0), id="kernel-0"),
    pytest.param(dict(channels=2.0, kernel_size=3), id="channels-float"),
    pytest.param(dict(channels=2, kernel_size=3, padding_mode="same"), id="padding-mode"),
    pytest.param(dict(channels=2, kernel_size=3, nonlinearity="gelu"), id="nonlinearity"),
    pytest.param(dict(channels=2, kernel_size=3, init="xavier"), id="init"),
]


@pytest.mark.parametrize("kwargs", MODULE_BAD)
def test_module_constructor_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        ConvRNN(**kwargs)


def test_module_forward_rejects_bad_input():
    m = ConvRNN(2, 3)
    with pytest.raises(ValueError, match="4-D"):
        m(torch.randn(4, 2, 5))
    with pytest.raises(ValueError, match="h0"):
        m(torch.randn(3, 4, 2, 5), torch.randn(1, 2, 5))
    with pytest.raises(ValueError, match="circular"):
        m(torch.randn(3, 4, 2, 2))
    with pytest.raises(RuntimeError, match="dtype"):
        m(torch.randn(3, 4, 2, 5, dtype=torch.float64))


def _op(**changes):
    x, w, b, h0 = (_good()[k] for k in ("x", "weight", "bias", "h0"))
    args = dict(x=x, weight=w, bias=b, h0=h0, padding_mode=0, nonlinearity=0)
    args.update(changes)
    return args


OP_BAD = [
    pytest.param(_op(x=torch.randn(3, 4, 5)), id="x-3d"),
    pytest.param(_op(x=torch.randn(3, 0, 2, 5), h0=torch.randn(3, 2, 5)), id="t-0"),
    pytest.param(_op(x=torch.randn(0, 4, 2, 5), h0=torch.randn(0, 2, 5)), id="b-0"),
    pytest.param(_op(x=torch.randn(3, 4, 2, 5).transpose(2, 3).contiguous().transpose(2, 3)), id="x-noncontiguous"),
    pytest.param(_op(weight=torch.randn(2, 3, 3)), id="weight-shape"),
    pytest.param(_op(weight=torch.randn(2, 2)), id="weight-2d"),
    pytest.param(_op(weight=torch.randn(2, 2, 0)), id="weight-k0"),
    pytest.param(_op(weight=torch.randn(2, 2, 6)), id="circular-k-gt-n"),
    pytest.param(_op(weight=torch.randn(2, 2, 3).transpose(0, 1)), id="weight-noncontiguous"),
    pytest.param(_op(bias=torch.randn(3)), id="bias-shape"),
    pytest.param(_op(bias=torch.randn(2, dtype=torch.float64)), id="bias-dtype"),
    pytest.param(_op(h0=torch.randn(1, 2, 5)), id="h0-batch-1"),
    pytest.param(_op(h0=torch.randn(3, 2, 5, dtype=torch.float64)), id="h0-dtype"),
    pytest.param(_op(weight=torch.randn(2, 2, 3, dtype=torch.bfloat16)), id="weight-dtype"),
    pytest.param(_op(padding_mode=2), id="padding-mode-2"),
    pytest.param(_op(nonlinearity=-1), id="nonlinearity--1"),
    pytest.param(_op(x=torch.ones(3, 4, 2, 5, dtype=torch.int64), weight=torch.ones(2, 2, 3, dtype=torch.int64),
                     bias=None, h0=torch.ones(3, 2, 5, dtype=torch.int64)), id="int64"),
]


@pytest.mark.parametrize("args", OP_BAD)
def test_forward_op_rejects_bad_arguments(args):
    with pytest.raises(RuntimeError, match="seqkernels.convrnn"):
        _forward_op(**args)


def _bwd(**changes):
    g = _good()
    y, h_T = _forward_op(g["x"], g["weight"], g["bias"], g["h0"], 0, 0)
    args = dict(grad_y=torch.randn_like(y), grad_h_T=torch.randn_like(h_T), weight=g["weight"], h0=g["h0"], y=y,
                padding_mode=0, nonlinearity=0, has_bias=True)
    args.update(changes)
    return args


BACKWARD_BAD = [
    pytest.param(dict(grad_y=torch.randn(3, 4, 2, 4)), id="grad-y-shape"),
    pytest.param(dict(grad_y=torch.randn(3, 4, 2, 5, dtype=torch.float64)), id="grad-y-dtype"),
    pytest.param(dict(grad_h_T=torch.randn(1, 2, 5)), id="grad-h-T-batch-1"),
    pytest.param(dict(y=torch.randn(3, 4, 10)), id="y-3d"),
    pytest.param(dict(h0=torch.randn(3, 2, 4)), id="h0-shape"),
    pytest.param(dict(weight=torch.randn(3, 3, 3)), id="weight-channels"),
    pytest.param(dict(weight=torch.randn(2, 2, 7)), id="circular-k-gt-n"),
    pytest.param(dict(padding_mode=5), id="padding-mode"),
    pytest.param(dict(nonlinearity=2), id="nonlinearity"),
]


@pytest.mark.parametrize("changes", BACKWARD_BAD)
def test_backward_op_rejects_bad_arguments(changes):
    args = _bwd(**changes)
    with pytest.raises(RuntimeError, match="seqkernels.convrnn"):
        _backward_op(**args)


def test_package_exports():
    assert seqkernels.ConvRNN is ConvRNN and seqkernels.convrnn is convrnn
    assert seqkernels.convrnn_forward is convrnn_forward
    assert {"ConvRNN", "convrnn", "convrnn_forward"} <= set(seqkernels.__all__)


def test_direct_op_call_with_bad_sizes_raises_on_every_device(device):
    """The C++ checks' messages format numbers; a mismatch must raise, never crash."""
    x, w = torch.randn(2, 3, 1, 8, device=device), torch.randn(1, 1, 3, device=device)
    with pytest.raises(RuntimeError, match=r"h0 must have shape \[2, 1, 8\], got \[1, 1, 8\]"):
        torch.ops.seqkernels.convrnn_forward(x, w, None, torch.randn(1, 1, 8, device=device), 0, 0)


class _StatesAsPair(nn.Module):
    """ConvRNN's (y, h_T) as (y, (h_T, h_T)): the (y, (h, c)) contract of the shared
    CUDA-graph check."""

    def __init__(self, rnn: ConvRNN) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        y, h = self.rnn(x)
        return y, (h, h)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("padding_mode", ["circular", "zeros"])
def test_cuda_graph_forward_and_training_step(padding_mode):
    """Inference and a training step captured in CUDA graphs; replays on fresh input agree
    with eager calls of an identical model (outputs, final state, weight and bias grads)."""
    torch.manual_seed(5)
    model = _StatesAsPair(ConvRNN(3, 3, padding_mode=padding_mode)).cuda()
    check_cuda_graph_replays(model, torch.randn(4, 12, 3, 16, device="cuda"))
