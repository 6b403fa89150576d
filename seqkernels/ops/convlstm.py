"""The ConvLSTM op: torch.ops.seqkernels.convlstm_forward / convlstm_backward, their fake
(meta) functions for torch.compile, autograd, and the functional ``convlstm``.

Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate
channels (i, f, g, o), H x W the frame, KH x KW the (odd) kernel. The schema is
documented in csrc/registration.cpp; the semantics, as a plain loop, in
seqkernels/reference/convlstm.py.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..reference.convlstm import convlstm_reference
from ._autograd import (
    call_backward_op, call_op, check_same_device, mark_saved_outputs, records_grad, reference_vjp, register_autograd,
    register_double_backward, vmap_fold, vmap_per_sample, vmap_unfold,
)

__all__ = ["convlstm", "release_step_graphs"]

_forward = torch.ops.seqkernels.convlstm_forward.default
_backward = torch.ops.seqkernels.convlstm_backward.default
_FORWARD_ARGS = [a.name for a in _forward._schema.arguments]


def release_step_graphs() -> None:
    """Frees the GPU memory that ConvLSTM and LSTM calls keep between calls, on every thread.

    On the GPU a ConvLSTM forward and backward replay each step's convolutions from a CUDA
    graph and keep the graph, with the buffers it reads and writes (the step weights, one step's
    states and gradients) and its results, for the next call of the same sizes (at most four
    forward and four backward sizes per thread and device, the least recently used dropped; a
    CUDA backward runs on autograd's device thread and keeps its graphs there). The LSTM's
    cuBLAS and fused-step loops replay their steps 16 at a time from a CUDA graph and keep it,
    with one step's state buffers (the cuBLAS loop) or the packed W_hh (the fused loop), per
    size (the cuBLAS loop: per layer and direction; at most 16 per thread and device). This drops
    them all, those of threads that have ended too, waiting for a call that is using them to
    end. A later call captures again. Nothing to do on the CPU, or in a build without CUDA."""
    release = getattr(torch.ops.seqkernels, "release_step_graphs", None)
    if release is not None:
        release()


def _fail(message: str) -> None:
    raise ValueError(f"seqkernels.convlstm: {message}")


def _check_tensor(t: Tensor, shape: tuple[int, ...], name: str, legend: str, like: Tensor) -> None:
    if tuple(t.shape) != shape:
        _fail(f"{name} must have shape {legend} = {shape}, got {tuple(t.shape)} (no broadcasting)")
    if t.dtype != like.dtype:
        _fail(f"{name} has dtype {t.dtype} but x has dtype {like.dtype}")
    if t.device != like.device:
        _fail(f"{name} is on {t.device} but x is on {like.device}")


def _frames_contiguous(x: Tensor) -> bool:
    """Every frame x[t, b] is one contiguous (Ci, H, W) block (the op reads any T, B strides)."""
    _, _, Ci, H, W = x.shape
    sizes_strides = ((Ci, x.stride(2), H * W), (H, x.stride(3), W), (W, x.stride(4), 1))
    return all(size == 1 or stride == want for size, stride, want in sizes_strides) and min(x.stride()) >= 0


def convlstm(
    x: Tensor,
    h0: Tensor | None,
    c0: Tensor | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
    peephole_weights: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One ConvLSTM layer over a whole sequence, 'same' zero padding, stride 1:

        z = conv2d(x_t, weight_ih) + bias_ih + conv2d(h_{t-1}, weight_hh) + bias_hh
        i = sigmoid(z_i + w_ci * c_{t-1}),  f = sigmoid(z_f + w_cf * c_{t-1}),  g = tanh(z_g)
        c_t = f * c_{t-1} + i * g,  o = sigmoid(z_o + w_co * c_t),  h_t = o * tanh(c_t)

    (the peephole terms only with ``peephole_weights``; gates in nn.LSTM's order i, f, g, o).

    Args:
        x: (T, B, Ci, H, W) input frames.
        h0, c0: (B, C, H, W) initial states, or None for zeros.
        weight_ih: (4C, Ci, KH, KW); weight_hh: (4C, C, KH, KW); KH and KW odd.
        bias_ih, bias_hh: (4C,) or None; both are added, as in nn.LSTM.
        peephole_weights: (w_ci, w_cf, w_co), each (C, H, W), or None.

    Returns:
        (output (T, B, C, H, W) = h_1 .. h_T, (h_T, c_T) each (B, C, H, W)), differentiable in
        every tensor argument. One dtype (float32, float64, bfloat16; float16 on the GPU) and
        one device for all tensors.
    """
    if x.dim() != 5:
        _fail(f"x must be 5-D (T, B, Ci, H, W), got shape {tuple(x.shape)}")
    if weight_hh.dim() != 4 or weight_hh.shape[0] != 4 * weight_hh.shape[1] or weight_hh.shape[1] < 1:
        _fail(f"weight_hh must be (4C, C, KH, KW), got shape {tuple(weight_hh.shape)}")
    T, B, Ci, H, W = x.shape
    G, C, KH, KW = weight_hh.shape
    if KH % 2 == 0 or KW % 2 == 0:
        _fail(f"kernel sizes must be odd for 'same' padding, got {KH} x {KW}")
    _check_tensor(weight_hh, (G, C, KH, KW), "weight_hh", "(4C, C, KH, KW)", x)
    _check_tensor(weight_ih, (G, Ci, KH, KW), "weight_ih", "(4C, Ci, KH, KW)", x)
    for name, b in (("bias_ih", bias_ih), ("bias_hh", bias_hh)):
        if b is not None:
            _check_tensor(b, (G,), name, "(4C,)", x)
    for name, s in (("h0", h0), ("c0", c0)):
        if s is not None:
            _check_tensor(s, (B, C, H, W), name, "(B, C, H, W)", x)
    peephole = None
    if peephole_weights is not None:
        if not isinstance(peephole_weights, (tuple, list)) or len(peephole_weights) != 3:
            _fail("peephole_weights must be a tuple (w_ci, w_cf, w_co)")
        for name, w in zip(("w_ci", "w_cf", "w_co"), peephole_weights):
            _check_tensor(w, (C, H, W), name, "(C, H, W)", x)
        peephole = torch.stack(tuple(peephole_weights))
    if h0 is None or c0 is None:  # one allocation and one fill for the zero states (~10 us of host time on a GPU)
        zeros = x.new_zeros(2, B, C, H, W)
        h0 = zeros[0] if h0 is None else h0
        c0 = zeros[1] if c0 is None else c0
    if T == 0 or B == 0 or Ci == 0 or H == 0 or W == 0:  # nothing to run: the state passes through
        return x.new_empty(T, B, C, H, W), (h0.clone(), c0.clone())
    if bias_ih is None or bias_hh is None:
        bias = bias_ih if bias_hh is None else bias_hh
    else:
        bias = bias_ih + bias_hh
    training = records_grad(x, h0, c0, weight_ih, weight_hh, bias, peephole)
    y, h_n, c_n, _, _ = call_op(
        _forward,
        training,
        x if _frames_contiguous(x) else x.contiguous(),  # batch-first input read in place
        h0.contiguous(),
        c0.contiguous(),
        weight_ih.contiguous(),
        weight_hh.contiguous(),
        None if bias is None else bias.contiguous(),
        None if peephole is None else peephole.contiguous(),
        training,
    )
    return y, (h_n, c_n)


@torch.library.register_fake("seqkernels::convlstm_forward")
def _convlstm_forward_fake(x, h0, c0, w_ih, w_hh, bias, peephole, training):
    torch._check(x.dim() == 5, lambda: "seqkernels.convlstm: x must be 5-D [T, B, Ci, H, W]")
    torch._check(w_hh.dim() == 4, lambda: "seqkernels.convlstm: w_hh must be 4-D [G, C, KH, KW]")
    check_same_device("seqkernels.convlstm", x, h0=h0, c0=c0, w_ih=w_ih, w_hh=w_hh, bias=bias, peephole=peephole)
    T, B, _, H, W = x.shape
    G, C = w_hh.shape[0], w_hh.shape[1]
    # Saved for backward in the kernels' channels-last layout: gates [T, B, H, W, G], cells [T, B, H, W, C].
    saved = (x.new_empty(T, B, H, W, G), x.new_empty(T, B, H, W, C)) if training else (x.new_empty(0), x.new_empty(0))
    return x.new_empty(T, B, C, H, W), x.new_empty(B, C, H, W), x.new_empty(B, C, H, W), *saved


@torch.library.register_vmap("seqkernels::convlstm_forward")
def _convlstm_forward_vmap(info, in_dims, x, h0, c0, w_ih, w_hh, bias, peephole, training):
    """torch.vmap over the forward op: V samples that share the weights run as one call of V·B
    sequences (vmap_fold into x's dimension 1 and the states' 0); per-sample weights take one
    call per sample."""
    V = info.batch_size
    args = (x, h0, c0, w_ih, w_hh, bias, peephole, training)
    if any(d is not None for d in in_dims[3:7]):
        return vmap_per_sample(_forward, V, in_dims, args)
    y, h_n, c_n, gates, cells = _forward(
        vmap_fold(x, in_dims[0], V, 1), vmap_fold(h0, in_dims[1], V, 0), vmap_fold(c0, in_dims[2], V, 0), w_ih, w_hh,
        bias, peephole, training,
    )
    outputs = (vmap_unfold(y, V, 1), vmap_unfold(h_n, V, 0), vmap_unfold(c_n, V, 0), vmap_unfold(gates, V, 1),
               vmap_unfold(cells, V, 1))
    return outputs, (0,) * 5


@torch.library.register_fake("seqkernels::convlstm_backward")
def _convlstm_backward_fake(grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, peephole, y, gates, cells, has_bias):
    G = w_hh.shape[0]
    # Contiguous, as the kernels return them (x itself may be a batch-first input's transpose).
    return (
        x.new_empty(x.shape),
        h0.new_empty(h0.shape),
        c0.new_empty(c0.shape),
        w_ih.new_empty(w_ih.shape),
        w_hh.new_empty(w_hh.shape),
        w_hh.new_empty(G if has_bias else 0),
        peephole.new_empty(peephole.shape) if peephole is not None else x.new_empty(0),
    )


def _setup_context(ctx, inputs, output):
    args = dict(zip(_FORWARD_ARGS, inputs))
    y, _, _, gates, cells = output
    if not args["training"]:
        ctx.inference_only = True  # backward raises: nothing was saved
        return
    ctx.inference_only = False
    ctx.has_bias = args["bias"] is not None
    ctx.has_peephole = args["peephole"] is not None
    # The bias only for a double backward (register_double_backward): the backward op does
    # not read it.
    ctx.save_for_backward(
        args["x"], args["h0"], args["c0"], args["w_ih"], args["w_hh"], args["peephole"], y, gates, cells, args["bias"]
    )
    mark_saved_outputs(ctx, gates, cells)


def _convlstm_backward(ctx, grad_y, grad_h_n, grad_c_n, _grad_gates, _grad_cells):
    if ctx.inference_only:
        raise RuntimeError(
            "seqkernels.convlstm: convlstm_forward ran with training=False and saved nothing for backward"
        )
    x, h0, c0, w_ih, w_hh, peephole, y, gates, cells, bias = ctx.saved_tensors
    dx, dh0, dc0, dw_ih, dw_hh, dbias, dpeephole = call_backward_op(
        _backward,
        # The gradients as autograd hands them over, expanded (stride 0) ones too: the kernels read
        # them one step at a time in their own strides, so a sum's gradient is never made dense.
        grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, peephole, y, gates, cells,
        ctx.has_bias,
        extra=(bias,),
    )
    # One gradient per convlstm_forward argument, in schema order.
    grads = {
        "x": dx, "h0": dh0, "c0": dc0, "w_ih": dw_ih, "w_hh": dw_hh,
        "bias": dbias if ctx.has_bias else None, "peephole": dpeephole if ctx.has_peephole else None,
        "training": None,
    }  # fmt: skip
    return tuple(grads[name] for name in _FORWARD_ARGS)


register_autograd(_forward, _convlstm_backward, _setup_context)


def _convlstm_layer_reference(x, h0, c0, w_ih, w_hh, bias, peephole):
    """convlstm_reference with the op's arguments (one bias, peephole [3, C, H, W]), returning
    the op's (y, h_n, c_n)."""
    peepholes = tuple(peephole.unbind(0)) if peephole is not None else None
    y, (h_n, c_n) = convlstm_reference(x, h0, c0, w_ih, w_hh, bias, None, peepholes)
    return y, h_n, c_n


def _convlstm_first_order(grad_y, grad_h_n, grad_c_n, x, h0, c0, w_ih, w_hh, peephole, y, gates, cells, has_bias,
                          bias):
    """convlstm_backward's outputs from the reference (register_double_backward): the
    reference recomputes y, gates and cells (y is read for its shape alone: a missing incoming
    gradient is zero)."""
    primals = {"x": x, "h0": h0, "c0": c0, "w_ih": w_ih, "w_hh": w_hh, "bias": bias, "peephole": peephole}
    cotangents = tuple(torch.zeros_like(like) if g is None else g
                       for g, like in ((grad_y, y), (grad_h_n, h0), (grad_c_n, c0)))
    grads = reference_vjp(_convlstm_layer_reference, primals, cotangents)
    # In the op's output order, with its empty outputs where there is no bias or peephole.
    return (grads["x"], grads["h0"], grads["c0"], grads["w_ih"], grads["w_hh"],
            grads["bias"] if has_bias else w_hh.new_empty(0),
            grads["peephole"] if peephole is not None else x.new_empty(0))


register_double_backward("seqkernels::convlstm_backward", _convlstm_first_order, ("y", "gates", "cells"))
