"""Tests of the convolutional LSTM: the op (torch.ops.seqkernels.convlstm_forward /
convlstm_backward through seqkernels.convlstm) and the module seqkernels.ConvLSTM.

The reference is the pure-PyTorch loop of seqkernels.reference.convlstm (one F.conv2d per
input and step), run in float64 as ground truth and in bfloat16/float16 to measure plain
low-precision error. A second, independent formulation lives here: the "popular" ConvLSTM
cell that convolves cat([x, h]) once and splits the gates i, f, o, g, which also checks
ConvLSTM.load_concat_conv_weights. Tolerances per dtype (design.md, "Tests"):
  float64   1e-10, relative to the largest magnitude of the expected tensor
  float32   rtol 1e-4, atol 1e-5 at the expected tensor's magnitude (convolutions sum
            Cin * KH * KW terms per output)
  bf16/fp16 err(kernel vs float64 reference) <= 2 * err(low-precision reference vs the
            float64 reference) + one unit in the last place at the tensor's magnitude
            (flash-attention's rule; errors are max-abs over the tensor)

Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate channels
(i, f, g, o), H, W spatial height/width, KH, KW kernel height/width (odd), L layers.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, note
from hypothesis import strategies as st
from torch import Tensor, nn

import seqkernels
from seqkernels import ConvLSTM, convlstm
from seqkernels.reference import convlstm_module_reference, convlstm_reference
from _helpers import (
    assert_low_precision_close, assert_orders_close, bytes_freed_by_release, check_cuda_graph_replays,
    gradients_of_gradients, max_abs,
)

LOW_PRECISION = (torch.bfloat16, torch.float16)
TOLERANCE = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 1e-5)}  # (rtol, atol per unit magnitude)
# Tensors below this many elements get the pooled baseline error (compare). 64: a stacked
# layer's 36-element peephole gradient (C = 4, 3 x 3 frames) measured 2.5 bf16 units off where
# the bf16 reference happened to be 0.5 off (the thorough profile, 2026-11-27; float32 5e-8).
SMALL_TENSOR = 64
PEEPHOLES = ("ci", "cf", "co")

_forward_op = torch.ops.seqkernels.convlstm_forward
_backward_op = torch.ops.seqkernels.convlstm_backward


def dtypes_on(device: str) -> list[torch.dtype]:
    """float16 only on CUDA (the CPU op is tested in float32, float64 and bfloat16)."""
    dtypes = [torch.float64, torch.float32, torch.bfloat16]
    return dtypes + [torch.float16] if device == "cuda" else dtypes


# --------------------------------------------------------------------------------------
# Comparison helpers
# --------------------------------------------------------------------------------------
def assert_close(actual: Tensor, expected: Tensor, dtype: torch.dtype, name: str) -> None:
    """|actual - expected| <= rtol * |expected| + atol * max(1, max|expected|), per dtype."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(
        actual.detach().double(),
        expected.detach().double(),
        rtol=rtol,
        atol=atol * max(1.0, max_abs(expected)),
        msg=lambda m: f"{name} ({dtype}): {m}",
    )


def compare(actual: dict, ref64: dict, dtype: torch.dtype, what: str, baseline: dict | None = None,
            sums: dict | None = None) -> None:
    """Every entry of actual against the float64 reference: tolerance for float32/float64,
    the low-precision rule (baseline = the reference run in dtype) for bf16/fp16. For
    tensors under SMALL_TENSOR elements the baseline error is at least the baseline's
    largest error over all entries (a handful of elements is a small sample of the error);
    for the reduced gradients (weights, biases, peepholes) eps is at least the unit
    roundoff times the sum of their terms' magnitudes (sums, from reduction_sums)."""
    assert actual.keys() == ref64.keys(), f"{what}: {sorted(actual)} != {sorted(ref64)}"
    if dtype not in LOW_PRECISION:
        for key in ref64:
            assert_close(actual[key], ref64[key], dtype, f"{what}: {key}")
        return
    assert_low_precision_close(actual, ref64, baseline, dtype, what, sums=sums or {}, small_tensor=SMALL_TENSOR,
                               ulps=1, sum_ulps=0.5)


def reduction_sums(layers: list[dict], x: Tensor, hx: tuple[Tensor, Tensor] | None, upstream: dict) -> dict:
    """The largest sum of |terms| of each reduced gradient, in float64: grad_bias = sum over
    (t, b, h, w) of dz, grad_weight_ih/hh = sum of dz * input (or h) patch, grad_w_c* = sum
    over (t, b) of dz * c. Their rounding error scales with these sums, not with the
    (possibly cancelling) result. dz, the gradient of the gate pre-activations, comes from
    a zero probe added to z at every step. layers[k] holds layer k's float64 weights under
    the module's names without the _l{k} suffix; x is [T, B, Ci, H, W]; keys of the result
    are "grad_<name>_l{k}"."""
    T = x.shape[0]
    probes, inputs, hs, cs = [], [], [], []  # per layer, per step
    layer_in = x
    h_list, c_list = [], []
    for k, p in enumerate(layers):
        C = p["weight_hh"].shape[1]
        KH, KW = p["weight_hh"].shape[-2:]
        pad = (KH // 2, KW // 2)
        h = layer_in.new_zeros(layer_in.shape[1], C, *layer_in.shape[3:]) if hx is None else hx[0][k]
        c = torch.zeros_like(h) if hx is None else hx[1][k]
        for per_layer in (probes, inputs, hs, cs):
            per_layer.append([])
        outs = []
        for t in range(T):
            z = F.conv2d(layer_in[t], p["weight_ih"], p.get("bias_ih"), padding=pad) + F.conv2d(
                h, p["weight_hh"], p.get("bias_hh"), padding=pad
            )
            probe = torch.zeros_like(z, requires_grad=True)
            inputs[k].append(layer_in[t])
            hs[k].append(h)
            probes[k].append(probe)
            zi, zf, zg, zo = (z + probe).chunk(4, dim=1)
            c_prev = c
            if "weight_ci" in p:
                zi, zf = zi + p["weight_ci"] * c, zf + p["weight_cf"] * c
            c = torch.sigmoid(zf) * c + torch.sigmoid(zi) * torch.tanh(zg)
            if "weight_co" in p:
                zo = zo + p["weight_co"] * c
            cs[k].append((c_prev, c))
            h = torch.sigmoid(zo) * torch.tanh(c)
            outs.append(h)
        layer_in = torch.stack(outs)
        h_list.append(h)
        c_list.append(c)
    loss = (layer_in * upstream["y"]).sum() + (torch.stack(h_list) * upstream["h_n"]).sum()
    loss = loss + (torch.stack(c_list) * upstream["c_n"]).sum()
    flat = [pr for layer in probes for pr in layer]
    dz_all = iter(torch.autograd.grad(loss, flat))
    sums = {}
    for k, p in enumerate(layers):
        KH, KW = p["weight_hh"].shape[-2:]
        pad = (KH // 2, KW // 2)
        dz = [next(dz_all).abs() for _ in range(T)]  # [B, G, H, W] each
        per_channel = sum(d.sum(dim=(0, 2, 3)) for d in dz)
        sums[f"grad_bias_ih_l{k}"] = sums[f"grad_bias_hh_l{k}"] = per_channel.max().item()
        for name, src in (("weight_ih", inputs[k]), ("weight_hh", hs[k])):
            total = sum(
                torch.nn.grad.conv2d_weight(s.detach().abs(), p[name].shape, d, padding=pad) for s, d in zip(src, dz)
            )
            sums[f"grad_{name}_l{k}"] = total.max().item()
        if "weight_ci" in p:
            for gate, gate_index in (("ci", 0), ("cf", 1), ("co", 3)):  # z chunks: i, f, g, o
                total = sum(
                    (d.chunk(4, dim=1)[gate_index] * (cc[1] if gate == "co" else cc[0]).detach().abs()).sum(0)
                    for d, cc in zip(dz, cs[k])
                )
                sums[f"grad_weight_{gate}_l{k}"] = total.max().item()
    return sums


def run_module(module: nn.Module, x: Tensor, hx: tuple[Tensor, Tensor] | None, upstream: dict, fn=None) -> dict:
    """fn(module, input, hx) (default: module(input, hx)) on fresh leaves; backpropagates
    sum(y * g_y) + sum(h_n * g_h) + sum(c_n * g_c) and returns the outputs and the
    gradients of input, h0, c0 and every parameter (named grad_<parameter name>)."""
    dtype = next(module.parameters()).dtype
    xi = x.detach().to(dtype).requires_grad_(True)
    hi = None if hx is None else tuple(s.detach().to(dtype).requires_grad_(True) for s in hx)
    y, (h_n, c_n) = (fn or (lambda m, a, b: m(a, b)))(module, xi, hi)
    loss = (y * upstream["y"].to(dtype)).sum() + (h_n * upstream["h_n"].to(dtype)).sum()
    loss = loss + (c_n * upstream["c_n"].to(dtype)).sum()
    names, params = zip(*module.named_parameters())
    leaves = [xi] + ([] if hi is None else list(hi)) + list(params)
    grads = torch.autograd.grad(loss, leaves)
    keys = ["grad_input"] + ([] if hi is None else ["grad_h0", "grad_c0"]) + [f"grad_{n}" for n in names]
    result = {"y": y.detach(), "h_n": h_n.detach(), "c_n": c_n.detach()}
    result.update(zip(keys, grads))
    return result


def layer_params(module: nn.Module) -> list[dict]:
    """Each layer's parameters under their names without the _l{k} suffix."""
    layers = [{} for _ in range(module.num_layers)]
    for name, p in module.named_parameters():
        base, k = name.rsplit("_l", 1)
        layers[int(k)][base] = p.detach()
    return layers


def randomize(module: nn.Module, scale: float = 1.0) -> nn.Module:
    """Parameters ~ U(-s, s) with the module's own init bound s times scale: the biases and
    peepholes are as large as the weights (default init), drawn afresh per example."""
    KH, KW = module.kernel_size
    bound = scale / math.sqrt(module.hidden_channels * KH * KW)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-bound, bound)
    return module


# --------------------------------------------------------------------------------------
# Property tests against the reference
# --------------------------------------------------------------------------------------
@st.composite
def configs(draw):
    return dict(
        # 8..11 steps: the backward's weight gradients run over several multi-step chunks.
        T=draw(st.one_of(st.just(1), st.integers(2, 4), st.integers(8, 11))),
        B=draw(st.one_of(st.just(1), st.integers(2, 3))),
        Ci=draw(st.integers(1, 4)),
        C=draw(st.integers(1, 4)),
        H=draw(st.sampled_from([1, 2, 3, 4, 5, 7])),
        W=draw(st.sampled_from([1, 2, 3, 4, 5, 7])),
        kernel_size=draw(st.sampled_from([1, 3, 5, (3, 5), (5, 3), (1, 3)])),
        num_layers=draw(st.integers(1, 2)),
        bias=draw(st.booleans()),
        batch_first=draw(st.booleans()),
        peephole=draw(st.booleans()),
        with_state=draw(st.booleans()),
    )


def _module_case(c: dict, device: str):
    """A float64 module with fresh random parameters, its input, optional state and the
    upstream gradients, all random (never zeros)."""
    m = ConvLSTM(
        c["Ci"], c["C"], c["kernel_size"], num_layers=c["num_layers"], bias=c["bias"], batch_first=c["batch_first"],
        peephole=c["peephole"], spatial_size=(c["H"], c["W"]) if c["peephole"] else None, device=device,
        dtype=torch.float64,
    )
    randomize(m)
    T, B, L, C, H, W = c["T"], c["B"], c["num_layers"], c["C"], c["H"], c["W"]
    opts = dict(dtype=torch.float64, device=device)
    x = torch.randn(T, B, c["Ci"], H, W, **opts)
    hx = (torch.randn(L, B, C, H, W, **opts), torch.randn(L, B, C, H, W, **opts)) if c["with_state"] else None
    upstream = {"y": torch.randn(T, B, C, H, W, **opts), "h_n": torch.randn(L, B, C, H, W, **opts),
                "c_n": torch.randn(L, B, C, H, W, **opts)}
    if c["batch_first"]:
        x, upstream["y"] = x.transpose(0, 1).contiguous(), upstream["y"].transpose(0, 1).contiguous()
    return m, x, hx, upstream


@given(config=configs(), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_module_matches_reference(device, config, data, seed):
    """seqkernels.ConvLSTM against convlstm_module_reference: output, h_n, c_n and the
    gradients of the input, h0, c0 and every parameter."""
    dtype = data.draw(st.sampled_from(dtypes_on(device)), label="dtype")
    torch.manual_seed(seed)
    note(f"{config} {dtype}")
    m64, x, hx, upstream = _module_case(config, device)
    m = copy.deepcopy(m64).to(dtype)
    got = run_module(m, x, hx, upstream)
    ref64 = run_module(m64, x, hx, upstream, convlstm_module_reference)
    baseline = sums = None
    if dtype in LOW_PRECISION:
        baseline = run_module(m, x, hx, upstream, convlstm_module_reference)
        x_tb = x.transpose(0, 1) if config["batch_first"] else x
        up_tb = dict(upstream, y=upstream["y"].transpose(0, 1) if config["batch_first"] else upstream["y"])
        sums = reduction_sums(layer_params(m64), x_tb, hx, up_tb)
    compare(got, ref64, dtype, "ConvLSTM vs reference", baseline, sums)
    # The last layer's last step is h_n[-1].
    last = got["y"][:, -1] if config["batch_first"] else got["y"][-1]
    assert torch.equal(last, got["h_n"][-1]), "h_n[-1] is not the output's last step"
    # Inference is its own computation (one convolution of [x_t, h_{t-1}] per step, no
    # saved gates): held to the same reference and rule.
    with torch.no_grad():
        hx_cast = None if hx is None else tuple(s.to(dtype) for s in hx)
        y, (h_n, c_n) = m(x.to(dtype), hx_cast)
    outputs = ("y", "h_n", "c_n")
    compare({"y": y, "h_n": h_n, "c_n": c_n}, {k: ref64[k] for k in outputs}, dtype, "ConvLSTM no-grad vs reference",
            None if baseline is None else {k: baseline[k] for k in outputs})
    assert torch.equal(y[:, -1] if config["batch_first"] else y[-1], h_n[-1])


def _functional_leaves(T, B, Ci, C, H, W, kernel, bias, peephole, with_state, device) -> dict:
    KH, KW = kernel
    bound = 1 / math.sqrt(C * KH * KW)
    opts = dict(dtype=torch.float64, device=device)
    t = {
        "x": torch.randn(T, B, Ci, H, W, **opts),
        "weight_ih": (torch.rand(4 * C, Ci, KH, KW, **opts) * 2 - 1) * bound,
        "weight_hh": (torch.rand(4 * C, C, KH, KW, **opts) * 2 - 1) * bound,
    }
    if with_state:
        t["h0"], t["c0"] = torch.randn(B, C, H, W, **opts), torch.randn(B, C, H, W, **opts)
    if bias:
        t["bias_ih"], t["bias_hh"] = ((torch.rand(4 * C, **opts) * 2 - 1) * bound for _ in range(2))
    if peephole:
        for gate in PEEPHOLES:
            t[f"weight_{gate}"] = (torch.rand(C, H, W, **opts) * 2 - 1) * bound
    return t


def run_functional(fn, tensors: dict, dtype: torch.dtype, upstream: dict) -> dict:
    """fn(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, peephole_weights) on leaves
    cast to dtype; backpropagates sum(y * g_y) + sum(h_T * g_h) + sum(c_T * g_c) and
    returns outputs and gradients (grad_<leaf name>)."""
    leaves = {k: v.detach().to(dtype).requires_grad_(True) for k, v in tensors.items()}
    peep = tuple(leaves[f"weight_{g}"] for g in PEEPHOLES) if "weight_ci" in leaves else None
    y, (h, c) = fn(leaves["x"], leaves.get("h0"), leaves.get("c0"), leaves["weight_ih"], leaves["weight_hh"],
                   leaves.get("bias_ih"), leaves.get("bias_hh"), peep)
    loss = (y * upstream["y"].to(dtype)).sum() + (h * upstream["h"].to(dtype)).sum()
    loss = loss + (c * upstream["c"].to(dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    result = {"y": y.detach(), "h": h.detach(), "c": c.detach()}
    result.update({f"grad_{k}": g for k, g in zip(leaves, grads)})
    return result


@given(config=configs(), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_functional_matches_reference(device, config, data, seed):
    """seqkernels.convlstm (one layer) against convlstm_reference, values and gradients."""
    dtype = data.draw(st.sampled_from(dtypes_on(device)), label="dtype")
    torch.manual_seed(seed)
    c = config
    note(f"{c} {dtype}")
    kernel = c["kernel_size"] if isinstance(c["kernel_size"], tuple) else (c["kernel_size"],) * 2
    tensors = _functional_leaves(c["T"], c["B"], c["Ci"], c["C"], c["H"], c["W"], kernel, c["bias"], c["peephole"],
                                 c["with_state"], device)
    shape = (c["B"], c["C"], c["H"], c["W"])
    upstream = {"y": torch.randn(c["T"], *shape, dtype=torch.float64, device=device),
                "h": torch.randn(*shape, dtype=torch.float64, device=device),
                "c": torch.randn(*shape, dtype=torch.float64, device=device)}
    got = run_functional(convlstm, tensors, dtype, upstream)
    ref64 = run_functional(convlstm_reference, tensors, torch.float64, upstream)
    baseline = sums = None
    if dtype in LOW_PRECISION:
        baseline = run_functional(convlstm_reference, tensors, dtype, upstream)
        layer = {k: v for k, v in tensors.items() if k not in ("x", "h0", "c0")}
        hx = (tensors["h0"][None], tensors["c0"][None]) if c["with_state"] else None
        up = {"y": upstream["y"], "h_n": upstream["h"][None], "c_n": upstream["c"][None]}
        sums = {k[: -len("_l0")]: v for k, v in reduction_sums([layer], tensors["x"], hx, up).items()}
    compare(got, ref64, dtype, "convlstm vs reference", baseline, sums)


def test_initial_state_none_means_zeros(device):
    torch.manual_seed(20)
    t = _functional_leaves(3, 2, 2, 3, 4, 5, (3, 3), True, True, False, device)
    peep = tuple(t[f"weight_{g}"] for g in PEEPHOLES)
    args = (t["weight_ih"], t["weight_hh"], t["bias_ih"], t["bias_hh"], peep)
    zeros = torch.zeros(2, 3, 4, 5, dtype=torch.float64, device=device)
    y, (h, c) = convlstm(t["x"], None, None, *args)
    y0, (h0, c0) = convlstm(t["x"], zeros, zeros, *args)
    assert torch.equal(y, y0) and torch.equal(h, h0) and torch.equal(c, c0)
    assert torch.equal(h, y[-1])


@pytest.mark.parametrize("used", ["y", "h", "c"])
def test_gradients_when_one_output_is_used(device, used):
    """Only one of (output, h_T, c_T) reaches the loss (the others' gradients are None or
    zeros for autograd); bias_ih alone (bias_hh None); the peepholes frozen."""
    torch.manual_seed(21)
    t = _functional_leaves(3, 2, 2, 3, 4, 5, (3, 3), True, True, True, device)
    del t["bias_hh"]
    frozen = {g: t.pop(f"weight_{g}") for g in PEEPHOLES}
    results = []
    for fn in (convlstm, convlstm_reference):
        leaves = {k: v.clone().requires_grad_(True) for k, v in t.items()}
        y, (h, c) = fn(leaves["x"], leaves["h0"], leaves["c0"], leaves["weight_ih"], leaves["weight_hh"],
                       leaves["bias_ih"], None, tuple(frozen[g] for g in PEEPHOLES))
        out = {"y": y, "h": h, "c": c}[used]
        results.append(torch.autograd.grad((out * torch.cos(out)).sum(), list(leaves.values())))
    for name, a, e in zip(t, *results):
        assert_close(a, e, torch.float64, f"grad_{name} (loss on {used})")


@pytest.mark.parametrize("T", [3, 9])  # one step per backward chunk on the CPU, then chunks of 2
def test_incoming_gradients_in_any_strides(device, T):
    """The backward takes dL/dy, dL/dh_T and dL/dc_T as autograd hands them over, expanded
    from a sum (all strides 0) or transposed, without a dense copy (csrc/convlstm_checks.cpp):
    every gradient against the reference loop's for the same upstream values."""
    torch.manual_seed(22)
    t = _functional_leaves(T, 2, 2, 3, 4, 5, (3, 3), True, True, True, device)
    peep = tuple(t.pop(f"weight_{g}") for g in PEEPHOLES)
    y_shape = (T, 2, 3, 4, 5)
    upstream = {
        "y": torch.tensor(0.7, dtype=torch.float64, device=device).expand(y_shape),
        "h": torch.randn(2, 5, 4, 3, dtype=torch.float64, device=device).permute(0, 3, 2, 1),
        "c": torch.tensor(-1.3, dtype=torch.float64, device=device).expand(2, 3, 4, 5),
    }
    assert not any(g.is_contiguous() for g in upstream.values())
    results = []
    for fn in (convlstm, convlstm_reference):
        leaves = {k: v.clone().requires_grad_(True) for k, v in t.items()}
        y, (h, c) = fn(leaves["x"], leaves["h0"], leaves["c0"], leaves["weight_ih"], leaves["weight_hh"],
                       leaves["bias_ih"], leaves["bias_hh"], peep)
        results.append(torch.autograd.grad((y, h, c), list(leaves.values()),
                                           (upstream["y"], upstream["h"], upstream["c"])))
    for name, a, e in zip(t, *results):
        assert_close(a, e, torch.float64, f"grad_{name}")


# --------------------------------------------------------------------------------------
# Winograd convolutions on the CPU (csrc/cpu/winograd.h), chosen by SEQKERNELS_CONV_ALGO
# --------------------------------------------------------------------------------------
# Winograd's transforms grow float32 rounding error: ~1e-5 of the magnitude against ~1e-6 for
# the direct convolution (winograd.h), so float32 gets 5e-5 at the magnitude here.
WINOGRAD_TOLERANCE = {torch.float64: (1e-10, 1e-10), torch.float32: (1e-4, 5e-5)}


@contextlib.contextmanager
def conv_algo(value: str):
    """SEQKERNELS_CONV_ALGO set to value inside the block (read by every CPU call)."""
    saved = os.environ.get("SEQKERNELS_CONV_ALGO")
    os.environ["SEQKERNELS_CONV_ALGO"] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ["SEQKERNELS_CONV_ALGO"]
        else:
            os.environ["SEQKERNELS_CONV_ALGO"] = saved


def _winograd_case(c: dict, seed: int):
    torch.manual_seed(seed)
    tensors = _functional_leaves(c["T"], c["B"], c["Ci"], c["C"], c["H"], c["W"], (c["K"], c["K"]), c["bias"],
                                 c["peephole"], c["with_state"], "cpu")
    shape = (c["B"], c["C"], c["H"], c["W"])
    upstream = {"y": torch.randn(c["T"], *shape, dtype=torch.float64), "h": torch.randn(*shape, dtype=torch.float64),
                "c": torch.randn(*shape, dtype=torch.float64)}
    return tensors, upstream


def _assert_winograd_close(got: dict, ref64: dict, dtype: torch.dtype, what: str) -> None:
    rtol, atol = WINOGRAD_TOLERANCE[dtype]
    for key in ref64:
        torch.testing.assert_close(got[key].double(), ref64[key], rtol=rtol, atol=atol * max(1.0, max_abs(ref64[key])),
                                   msg=lambda m, key=key: f"{what}: {key} ({dtype}): {m}")


@given(
    config=st.fixed_dictionaries(dict(
        # Frames that are not whole tiles (4 x 4 output tiles for K = 3, 2 x 2 for K = 5), one
        # pixel wide, and longer than the kernel; 8..9 steps give multi-step backward chunks.
        T=st.one_of(st.integers(1, 3), st.integers(8, 9)), B=st.integers(1, 3), Ci=st.integers(1, 5),
        C=st.integers(1, 5), H=st.sampled_from([1, 2, 3, 5, 6, 9, 13]), W=st.sampled_from([1, 4, 5, 7, 10]),
        K=st.sampled_from([3, 5]), bias=st.booleans(), peephole=st.booleans(), with_state=st.booleans(),
    )),
    dtype=st.sampled_from([torch.float64, torch.float32]),
    seed=st.integers(0, 2**31 - 1),
)
def test_winograd_matches_reference(config, dtype, seed):
    """With SEQKERNELS_CONV_ALGO=winograd every convolution of the CPU op (forward, the input
    gradients, the weight gradients; training and inference) runs Winograd's: outputs and
    every gradient against the float64 reference loop, and the same bits on a second call."""
    note(f"{config} {dtype}")
    tensors, upstream = _winograd_case(config, seed)
    ref64 = run_functional(convlstm_reference, tensors, torch.float64, upstream)
    with conv_algo("winograd"):
        got = run_functional(convlstm, tensors, dtype, upstream)
        again = run_functional(convlstm, tensors, dtype, upstream)
        with torch.no_grad():
            leaves = {k: v.to(dtype) for k, v in tensors.items()}
            peep = tuple(leaves[f"weight_{g}"] for g in PEEPHOLES) if config["peephole"] else None
            y, (h, c) = convlstm(leaves["x"], leaves.get("h0"), leaves.get("c0"), leaves["weight_ih"],
                                 leaves["weight_hh"], leaves.get("bias_ih"), leaves.get("bias_hh"), peep)
    _assert_winograd_close(got, ref64, dtype, "training call")
    _assert_winograd_close({"y": y, "h": h, "c": c}, {k: ref64[k] for k in ("y", "h", "c")}, dtype, "inference call")
    for key in got:
        assert torch.equal(got[key], again[key]), f"{key}: two identical calls differ"


def test_auto_takes_winograd_for_wide_convolutions():
    """auto runs Winograd's convolutions where the channels are wide (w_ih [64, 32, 3, 3] here)
    and oneDNN's where they are not (w_hh [64, 16, 3, 3]): the float32 result is bitwise the
    forced-Winograd one, differs from the all-direct one, and both are within tolerance."""
    config = dict(T=3, B=2, Ci=32, C=16, H=8, W=8, K=3, bias=True, peephole=False, with_state=True)
    tensors, upstream = _winograd_case(config, 7)
    ref64 = run_functional(convlstm_reference, tensors, torch.float64, upstream)
    results = {}
    for algo in ("auto", "winograd", "direct"):
        with conv_algo(algo):
            results[algo] = run_functional(convlstm, tensors, torch.float32, upstream)
        _assert_winograd_close(results[algo], ref64, torch.float32, algo)
    assert torch.equal(results["auto"]["y"], results["winograd"]["y"])
    assert not torch.equal(results["auto"]["y"], results["direct"]["y"])


def test_winograd_float32_gemm_edges():
    """float32 Winograd runs its own packed GEMM (csrc/cpu/packed_gemm.h); these channels reach
    its edge cases: 4C = 260 output columns (16 whole panels and a 4-column one), the input
    gradients' 260-deep inner dimension (two passes of 256), narrow outputs (Ci = 3, one masked
    panel) and 9 tiles a frame (a 6-row micro-tile and a 3-row rest). Outputs and gradients
    against the float64 reference loop."""
    config = dict(T=2, B=1, Ci=3, C=65, H=9, W=9, K=3, bias=True, peephole=True, with_state=True)
    tensors, upstream = _winograd_case(config, 11)
    ref64 = run_functional(convlstm_reference, tensors, torch.float64, upstream)
    with conv_algo("winograd"):
        got = run_functional(convlstm, tensors, torch.float32, upstream)
    _assert_winograd_close(got, ref64, torch.float32, "wide channels")


@pytest.mark.parametrize("K", [3, 5])
def test_gradcheck_winograd(K):
    """The Winograd weight and input gradients are the forward's exact derivatives (float64)."""
    torch.manual_seed(3)
    tensors = _functional_leaves(2, 2, 2, 2, 5, 6, (K, K), True, False, True, "cpu")
    names = list(tensors)
    leaves = tuple(t.requires_grad_(True) for t in tensors.values())

    def fn(*ts):
        kw = dict(zip(names, ts))
        y, (h, c) = convlstm(kw["x"], kw["h0"], kw["c0"], kw["weight_ih"], kw["weight_hh"], kw["bias_ih"],
                             kw["bias_hh"])
        return y, h, c

    with conv_algo("winograd"):
        assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("algo", ["direct", "winograd"])
@pytest.mark.parametrize("B, H, W", [(3, 20, 20), (2, 33, 32)])  # 400 px: groups of 2 + 1 frames; 1056 px: 1 + 1
def test_cpu_inference_in_frame_groups(algo, B, H, W):
    """CPU inference convolves a step's frames in groups of at most 1024 pixels
    (CpuPointwise::kInferenceGroupPixels): uneven and single-frame groups, with peepholes,
    biases and the next input frame staged per group, against the float64 reference."""
    torch.manual_seed(11)
    t = _functional_leaves(3, B, 2, 3, H, W, (3, 3), True, True, True, "cpu")
    peep = tuple(t[f"weight_{g}"] for g in PEEPHOLES)
    args = (t["x"], t["h0"], t["c0"], t["weight_ih"], t["weight_hh"], t["bias_ih"], t["bias_hh"], peep)
    with torch.no_grad():
        with conv_algo(algo):
            y, (h, c) = convlstm(*args)
        y_ref, (h_ref, c_ref) = convlstm_reference(*args)
    for name, a, e in (("y", y, y_ref), ("h", h, h_ref), ("c", c, c_ref)):
        assert_close(a, e, torch.float64, name)


def test_conv_algo_rejects_unknown_values():
    t = _functional_leaves(2, 1, 2, 2, 4, 4, (3, 3), False, False, True, "cpu")
    message = "SEQKERNELS_CONV_ALGO must be auto, winograd or direct"
    with conv_algo("fastest"), pytest.raises(RuntimeError, match=message):
        convlstm(t["x"], t["h0"], t["c0"], t["weight_ih"], t["weight_hh"])


# --------------------------------------------------------------------------------------
# gradcheck (float64) of the op path: seqkernels.convlstm with peepholes and biases
# --------------------------------------------------------------------------------------
GRADCHECK_CASES = [
    # (T, B, Ci, C, H, W, kernel, bias, peephole)
    (3, 2, 2, 2, 4, 3, (3, 3), True, True),
    (2, 1, 1, 2, 3, 5, (3, 5), True, True),
    (1, 2, 3, 1, 2, 2, (1, 1), False, True),
    (2, 2, 2, 1, 1, 3, (5, 3), True, False),
    (9, 1, 1, 2, 2, 3, (3, 3), True, True),  # backward chunks of 2 steps, then a last one of 1
]


@pytest.mark.parametrize("T, B, Ci, C, H, W, kernel, bias, peephole", GRADCHECK_CASES)
def test_gradcheck_convlstm(device, T, B, Ci, C, H, W, kernel, bias, peephole):
    torch.manual_seed(1)
    tensors = _functional_leaves(T, B, Ci, C, H, W, kernel, bias, peephole, True, device)
    names = list(tensors)
    leaves = tuple(t.requires_grad_(True) for t in tensors.values())

    def fn(*ts):
        kw = dict(zip(names, ts))
        peep = tuple(kw[f"weight_{g}"] for g in PEEPHOLES) if peephole else None
        y, (h, c) = convlstm(kw["x"], kw["h0"], kw["c0"], kw["weight_ih"], kw["weight_hh"], kw.get("bias_ih"),
                             kw.get("bias_hh"), peep)
        return y, h, c

    # gradcheck also requires backward to be reproducible bit for bit; cuDNN's convolution
    # weight gradients are that only in its deterministic mode (our own kernels always are).
    saved = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True
    try:
        assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)
    finally:
        torch.backends.cudnn.deterministic = saved


# --------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------
OPCHECK_CASES = [
    # (T, B, Ci, C, H, W, kernel, bias, peephole)
    pytest.param(3, 2, 2, 2, 4, 5, (3, 3), True, True, id="bias-peephole"),
    pytest.param(2, 1, 3, 1, 3, 3, (3, 5), False, False, id="plain-nonsquare-kernel"),
    pytest.param(1, 3, 1, 2, 1, 2, (1, 1), True, False, id="t1-1x1"),
]


def _op_args(T, B, Ci, C, H, W, kernel, bias, peephole, training, device, requires_grad) -> tuple:
    """convlstm_forward's arguments in float32: bias = b_ih + b_hh, peephole [3, C, H, W]."""
    t = _functional_leaves(T, B, Ci, C, H, W, kernel, bias, peephole, True, device)
    t = {k: v.float() for k, v in t.items()}
    b = t["bias_ih"] + t["bias_hh"] if bias else None
    peep = torch.stack([t[f"weight_{g}"] for g in PEEPHOLES]) if peephole else None
    args = [t["x"], t["h0"], t["c0"], t["weight_ih"], t["weight_hh"], b, peep]
    return tuple(a.requires_grad_(requires_grad) if a is not None else None for a in args) + (training,)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("T, B, Ci, C, H, W, kernel, bias, peephole", OPCHECK_CASES)
def test_opcheck_convlstm_forward(device, T, B, Ci, C, H, W, kernel, bias, peephole, training):
    torch.manual_seed(2)
    # Gradients exist only for training=True (inference saves nothing for backward).
    args = _op_args(T, B, Ci, C, H, W, kernel, bias, peephole, training, device, training)
    torch.library.opcheck(_forward_op.default, args)


@pytest.mark.parametrize("T, B, Ci, C, H, W, kernel, bias, peephole", OPCHECK_CASES)
def test_opcheck_convlstm_backward(device, T, B, Ci, C, H, W, kernel, bias, peephole):
    torch.manual_seed(3)
    x, h0, c0, w_ih, w_hh, b, peep, training = _op_args(T, B, Ci, C, H, W, kernel, bias, peephole, True, device, False)
    y, h_n, c_n, gates, cells = _forward_op(x, h0, c0, w_ih, w_hh, b, peep, training)
    args = (torch.randn_like(y), torch.randn_like(h_n), torch.randn_like(c_n), x, h0, c0, w_ih, w_hh, peep, y, gates,
            cells, bias)
    torch.library.opcheck(_backward_op.default, args)


@pytest.mark.parametrize("training", [True, False])
def test_opcheck_batch_first_input_read_in_place(device, training):
    """x as a batch-first input's time-major transpose (frames contiguous, T and B strides
    swapped): the ops read it in place, forward and backward, and agree with a contiguous x."""
    torch.manual_seed(5)
    x, h0, c0, w_ih, w_hh, b, peep, _ = _op_args(4, 3, 2, 3, 5, 4, (3, 5), True, True, training, device, training)
    x_bt = x.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(training)
    assert not x_bt.is_contiguous() and torch.equal(x_bt, x)
    args = (x_bt, h0, c0, w_ih, w_hh, b, peep, training)
    torch.library.opcheck(_forward_op.default, args)
    got, want = _forward_op(*args), _forward_op(x.detach(), h0, c0, w_ih, w_hh, b, peep, training)
    for a, e in zip(got[:3], want[:3]):
        assert torch.equal(a, e)
    if training:
        y, h_n, c_n, gates, cells = (t.detach() for t in got)
        bwd = (torch.randn_like(y), torch.randn_like(h_n), torch.randn_like(c_n), x_bt.detach(), h0.detach(),
               c0.detach(), w_ih.detach(), w_hh.detach(), peep.detach(), y, gates, cells, True)
        torch.library.opcheck(_backward_op.default, bwd)
        g_bt = _backward_op(*bwd)
        g = _backward_op(*bwd[:3], x.detach(), *bwd[4:])
        for a, e in zip(g_bt, g):
            assert torch.equal(a, e)


def test_op_outputs(device):
    """Shapes of the raw ops' outputs: saved buffers are empty in inference, grad_bias and
    grad_peephole empty without a bias / peepholes; the backward accepts None gradients."""
    torch.manual_seed(4)
    T, B, Ci, C, H, W = 3, 2, 2, 3, 4, 5
    for training in (True, False):
        x, h0, c0, w_ih, w_hh, b, peep, _ = _op_args(T, B, Ci, C, H, W, (3, 3), True, True, training, device, False)
        y, h_n, c_n, gates, cells = _forward_op(x, h0, c0, w_ih, w_hh, b, peep, training)
        assert y.shape == (T, B, C, H, W) and h_n.shape == (B, C, H, W) and c_n.shape == (B, C, H, W)
        # Saved for backward in the kernels' channels-last layout.
        assert gates.shape == ((T, B, H, W, 4 * C) if training else (0,))
        assert cells.shape == ((T, B, H, W, C) if training else (0,))
        assert torch.equal(h_n, y[-1])
    for has_bias, with_peep in ((True, True), (False, False)):
        p = peep if with_peep else None
        y, h_n, c_n, gates, cells = _forward_op(x, h0, c0, w_ih, w_hh, b if has_bias else None, p, True)
        grads = _backward_op(torch.randn_like(y), None, None, x, h0, c0, w_ih, w_hh, p, y, gates, cells, has_bias)
        gx, gh0, gc0, gw_ih, gw_hh, gb, gp = grads
        assert gx.shape == x.shape and gh0.shape == h0.shape and gc0.shape == c0.shape
        assert gw_ih.shape == w_ih.shape and gw_hh.shape == w_hh.shape
        assert gb.shape == ((4 * C,) if has_bias else (0,))
        assert gp.shape == ((3, C, H, W) if with_peep else (0,))


@pytest.mark.parametrize("bias,peephole", [(True, True), (False, False)])
def test_double_backward_matches_reference(device, bias, peephole):
    """Gradients of gradients (create_graph=True; second and third order) with respect to
    every input and parameter, against the float64 reference; and torch.autograd.gradgradcheck."""
    t = _functional_leaves(2, 2, 2, 2, 3, 3, (3, 3), bias, peephole, True, device)
    names = list(t)
    leaves = [t[k].requires_grad_(True) for k in names]

    def loss_of(fn):
        def loss(*values):
            v = dict(zip(names, values))
            peep = tuple(v[f"weight_{g}"] for g in PEEPHOLES) if peephole else None
            y, (h, c) = fn(v["x"], v["h0"], v["c0"], v["weight_ih"], v["weight_hh"], v.get("bias_ih"),
                           v.get("bias_hh"), peep)
            return y.sin().sum() + h.square().sum() + (c * v["c0"]).sum()

        return loss

    assert_orders_close(gradients_of_gradients(loss_of(convlstm), leaves, order=3),
                        gradients_of_gradients(loss_of(convlstm_reference), leaves, order=3), names, assert_close)
    # On a GPU the reference's F.conv2d backward (cuDNN) sums in an order that varies run to run,
    # so the second order repeats to rounding, not bit for bit.
    assert torch.autograd.gradgradcheck(loss_of(convlstm), tuple(leaves), nondet_tol=1e-10 if device != "cpu" else 0.0)


# --------------------------------------------------------------------------------------
# The popular single-convolution ConvLSTM and load_concat_conv_weights
# --------------------------------------------------------------------------------------
class PopularConvLSTMCell(nn.Module):
    """The layout of the widely copied ConvLSTM implementations: one conv over cat([x, h])
    whose 4C output channels split as i, f, o, g. Written independently of seqkernels."""

    def __init__(self, input_channels, hidden_channels, kernel_size, bias):
        super().__init__()
        self.hidden_channels = hidden_channels
        padding = (kernel_size[0] // 2, kernel_size[1] // 2)
        self.conv = nn.Conv2d(input_channels + hidden_channels, 4 * hidden_channels, kernel_size, padding=padding,
                              bias=bias, dtype=torch.float64)

    def forward(self, x, state):
        h, c = state
        combined = self.conv(torch.cat([x, h], dim=1))
        cc_i, cc_f, cc_o, cc_g = torch.split(combined, self.hidden_channels, dim=1)
        i, f, o, g = torch.sigmoid(cc_i), torch.sigmoid(cc_f), torch.sigmoid(cc_o), torch.tanh(cc_g)
        c_next = f * c + i * g
        return o * torch.tanh(c_next), c_next


def popular_convlstm(cells: list[PopularConvLSTMCell], x: Tensor, h0: Tensor, c0: Tensor):
    """Stacked popular cells over x [T, B, Ci, H, W] from h0/c0 [L, B, C, H, W]."""
    h_n, c_n = [], []
    for k, cell in enumerate(cells):
        h, c = h0[k], c0[k]
        outputs = []
        for x_t in x:
            h, c = cell(x_t, (h, c))
            outputs.append(h)
        x = torch.stack(outputs)
        h_n.append(h)
        c_n.append(c)
    return x, (torch.stack(h_n), torch.stack(c_n))


@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kernel", [(3, 3), (3, 5)])
def test_load_concat_conv_weights_matches_popular_cell(device, num_layers, bias, kernel):
    torch.manual_seed(30)
    T, B, Ci, C, H, W = 3, 2, 3, 2, 5, 4
    cells = [PopularConvLSTMCell(Ci if k == 0 else C, C, kernel, bias).to(device) for k in range(num_layers)]
    m = ConvLSTM(Ci, C, kernel, num_layers=num_layers, bias=bias, device=device, dtype=torch.float64)
    for k, cell in enumerate(cells):
        m.load_concat_conv_weights(k, cell.conv.weight, cell.conv.bias)
    opts = dict(dtype=torch.float64, device=device)
    x = torch.randn(T, B, Ci, H, W, **opts)
    h0, c0 = torch.randn(num_layers, B, C, H, W, **opts), torch.randn(num_layers, B, C, H, W, **opts)
    y, (h_n, c_n) = m(x, (h0, c0))
    y_ref, (h_ref, c_ref) = popular_convlstm(cells, x, h0, c0)
    assert_close(y, y_ref, torch.float64, "y")
    assert_close(h_n, h_ref, torch.float64, "h_n")
    assert_close(c_n, c_ref, torch.float64, "c_n")
    # The reference, run on the loaded parameters, agrees as well.
    y2, _ = convlstm_module_reference(m, x, (h0, c0))
    assert_close(y2, y_ref, torch.float64, "reference on loaded weights")


def test_load_concat_conv_weights_bias_handling():
    torch.manual_seed(31)
    cell = PopularConvLSTMCell(2, 3, (3, 3), bias=False)
    m = ConvLSTM(2, 3, 3, dtype=torch.float64)
    m.load_concat_conv_weights(0, cell.conv.weight)  # no bias: both biases become zeros
    assert torch.count_nonzero(m.bias_ih_l0) == 0 and torch.count_nonzero(m.bias_hh_l0) == 0
    assert m.weight_ih_l0.requires_grad  # still trainable parameters
    with pytest.raises(ValueError, match="bias"):
        ConvLSTM(2, 3, 3, bias=False).load_concat_conv_weights(0, torch.randn(12, 5, 3, 3), torch.randn(12))
    with pytest.raises(ValueError, match="shape"):
        m.load_concat_conv_weights(0, torch.randn(12, 4, 3, 3))
    with pytest.raises(ValueError, match="layer"):
        m.load_concat_conv_weights(1, torch.randn(12, 5, 3, 3))


# --------------------------------------------------------------------------------------
# The module: parameters, state_dict, init, repr
# --------------------------------------------------------------------------------------
def test_state_dict_names_order_and_shapes():
    m = ConvLSTM(3, 2, (3, 5), num_layers=2, peephole=True, spatial_size=(4, 6))
    expected = []
    for k, cin in enumerate((3, 2)):
        expected += [
            (f"weight_ih_l{k}", (8, cin, 3, 5)), (f"weight_hh_l{k}", (8, 2, 3, 5)),
            (f"bias_ih_l{k}", (8,)), (f"bias_hh_l{k}", (8,)),
            (f"weight_ci_l{k}", (2, 4, 6)), (f"weight_cf_l{k}", (2, 4, 6)), (f"weight_co_l{k}", (2, 4, 6)),
        ]
    assert [(n, tuple(t.shape)) for n, t in m.state_dict().items()] == expected
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in expected]
    assert list(m.buffers()) == []
    plain = ConvLSTM(3, 2, 3, bias=False)
    assert list(plain.state_dict()) == ["weight_ih_l0", "weight_hh_l0"]


def test_state_dict_strict_load_into_fresh_module(device):
    torch.manual_seed(32)
    kwargs = dict(num_layers=2, peephole=True, spatial_size=(3, 4), batch_first=True, device=device)
    m = ConvLSTM(2, 3, 3, **kwargs)
    fresh = ConvLSTM(2, 3, 3, **kwargs)
    result = fresh.load_state_dict(m.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(2, 4, 2, 3, 4, device=device)
    with torch.no_grad():
        a, b = m(x), fresh(x)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1][0], b[1][0]) and torch.equal(a[1][1], b[1][1])


def test_default_init_and_repr():
    torch.manual_seed(33)
    m = ConvLSTM(2, 4, (3, 5), peephole=True, spatial_size=6)
    bound = 1 / math.sqrt(4 * 3 * 5)
    for name, p in m.named_parameters():
        assert p.abs().max() <= bound, name
        assert p.std() > bound / 4, f"{name} looks degenerate"
    assert m.weight_ci_l0.shape == (4, 6, 6)
    r = repr(m)
    assert "kernel_size=(3, 5)" in r and "peephole=True" in r
    m64 = ConvLSTM(2, 3, 3, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in m64.parameters())


def test_module_hx_none_means_zeros_and_batch_first(device):
    torch.manual_seed(34)
    tf = ConvLSTM(2, 3, 3, num_layers=2, device=device, dtype=torch.float64)
    bf = ConvLSTM(2, 3, 3, num_layers=2, batch_first=True, device=device, dtype=torch.float64)
    bf.load_state_dict(tf.state_dict())
    x = torch.randn(4, 3, 2, 5, 4, dtype=torch.float64, device=device)  # [T, B, Ci, H, W]
    zeros = torch.zeros(2, 3, 3, 5, 4, dtype=torch.float64, device=device)
    y, (h, c) = tf(x)
    y0, (h0, c0) = tf(x, (zeros, zeros))
    assert torch.equal(y, y0) and torch.equal(h, h0) and torch.equal(c, c0)
    yb, (hb, cb) = bf(x.transpose(0, 1))
    assert yb.shape == (3, 4, 3, 5, 4) and hb.shape == (2, 3, 3, 5, 4)
    assert torch.equal(yb.transpose(0, 1), y) and torch.equal(hb, h) and torch.equal(cb, c)


def test_module_noncontiguous_input_and_no_grad(device):
    torch.manual_seed(35)
    m = ConvLSTM(2, 3, 3, device=device)
    x = torch.randn(3, 5, 2, 4, 6, device=device).transpose(0, 1)  # [T, B, ...] view, non-contiguous
    with torch.no_grad():
        y, (h, c) = m(x)
    m64 = copy.deepcopy(m).double()
    y_ref, (h_ref, c_ref) = convlstm_module_reference(m64, x.double())
    assert_close(y, y_ref, torch.float32, "y")
    assert_close(c, c_ref, torch.float32, "c_n")


def test_zero_steps_pass_the_state_through():
    torch.manual_seed(36)
    m = ConvLSTM(2, 3, 3, num_layers=2)
    hx = (torch.randn(2, 4, 3, 5, 6), torch.randn(2, 4, 3, 5, 6))
    y, (h_n, c_n) = m(torch.randn(0, 4, 2, 5, 6), hx)
    assert y.shape == (0, 4, 3, 5, 6)
    assert torch.equal(h_n, hx[0]) and torch.equal(c_n, hx[1])
    y, (h, c) = convlstm(torch.randn(0, 4, 2, 5, 6), hx[0][0], hx[1][0], m.weight_ih_l0, m.weight_hh_l0)
    assert y.shape == (0, 4, 3, 5, 6) and torch.equal(h, hx[0][0]) and torch.equal(c, hx[1][0])


# --------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------
def test_forward_and_backward_are_deterministic(device):
    """Two runs on one device (and one CPU thread count) give bitwise equal values and
    gradients. Across thread counts they may differ in the last bit: the convolutions'
    weight gradients are ATen's (oneDNN), which splits its reductions by thread."""
    torch.manual_seed(6)
    m = ConvLSTM(3, 4, 3, num_layers=2, peephole=True, spatial_size=(7, 6), device=device)
    x = torch.randn(4, 3, 3, 7, 6, device=device)
    hx = (torch.randn(2, 3, 4, 7, 6, device=device), torch.randn(2, 3, 4, 7, 6, device=device))
    upstream = {"y": torch.randn(4, 3, 4, 7, 6, device=device), "h_n": torch.randn(2, 3, 4, 7, 6, device=device),
                "c_n": torch.randn(2, 3, 4, 7, 6, device=device)}
    first = run_module(m, x, hx, upstream)
    for run in range(2):
        again = run_module(m, x, hx, upstream)
        for key in first:
            assert torch.equal(first[key], again[key]), f"{key} differs between runs (run {run + 2})"


# --------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------
class _VideoModel(nn.Module):
    """conv encoder -> ConvLSTM (batch-first) -> per-frame 1x1 conv head."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv2d(1, 3, 3, padding=1)
        self.rnn = ConvLSTM(3, 4, (3, 5), num_layers=2, batch_first=True, peephole=True, spatial_size=(5, 6))
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x, hx=None):
        B, T = x.shape[:2]
        feats = self.enc(x.flatten(0, 1)).unflatten(0, (B, T))
        y, (h_n, c_n) = self.rnn(feats, hx)
        return self.head(y.flatten(0, 1)).unflatten(0, (B, T)), h_n, c_n


@pytest.mark.parametrize("backend, with_state", [("aot_eager", False), ("aot_eager", True), ("inductor", True)])
def test_torch_compile_fullgraph(device, backend, with_state):
    torch.manual_seed(13)
    torch._dynamo.reset()
    model = _VideoModel().to(device)
    x = torch.randn(2, 3, 1, 5, 6, device=device)
    hx = (torch.randn(2, 2, 4, 5, 6, device=device), torch.randn(2, 2, 4, 5, 6, device=device)) if with_state else None

    def run_model(fn):
        xi = x.clone().requires_grad_()
        hi = tuple(s.clone().requires_grad_() for s in hx) if hx is not None else None
        model.zero_grad()
        out, h_n, c_n = fn(xi, hi)
        (out.square().sum() + h_n.sum() + (c_n * 0.5).sum()).backward()
        grads = [xi.grad] + ([s.grad for s in hi] if hi is not None else [])
        grads += [p.grad.clone() for p in model.parameters()]
        return [out.detach(), h_n.detach(), c_n.detach()] + grads

    eager = run_model(model)
    compiled = run_model(torch.compile(model, backend=backend, fullgraph=True))
    assert len(compiled) == len(eager)
    for i, (a, e) in enumerate(zip(compiled, eager)):
        assert_close(a, e, torch.float32, f"compiled result {i}")


# --------------------------------------------------------------------------------------
# CUDA graphs
# --------------------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_forward_and_training_step(dtype):
    """Capture inference and a training step (forward + backward) in CUDA graphs; replays on
    fresh input data agree with eager calls of an identical model."""
    matmul = torch.backends.cuda.matmul
    saved = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        torch.manual_seed(3)
        T, B, Ci, C, H, W = 5, 3, 4, 8, 12, 10
        model = ConvLSTM(Ci, C, (3, 5), num_layers=2, peephole=True, spatial_size=(H, W)).to("cuda", dtype)
        static_x = torch.randn(T, B, Ci, H, W, device="cuda", dtype=dtype)
        check_cuda_graph_replays(model, static_x)
    finally:
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _check_cuda_calls(m: nn.Module, x: Tensor, hx, upstream: dict, stream, label: str) -> None:
    """A training call and an inference call of m on `stream` (None: the current one), each
    against the float64 reference."""
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        got = run_module(m, x, hx, upstream)
        with torch.no_grad():
            y, (h_n, c_n) = m(x, hx)
    torch.cuda.synchronize()
    ref = run_module(m, x, hx, upstream, convlstm_module_reference)
    compare(got, ref, torch.float64, f"{label} (training)")
    compare({"y": y, "h_n": h_n, "c_n": c_n}, {k: ref[k] for k in ("y", "h_n", "c_n")}, torch.float64,
            f"{label} (inference)")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_step_graphs_across_calls_and_streams():
    """The CUDA loop replays each step's convolutions from CUDA graphs that share one memory
    pool (csrc/cuda/convlstm.cu, StepGraph): calls on alternating streams, training and
    inference, three shapes, each against the reference (float64)."""
    side = torch.cuda.Stream()
    for call, (stream, shape) in enumerate([(None, (6, 2, 3, 5, 9, 7)), (side, (6, 2, 3, 5, 9, 7)),
                                            (None, (4, 3, 3, 5, 9, 7)), (side, (7, 2, 3, 5, 9, 7))]):
        T, B, Ci, C, H, W = shape
        torch.manual_seed(call)
        config = dict(Ci=Ci, C=C, kernel_size=3, num_layers=2, bias=True, batch_first=False, peephole=call % 2 == 1,
                      H=H, W=W, T=T, B=B, with_state=True)
        m, x, hx, upstream = _module_case(config, "cuda")
        _check_cuda_calls(m, x, hx, upstream, stream, f"call {call}")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_kept_step_graphs():
    """The forward and the backward keep their step graphs, with the buffers they read and
    accumulate into, for the next call of the same sizes (csrc/cuda/convlstm.cu, KeptStep):
    each call must see its own input, state and weights (changed through .data, which bumps no
    version counter) and return its own gradients, on another stream too, after more sizes
    than are kept (the least recently used dropped and captured again) and after
    seqkernels.release_step_graphs(). Inference and training against the float64 reference."""
    side = torch.cuda.Stream()
    shapes = [(5, 2, 3, 4, 6, 6), (5, 2, 3, 4, 7, 6), (4, 1, 3, 4, 6, 6), (5, 3, 3, 4, 6, 5), (3, 2, 3, 4, 5, 5),
              (4, 2, 2, 4, 6, 6)]  # (T, B, Ci, C, H, W): six sizes, more than the four kept
    schedule = [(0, None), (0, None), (0, "data"), (0, side)] + [(k, None) for k in range(1, 6)] + \
               [(0, None), (0, "release"), (0, None)]
    models = {}
    for call, (k, action) in enumerate(schedule):
        T, B, Ci, C, H, W = shapes[k]
        torch.manual_seed(100 + call)
        config = dict(Ci=Ci, C=C, kernel_size=3, num_layers=1, bias=True, batch_first=False, peephole=False,
                      H=H, W=W, T=T, B=B, with_state=call % 2 == 0)
        fresh, x, hx, upstream = _module_case(config, "cuda")
        m = models.setdefault(k, fresh)
        if action == "data":  # new values in the same storage, no version bump
            for p, q in zip(m.parameters(), fresh.parameters()):
                p.data.copy_(q.data)
        elif action == "release":
            seqkernels.release_step_graphs()
        _check_cuda_calls(m, x, hx, upstream, action if action is side else None, f"call {call}")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_release_step_graphs_frees_every_threads_buffers():
    """Autograd runs a CUDA backward on its own device thread, so the backward's kept step graph
    and buffers belong to that thread: seqkernels.release_step_graphs() from this thread must
    free them too. Freed bytes >= the forward's kept buffers (step weight, state buffer, step
    output) plus the backward's dz alone."""
    T, B, Ci, C, H, W, K = 4, 2, 3, 8, 8, 8, 3
    seqkernels.release_step_graphs()
    torch.manual_seed(5)
    m = ConvLSTM(Ci, C, K, device="cuda")
    x = torch.randn(T, B, Ci, H, W, device="cuda", requires_grad=True)
    for _ in range(2):  # graphs captured in the first call (from its second step), replayed in the second
        y, _ = m(x)
        y.sum().backward()
    freed = bytes_freed_by_release()
    f32 = 4
    forward_kept = (4 * C * C * K * K + B * H * W * C + B * H * W * 4 * C) * f32
    backward_dz = B * H * W * 4 * C * f32
    assert freed >= forward_kept + backward_dz, f"freed {freed} bytes, want >= {forward_kept + backward_dz}"


# --------------------------------------------------------------------------------------
# Bad input: a clear ValueError or RuntimeError, never a crash, never broadcasting
# --------------------------------------------------------------------------------------
MODULE_CONSTRUCTOR_BAD = [
    pytest.param(dict(input_channels=2, hidden_channels=3, kernel_size=4), "odd", id="even-kernel"),
    pytest.param(dict(input_channels=2, hidden_channels=3, kernel_size=(3, 2)), "odd", id="even-kernel-width"),
    pytest.param(dict(input_channels=2, hidden_channels=3, kernel_size=0), "kernel_size", id="kernel-0"),
    pytest.param(dict(input_channels=0, hidden_channels=3, kernel_size=3), "input_channels", id="ci-0"),
    pytest.param(dict(input_channels=2, hidden_channels=3, kernel_size=3, num_layers=0), "num_layers",
                 id="layers-0"),
    pytest.param(dict(input_channels=2, hidden_channels=3, kernel_size=3, peephole=True), "spatial_size",
                 id="peephole-without-spatial-size"),
]


@pytest.mark.parametrize("kwargs, match", MODULE_CONSTRUCTOR_BAD)
def test_module_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConvLSTM(**kwargs)


def _module_forward_bad():
    def case(changes, match, id, **module_kwargs):
        return pytest.param(module_kwargs, changes, match, id=id)

    return [
        case(dict(x=torch.randn(4, 3, 2, 5)), "5-D", "input-4d"),
        case(dict(x=torch.randn(4, 3, 3, 5, 6)), "channels", "wrong-ci"),
        case(dict(hx=(torch.randn(1, 3, 3, 5, 6), torch.randn(1, 3, 3, 5, 6))), "h_0", "h0-layers"),
        case(dict(hx=(torch.randn(2, 1, 3, 5, 6), torch.randn(2, 1, 3, 5, 6))), "h_0", "h0-batch-1-not-broadcast"),
        case(dict(hx=(torch.randn(2, 3, 3, 5, 6), torch.randn(2, 3, 3, 5, 5))), "c_0", "c0-spatial"),
        case(dict(hx=(torch.randn(2, 3, 3, 5, 6), torch.randn(2, 3, 3, 5, 6, dtype=torch.float64))), "dtype",
             "c0-dtype"),
        case(dict(x=torch.randn(4, 3, 2, 5, 6, dtype=torch.float64)), "dtype", "input-dtype"),
        case(dict(x=torch.randn(4, 3, 2, 5, 7)), "spatial_size", "spatial-size-mismatch", peephole=True,
             spatial_size=(5, 6)),
    ]


@pytest.mark.parametrize("module_kwargs, changes, match", _module_forward_bad())
def test_module_forward_rejects_bad_input(module_kwargs, changes, match):
    m = ConvLSTM(2, 3, 3, num_layers=2, **module_kwargs)
    kw = dict(x=torch.randn(4, 3, 2, 5, 6), hx=None)
    kw.update(changes)
    with pytest.raises((ValueError, RuntimeError), match=match):
        m(kw["x"], kw["hx"])


def _good(dtype=torch.float32) -> dict:
    """seqkernels.convlstm's keyword arguments: T=3, B=2, Ci=2, C=3, H=4, W=5, 3x3 kernel."""
    return dict(
        x=torch.randn(3, 2, 2, 4, 5, dtype=dtype),
        h0=torch.randn(2, 3, 4, 5, dtype=dtype),
        c0=torch.randn(2, 3, 4, 5, dtype=dtype),
        weight_ih=torch.randn(12, 2, 3, 3, dtype=dtype),
        weight_hh=torch.randn(12, 3, 3, 3, dtype=dtype),
        bias_ih=torch.randn(12, dtype=dtype),
        bias_hh=torch.randn(12, dtype=dtype),
        peephole_weights=tuple(torch.randn(3, 4, 5, dtype=dtype) for _ in PEEPHOLES),
    )


def _with(**changes) -> dict:
    kw = _good()
    kw.update(changes)
    return kw


FUNCTIONAL_BAD = [
    pytest.param(_with(x=torch.randn(3, 2, 4, 5)), id="x-4d"),
    pytest.param(_with(x=torch.randn(3, 2, 3, 4, 5)), id="x-wrong-ci"),
    pytest.param(_with(weight_ih=torch.randn(12, 2, 2, 2), weight_hh=torch.randn(12, 3, 2, 2)), id="even-kernel"),
    pytest.param(_with(weight_ih=torch.randn(12, 2, 5, 5)), id="w-ih-kernel-differs"),
    pytest.param(_with(weight_hh=torch.randn(12, 2, 3, 3)), id="w-hh-channels"),
    pytest.param(_with(weight_hh=torch.randn(8, 3, 3, 3)), id="w-hh-gates"),
    pytest.param(_with(weight_ih=torch.randn(12, 2, 3)), id="w-ih-3d"),
    pytest.param(_with(h0=torch.randn(1, 3, 4, 5)), id="h0-batch-1-not-broadcast"),
    pytest.param(_with(h0=torch.randn(2, 3, 4, 4)), id="h0-spatial"),
    pytest.param(_with(c0=torch.randn(2, 2, 4, 5)), id="c0-channels"),
    pytest.param(_with(c0=torch.randn(3, 4, 5)), id="c0-3d"),
    pytest.param(_with(bias_ih=torch.randn(3)), id="bias-ih-size"),
    pytest.param(_with(bias_hh=torch.randn(1)), id="bias-hh-not-broadcast"),
    pytest.param(_with(peephole_weights=tuple(torch.randn(3, 4, 4) for _ in PEEPHOLES)), id="peephole-spatial"),
    pytest.param(_with(peephole_weights=tuple(torch.randn(1, 4, 5) for _ in PEEPHOLES)), id="peephole-channels"),
    pytest.param(_with(peephole_weights=(torch.randn(3, 4, 5),) * 2), id="peephole-two-tensors"),
    pytest.param(_with(weight_hh=torch.randn(12, 3, 3, 3, dtype=torch.float64)), id="w-hh-dtype"),
    pytest.param(_with(h0=torch.randn(2, 3, 4, 5, dtype=torch.float64)), id="h0-dtype"),
    pytest.param(_with(bias_ih=torch.randn(12, dtype=torch.bfloat16)), id="bias-dtype"),
    pytest.param(_with(peephole_weights=tuple(torch.randn(3, 4, 5, dtype=torch.float64) for _ in PEEPHOLES)),
                 id="peephole-dtype"),
]


@pytest.mark.parametrize("kwargs", FUNCTIONAL_BAD)
def test_functional_rejects_bad_input(kwargs):
    with pytest.raises((ValueError, RuntimeError), match="convlstm"):
        convlstm(**kwargs)


def _op(**changes) -> dict:
    g = _good()
    args = dict(x=g["x"], h0=g["h0"], c0=g["c0"], w_ih=g["weight_ih"], w_hh=g["weight_hh"],
                bias=g["bias_ih"] + g["bias_hh"], peephole=torch.stack(g["peephole_weights"]), training=True)
    args.update(changes)
    return args


OP_BAD = [
    pytest.param(_op(x=torch.randn(3, 2, 4, 5)), id="x-4d"),
    pytest.param(_op(x=torch.randn(3, 2, 3, 4, 5)), id="x-wrong-ci"),
    pytest.param(_op(x=torch.randn(3, 2, 2, 5, 4).transpose(3, 4)), id="x-noncontiguous"),
    pytest.param(_op(x=torch.randn(0, 2, 2, 4, 5)), id="t-0"),
    pytest.param(_op(w_ih=torch.randn(12, 2, 2, 2), w_hh=torch.randn(12, 3, 2, 2)), id="even-kernel"),
    pytest.param(_op(w_ih=torch.randn(12, 2, 5, 5)), id="w-ih-kernel-differs"),
    pytest.param(_op(w_hh=torch.randn(12, 2, 3, 3)), id="w-hh-channels"),
    pytest.param(_op(w_hh=torch.randn(12, 3, 3)), id="w-hh-3d"),
    pytest.param(_op(h0=torch.randn(1, 3, 4, 5)), id="h0-batch-1"),
    pytest.param(_op(c0=torch.randn(2, 3, 5, 4)), id="c0-spatial"),
    pytest.param(_op(bias=torch.randn(3)), id="bias-size"),
    pytest.param(_op(peephole=torch.randn(2, 3, 4, 5)), id="peephole-2-gates"),
    pytest.param(_op(peephole=torch.randn(3, 3, 4, 4)), id="peephole-spatial"),
    pytest.param(_op(h0=torch.randn(2, 3, 4, 5, dtype=torch.float64)), id="h0-dtype"),
    pytest.param(_op(w_ih=torch.randn(12, 2, 3, 3, dtype=torch.bfloat16)), id="w-ih-dtype"),
    pytest.param(_op(x=torch.ones(3, 2, 2, 4, 5, dtype=torch.int64), h0=torch.ones(2, 3, 4, 5, dtype=torch.int64),
                     c0=torch.ones(2, 3, 4, 5, dtype=torch.int64), w_ih=torch.ones(12, 2, 3, 3, dtype=torch.int64),
                     w_hh=torch.ones(12, 3, 3, 3, dtype=torch.int64), bias=None, peephole=None), id="int64"),
]


@pytest.mark.parametrize("args", OP_BAD)
def test_forward_op_rejects_bad_arguments(args):
    with pytest.raises(RuntimeError, match="seqkernels.convlstm"):
        _forward_op(**args)


def _bwd(**changes) -> dict:
    a = _op()
    y, h_n, c_n, gates, cells = _forward_op(**a)
    args = dict(grad_y=torch.randn_like(y), grad_h_n=torch.randn_like(h_n), grad_c_n=torch.randn_like(c_n), x=a["x"],
                h0=a["h0"], c0=a["c0"], w_ih=a["w_ih"], w_hh=a["w_hh"], peephole=a["peephole"], y=y, gates=gates,
                cells=cells, has_bias=True)
    args.update(changes)
    return args


BACKWARD_BAD = [
    pytest.param(dict(grad_y=torch.randn(3, 2, 3, 4, 4)), id="grad-y-shape"),
    pytest.param(dict(grad_h_n=torch.randn(1, 3, 4, 5)), id="grad-h-n-batch-1"),
    pytest.param(dict(grad_c_n=torch.randn(2, 3, 4, 5, dtype=torch.float64)), id="grad-c-n-dtype"),
    pytest.param(dict(gates=torch.empty(0)), id="gates-from-inference"),
    pytest.param(dict(cells=torch.empty(0)), id="cells-from-inference"),
    pytest.param(dict(y=torch.randn(3, 2, 3, 20)), id="y-4d"),
    pytest.param(dict(peephole=torch.randn(3, 3, 5, 4)), id="peephole-shape"),
]


@pytest.mark.parametrize("changes", BACKWARD_BAD)
def test_backward_op_rejects_bad_arguments(changes):
    with pytest.raises(RuntimeError, match="seqkernels.convlstm"):
        _backward_op(**_bwd(**changes))


def test_direct_op_call_with_bad_sizes_raises_on_every_device(device):
    """The C++ checks' messages format numbers; a mismatch must raise, never crash."""
    kw = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in _op(h0=torch.randn(1, 3, 4, 5)).items()}
    with pytest.raises(RuntimeError, match=r"h0 .*\[2, 3, 4, 5\]"):
        _forward_op(**kw)


def test_device_mismatch_raises(device):
    # x alone on another device than the CPU tensors: on the CPU run that is the meta device,
    # whose kernel (the op's fake function) checks devices too.
    kw = _with()
    kw["x"] = kw["x"].to("meta" if device == "cpu" else device)
    with pytest.raises((ValueError, RuntimeError), match="is on"):
        convlstm(**kw)


def test_package_exports():
    assert seqkernels.ConvLSTM is ConvLSTM and seqkernels.convlstm is convlstm
    assert {"ConvLSTM", "convlstm"} <= set(seqkernels.__all__)
    assert seqkernels.reference.convlstm_reference is convlstm_reference
