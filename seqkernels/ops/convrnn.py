"""The circulant ("wave") ConvRNN op: torch.ops.seqkernels.convrnn_forward /
convrnn_backward, their fake (meta) functions for torch.compile, autograd, the general
functional ``convrnn`` and the extension template's ``convrnn_forward`` API.

Shape legend: B batch, T steps, C channels, N ring size, K kernel width. The schema and
its documentation are in csrc/registration.cpp; the semantics, written as a plain loop,
in seqkernels/reference/convrnn.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ._autograd import (
    call_backward_op, call_op, check_same_device, records_grad, register_autograd, register_double_backward,
    vmap_fold, vmap_per_sample, vmap_unfold,
)

__all__ = ["convrnn", "convrnn_forward", "PADDING_MODES", "NONLINEARITIES"]

_forward = torch.ops.seqkernels.convrnn_forward.default
_backward = torch.ops.seqkernels.convrnn_backward.default
_FORWARD_ARGS = [a.name for a in _forward._schema.arguments]

#: padding_mode / nonlinearity strings and the op's integer codes.
PADDING_MODES = {"circular": 0, "zeros": 1}
NONLINEARITIES = {"tanh": 0, "relu": 1}


def _code(table: dict[str, int], value: str, what: str) -> int:
    if not isinstance(value, str) or value not in table:
        raise ValueError(f"seqkernels.convrnn: {what} must be one of {sorted(table)}, got {value!r}")
    return table[value]


def _check_shape(t: Tensor, shape: tuple[int, ...], name: str, legend: str) -> None:
    if tuple(t.shape) != shape:
        raise ValueError(
            f"seqkernels.convrnn: {name} must have shape {legend} = {shape}, got {tuple(t.shape)} "
            "(no broadcasting)"
        )


def convrnn(
    x: Tensor,
    weight: Tensor,
    h0: Tensor | None = None,
    bias: Tensor | None = None,
    padding_mode: str = "circular",
    nonlinearity: str = "tanh",
) -> tuple[Tensor, Tensor]:
    """The circulant convolutional RNN over a whole sequence, batch-first:

        h_t = act(x_t + conv(h_{t-1}) + bias),  t = 1 .. T

    conv is ``torch.nn.functional.conv1d`` (cross-correlation, C -> C channels) of h padded
    with K // 2 values on the left and K - 1 - K // 2 on the right, around the ring
    (``padding_mode="circular"``, needs K <= N) or with zeros (``"zeros"``); act is
    ``"tanh"`` or ``"relu"``.

    x [B, T, C, N], weight [C, C, K] (out, in, k), h0 [B, C, N] or None (zeros),
    bias [C] or None. Returns (y [B, T, C, N] = h_1 .. h_T, h_T [B, C, N]), differentiable
    in x, weight, h0 and bias. All tensors share one dtype (float32, float64, bfloat16,
    float16) and one device.
    """
    pad_code = _code(PADDING_MODES, padding_mode, "padding_mode")
    act_code = _code(NONLINEARITIES, nonlinearity, "nonlinearity")
    if x.dim() != 4:
        raise ValueError(f"seqkernels.convrnn: x must be 4-D [B, T, C, N], got shape {tuple(x.shape)}")
    if weight.dim() != 3:
        raise ValueError(f"seqkernels.convrnn: weight must be 3-D [C, C, K], got shape {tuple(weight.shape)}")
    B, T, C, N = x.shape
    K = weight.shape[2]
    if C < 1 or N < 1:
        raise ValueError(f"seqkernels.convrnn: x must have C >= 1 channels and a ring of N >= 1, got {tuple(x.shape)}")
    if K < 1:
        raise ValueError("seqkernels.convrnn: the kernel width K must be >= 1")
    _check_shape(weight, (C, C, K), "weight", "[C, C, K]")
    if bias is not None:
        _check_shape(bias, (C,), "bias", "[C]")
    if h0 is not None:
        _check_shape(h0, (B, C, N), "h0", "[B, C, N]")
    if padding_mode == "circular" and K > N:
        raise ValueError(
            f"seqkernels.convrnn: circular padding needs the kernel width K = {K} <= the ring size N = {N} "
            "(use padding_mode='zeros' for wider kernels)"
        )
    if h0 is None:
        h0 = x.new_zeros(B, C, N)
    if B == 0 or T == 0:  # nothing to run: the state passes through unchanged
        return x.new_empty(B, T, C, N), h0.clone()
    return call_op(
        _forward,
        records_grad(x, weight, h0, bias),
        x.contiguous(),
        weight.contiguous(),
        None if bias is None else bias.contiguous(),
        h0.contiguous(),
        pad_code,
        act_code,
    )


def convrnn_forward(x: Tensor, kernel: Tensor, hidden: Tensor) -> Tensor:
    """The extension template's API: a single-channel circulant ConvRNN with tanh.

    x [B, T, N], kernel [1, 1, K], hidden [B, 1, N] or [B, N] (the initial state h0).
    Returns y [B, T + 1, N] with y[:, 0] = h0 and y[:, t + 1] = tanh(x[:, t] + conv(y[:, t])),
    conv the conv1d cross-correlation of the state padded circularly (K // 2 left,
    K - 1 - K // 2 right; needs K <= N). Differentiable in x, kernel and hidden.
    """
    if x.dim() != 3:
        raise ValueError(f"seqkernels.convrnn_forward: x must be 3-D [B, T, N], got shape {tuple(x.shape)}")
    B, T, N = x.shape
    if kernel.dim() != 3 or kernel.shape[0] != 1 or kernel.shape[1] != 1:
        raise ValueError(f"seqkernels.convrnn_forward: kernel must have shape [1, 1, K], got {tuple(kernel.shape)}")
    if hidden.dim() == 3:
        _check_shape(hidden, (B, 1, N), "hidden", "[B, 1, N]")
    elif hidden.dim() == 2:
        _check_shape(hidden, (B, N), "hidden", "[B, N]")
    else:
        raise ValueError(
            f"seqkernels.convrnn_forward: hidden must be [B, 1, N] or [B, N], got shape {tuple(hidden.shape)}"
        )
    h0 = hidden.reshape(B, 1, N)
    y, _ = convrnn(x.unsqueeze(2), kernel, h0, None, "circular", "tanh")
    return torch.cat([h0.unsqueeze(1), y], dim=1).squeeze(2)


@torch.library.register_fake("seqkernels::convrnn_forward")
def _convrnn_forward_fake(x, weight, bias, h0, padding_mode, nonlinearity):
    torch._check(x.dim() == 4, lambda: "seqkernels.convrnn: x must be 4-D [B, T, C, N]")
    torch._check(weight.dim() == 3, lambda: "seqkernels.convrnn: weight must be 3-D [C, C, K]")
    torch._check(h0.dim() == 3, lambda: "seqkernels.convrnn: h0 must be 3-D [B, C, N]")
    check_same_device("seqkernels.convrnn", x, weight=weight, bias=bias, h0=h0)
    B, T, C, N = x.shape
    return x.new_empty(B, T, C, N), h0.new_empty(B, C, N)


@torch.library.register_vmap("seqkernels::convrnn_forward")
def _convrnn_forward_vmap(info, in_dims, x, weight, bias, h0, padding_mode, nonlinearity):
    """torch.vmap over the forward op: V samples that share the weights run as one call of V·B
    rings (vmap_fold); per-sample weights take one call per sample."""
    V = info.batch_size
    args = (x, weight, bias, h0, padding_mode, nonlinearity)
    if in_dims[1] is not None or in_dims[2] is not None:
        return vmap_per_sample(_forward, V, in_dims, args)
    y, h_T = _forward(vmap_fold(x, in_dims[0], V, 0), weight, bias, vmap_fold(h0, in_dims[3], V, 0), padding_mode,
                      nonlinearity)
    return (vmap_unfold(y, V, 0), vmap_unfold(h_T, V, 0)), (0, 0)


@torch.library.register_fake("seqkernels::convrnn_backward")
def _convrnn_backward_fake(grad_y, grad_h_T, weight, h0, y, padding_mode, nonlinearity, has_bias):
    C = weight.shape[0]
    return (
        torch.empty_like(y),
        torch.empty_like(weight),
        weight.new_empty(C if has_bias else 0),
        torch.empty_like(h0),
    )


def _setup_context(ctx, inputs, output):
    args = dict(zip(_FORWARD_ARGS, inputs))
    y, _ = output
    ctx.has_bias = args["bias"] is not None
    ctx.padding_mode = args["padding_mode"]
    ctx.nonlinearity = args["nonlinearity"]
    ctx.save_for_backward(args["weight"], args["h0"], y)


def _convrnn_backward(ctx, grad_y, grad_h_T):
    weight, h0, y = ctx.saved_tensors
    # The op reads gradients of any layout (the expanded ones of a sum without a copy).
    dx, dw, db, dh0 = call_backward_op(
        _backward,
        torch.zeros_like(y) if grad_y is None else grad_y,
        torch.zeros_like(h0) if grad_h_T is None else grad_h_T,
        weight,
        h0,
        y,
        ctx.padding_mode,
        ctx.nonlinearity,
        ctx.has_bias,
    )
    # One gradient per convrnn_forward argument, in schema order.
    grads = {
        "x": dx, "weight": dw, "bias": db if ctx.has_bias else None, "h0": dh0,
        "padding_mode": None, "nonlinearity": None,
    }  # fmt: skip
    return tuple(grads[name] for name in _FORWARD_ARGS)


register_autograd(_forward, _convrnn_backward, _setup_context)


def _convrnn_first_order(grad_y, grad_h_T, weight, h0, y, padding_mode, nonlinearity, has_bias):
    """convrnn_backward's outputs as differentiable PyTorch (register_double_backward): the
    same backward recurrence in plain ops, from y as the op has it, so that no input beyond the
    op's is kept (x enters the step additively; act'(pre) is a function of y: 1 - y^2 for tanh,
    y > 0 for relu). The gradients' dependence on x, the bias and the weights through y reaches
    them through y's own history (the forward's backward)."""
    K = weight.shape[-1]
    pad = (K // 2, K - 1 - K // 2)
    mode = "circular" if padding_mode == PADDING_MODES["circular"] else "constant"
    tanh = nonlinearity == NONLINEARITIES["tanh"]

    def conv(h, w):
        return F.conv1d(F.pad(h, pad, mode=mode), w)

    g = grad_h_T  # dL/dh_t from the steps after t
    grad_w = torch.zeros_like(weight)
    grad_pre = [None] * y.shape[1]
    for t in range(y.shape[1] - 1, -1, -1):
        y_t = y[:, t]
        pre = (grad_y[:, t] + g) * ((1 - y_t * y_t) if tanh else (y_t > 0).to(y_t.dtype))
        grad_pre[t] = pre  # = dL/dx_t
        _, vjp = torch.func.vjp(conv, y[:, t - 1] if t > 0 else h0, weight)
        g, step_w = vjp(pre)
        grad_w = grad_w + step_w
    grad_x = torch.stack(grad_pre, dim=1)
    grad_bias = grad_x.sum((0, 1, 3)) if has_bias else weight.new_empty(0)
    return grad_x, grad_w, grad_bias, g


register_double_backward("seqkernels::convrnn_backward", _convrnn_first_order, ())
