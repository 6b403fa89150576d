"""The LSTM layer op: torch.ops.seqkernels.lstm_forward / lstm_backward, their fake
(meta) functions for torch.compile, and autograd.

Shape legend: T steps, N = sum(batch_sizes) packed rows, B batch, I input, H hidden,
P projection, Hout = P or H, G = 4H. The schema and its documentation are in
csrc/registration.cpp.
"""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from ..reference.lstm import lstm_layer_reference
from ._autograd import (
    call_backward_op, call_op, check_same_device, dense_grads, mark_saved_outputs, records_grad, reference_vjp,
    register_autograd, register_double_backward, unwrap_dead_wrappers, vmap_fold, vmap_per_sample, vmap_unfold,
)

_forward = torch.ops.seqkernels.lstm_forward.default
_backward = torch.ops.seqkernels.lstm_backward.default
_infer = torch.ops.seqkernels.lstm_infer.default
_FORWARD_ARGS = [a.name for a in _forward._schema.arguments]


def _contiguous(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.contiguous()


def lstm_layer(
    x: Tensor,
    batch_sizes: Tensor,
    h0: Tensor,
    c0: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None = None,
    b_hh: Tensor | None = None,
    w_hr: Tensor | None = None,
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer in one direction over a packed sequence.

    x: [N, I] rows packed time-major (a PackedSequence's ``data``; a padded [T, B, I]
    input is ``x.reshape(T * B, I)`` with ``batch_sizes = full((T,), B)``);
    batch_sizes: [T] int64 on the CPU, non-increasing; h0: [B, Hout]; c0: [B, H].
    Returns y [N, Hout], h_n [B, Hout], c_n [B, H].
    """
    training = records_grad(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    y, h_n, c_n, _, _ = call_op(
        _forward,
        training,
        x.contiguous(),
        batch_sizes,
        h0.contiguous(),
        c0.contiguous(),
        w_ih.contiguous(),
        w_hh.contiguous(),
        _contiguous(b_ih),
        _contiguous(b_hh),
        _contiguous(w_hr),
        reverse,
        training,
    )
    return y, h_n, c_n


def lstm_infer(
    input: Tensor,
    h0: Tensor | None,
    c0: Tensor | None,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None,
    b_hh: Tensor | None,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """seqkernels.LSTM's common call in one operator, for calls autograd does not record (it
    raises where autograd would): one layer, one direction, no projection, input [T, B, I]
    ([B, T, I] if batch_first), h0 / c0 [1, B, H] or both None. Returns nn.LSTM's output
    [T, B, H] ([B, T, H]), h_n and c_n [1, B, H]. The same lstm_forward as lstm_layer, with its
    reshapes, views, zero state and batch sizes made in C++ (host time, which precedes a GPU
    call's launch); called below autograd, where the op has nothing to do."""
    with torch._C._AutoDispatchBelowAutograd():
        return _infer(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first)


def lstm_padded(
    input: Tensor,
    h0: Tensor | None,
    c0: Tensor | None,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None,
    b_hh: Tensor | None,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """lstm_infer's call where autograd records it: seqkernels.LSTM's common call (one layer, one
    direction, no projection, input [T, B, I] ([B, T, I] if batch_first), h0 / c0 [1, B, H] or both
    None) in an eager call outside torch.func transforms and torch.compile (which take lstm_layer).
    Returns nn.LSTM's output [T, B, H] ([B, T, H]), h_n and c_n [1, B, H].

    The same lstm_forward and lstm_backward calls as lstm_layer's, with the module's reshapes,
    views, zero state and batch sizes made inside one autograd node (_PaddedLayer) below autograd,
    where lstm_layer's path records five more nodes (the input's reshape, the state's selects, the
    output's view, h_n's and c_n's unsqueeze) around its own: host time that precedes the loop's
    launch on a GPU, and the backward's. A batch-first or otherwise non-contiguous input is first
    copied time-major, recorded (as lstm_layer's path's reshape copies it), so that the node saves
    that copy and not the caller's tensor."""
    seq = input.transpose(0, 1) if batch_first else input
    if not seq.is_contiguous():
        seq = seq.contiguous()
    return _PADDED_APPLY(*unwrap_dead_wrappers((seq, h0, c0, w_ih, w_hh, b_ih, b_hh)), batch_first)


class _PaddedLayer(torch.autograd.Function):
    """lstm_padded's node, on a contiguous time-major input seq [T, B, I]. Its outputs are made
    below ADInplaceOrView, so they are not views in autograd's sense and a caller may modify them
    in place, as it may lstm_layer's (a view made inside a Function may not be). Such aliases share
    no version counter with what they alias, so the node saves the tensors it reads as given (seq,
    h0, c0, its output), whose version counters catch an in-place change before backward, and
    remakes its views of them in backward (free); only the zero state, its own, is saved as made."""

    @staticmethod
    def forward(ctx, seq, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first):
        steps, batch, size = seq.shape
        with torch._C._AutoDispatchBelowADInplaceOrView():
            x = seq.view(steps * batch, size)  # [N, I]
            batch_sizes = torch.full((steps,), batch, dtype=torch.int64)
            if h0 is None:
                zeros = seq.new_zeros(2, batch, w_hh.shape[1])  # one allocation and fill for both
                h0_rows, c0_rows = zeros[0], zeros[1]
            else:
                h0_rows, c0_rows = h0[0].contiguous(), c0[0].contiguous()
            y, h_n, c_n, gates, cells = _forward(
                x, batch_sizes, h0_rows, c0_rows, w_ih.contiguous(), w_hh.contiguous(), _contiguous(b_ih),
                _contiguous(b_hh), None, False, True,
            )
            output = y.view(steps, batch, y.shape[1])
            if batch_first:
                output = output.transpose(0, 1)
            h_n, c_n = h_n.unsqueeze(0), c_n.unsqueeze(0)
        ctx.batch_first, ctx.batch_sizes = batch_first, batch_sizes
        ctx.has_bias, ctx.has_state = b_ih is not None, h0 is not None
        zero_state = (h0_rows, c0_rows) if h0 is None else (None, None)
        ctx.save_for_backward(seq, h0, c0, w_ih, w_hh, b_ih, b_hh, output, gates, cells, *zero_state)
        ctx.set_materialize_grads(False)
        return output, h_n, c_n

    @staticmethod
    def backward(ctx, grad_output, grad_h_n, grad_c_n):
        seq, h0, c0, w_ih, w_hh, b_ih, b_hh, output, gates, cells, h0_zero, c0_zero = ctx.saved_tensors
        # Under create_graph these views record, so that the gradients' own gradients reach seq, h0
        # and c0 (the double-backward formula of lstm_backward's Function).
        x = seq.view(-1, seq.shape[2])
        h0, c0 = (h0[0].contiguous(), c0[0].contiguous()) if ctx.has_state else (h0_zero, c0_zero)
        y = (output.transpose(0, 1) if ctx.batch_first else output).reshape(x.shape[0], -1)  # lstm_forward's y
        if grad_output is not None:
            grad_output = (grad_output.transpose(0, 1) if ctx.batch_first else grad_output).reshape(y.shape)
        dx, dh0, dc0, dw_ih, dw_hh, dbias, _ = call_backward_op(
            _backward,
            *dense_grads((grad_output, y), (None if grad_h_n is None else grad_h_n[0], h0),
                         (None if grad_c_n is None else grad_c_n[0], c0)),
            x, ctx.batch_sizes, h0, c0, w_ih.contiguous(), w_hh.contiguous(), None, y, gates, cells,
            False,
            ctx.has_bias,
            extra=(b_ih, b_hh),
        )
        db = dbias if ctx.has_bias else None
        dh0, dc0 = (dh0.unsqueeze(0), dc0.unsqueeze(0)) if ctx.has_state else (None, None)
        return dx.view(seq.shape), dh0, dc0, dw_ih, dw_hh, db, db, None


# _PaddedLayer.apply without autograd.Function.apply's Python (see _autograd._untransformed_apply):
# lstm_padded runs only outside torch.func transforms.
_PADDED_APPLY = super(torch.autograd.Function, _PaddedLayer).apply


@torch.library.register_fake("seqkernels::lstm_infer")
def _lstm_infer_fake(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first):
    torch._check(input.dim() == 3, lambda: "seqkernels.lstm_infer: input must be 3-D [T, B, I]")
    steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
    h = w_hh.shape[1]
    output = input.new_empty(steps, batch, h)
    return output.transpose(0, 1) if batch_first else output, input.new_empty(1, batch, h), input.new_empty(1, batch, h)


@torch.library.register_fake("seqkernels::lstm_forward")
def _lstm_forward_fake(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, training):
    torch._check(x.dim() == 2, lambda: "seqkernels.lstm: x must be 2-D [N, I]")
    check_same_device("seqkernels.lstm", x, h0=h0, c0=c0, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh, w_hr=w_hr)
    n, g, hout, b = x.shape[0], w_ih.shape[0], w_hh.shape[1], h0.shape[0]
    h = g // 4
    saved = n if training else 0
    return (
        x.new_empty(n, hout),
        h0.new_empty(b, hout),
        c0.new_empty(b, h),
        x.new_empty(saved, g),
        x.new_empty(saved, h),
    )


@torch.library.register_fake("seqkernels::lstm_backward")
def _lstm_backward_fake(
    grad_y, grad_h_n, grad_c_n, x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, reverse, has_bias
):
    g = w_ih.shape[0]
    return (
        torch.empty_like(x),
        torch.empty_like(h0),
        torch.empty_like(c0),
        torch.empty_like(w_ih),
        torch.empty_like(w_hh),
        w_ih.new_empty(g if has_bias else 0),
        torch.empty_like(w_hr) if w_hr is not None else w_ih.new_empty(0, 0),
    )


@torch.library.register_vmap("seqkernels::lstm_forward")
def _lstm_forward_vmap(info, in_dims, x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, training):
    """torch.vmap over the forward op: V samples that share the weights and batch_sizes run as
    one call of V·B sequences (vmap_fold: row n of sample v at n·V + v, which keeps the packed
    layout, as every sample has the same batch_sizes). Batched weights or batch_sizes
    (per-sample models) take one call per sample."""
    V = info.batch_size
    args = (x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, training)
    if any(d is not None for d in (in_dims[1],) + tuple(in_dims[4:9])):
        return vmap_per_sample(_forward, V, in_dims, args)
    outputs = _forward(
        vmap_fold(x, in_dims[0], V, 0), batch_sizes * V, vmap_fold(h0, in_dims[2], V, 0),
        vmap_fold(c0, in_dims[3], V, 0), w_ih, w_hh, b_ih, b_hh, w_hr, reverse, training,
    )
    return tuple(vmap_unfold(t, V, 0) for t in outputs), (0,) * 5


def _setup_context(ctx, inputs, output):
    args = dict(zip(_FORWARD_ARGS, inputs))
    y, _, _, gates, cells = output
    ctx.has_bias = args["b_ih"] is not None
    ctx.has_proj = args["w_hr"] is not None
    ctx.reverse = args["reverse"]
    # The biases only for a double backward (register_double_backward): the backward op
    # does not read them.
    ctx.save_for_backward(
        args["x"], args["batch_sizes"], args["h0"], args["c0"], args["w_ih"], args["w_hh"], args["w_hr"],
        y, gates, cells, args["b_ih"], args["b_hh"],
    )
    mark_saved_outputs(ctx, gates, cells)


def _lstm_backward(ctx, grad_y, grad_h_n, grad_c_n, _grad_gates, _grad_cells):
    x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, b_ih, b_hh = ctx.saved_tensors
    dx, dh0, dc0, dw_ih, dw_hh, dbias, dw_hr = call_backward_op(
        _backward,
        *dense_grads((grad_y, y), (grad_h_n, h0), (grad_c_n, c0)),
        x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells,
        ctx.reverse,
        ctx.has_bias,
        extra=(b_ih, b_hh),
    )
    db = dbias if ctx.has_bias else None
    # One gradient per lstm_forward argument, in schema order.
    grads = {
        "x": dx, "batch_sizes": None, "h0": dh0, "c0": dc0, "w_ih": dw_ih, "w_hh": dw_hh,
        "b_ih": db, "b_hh": db, "w_hr": dw_hr if ctx.has_proj else None, "reverse": None, "training": None,
    }
    return tuple(grads[name] for name in _FORWARD_ARGS)


register_autograd(_forward, _lstm_backward, _setup_context)


def _lstm_first_order(grad_y, grad_h_n, grad_c_n, x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, reverse,
                      has_bias, b_ih, b_hh):
    """lstm_backward's outputs from the reference (register_double_backward): y, gates and
    cells are not read, the reference recomputes them."""
    primals = {"x": x, "h0": h0, "c0": c0, "w_ih": w_ih, "w_hh": w_hh, "b_ih": b_ih, "b_hh": b_hh, "w_hr": w_hr}
    layer = functools.partial(lstm_layer_reference, batch_sizes=batch_sizes, reverse=reverse)
    grads = reference_vjp(layer, primals, (grad_y, grad_h_n, grad_c_n))
    # In the op's output order, with its empty outputs where there is no bias or projection.
    return (grads["x"], grads["h0"], grads["c0"], grads["w_ih"], grads["w_hh"],
            grads["b_ih"] if has_bias else w_ih.new_empty(0),
            grads["w_hr"] if w_hr is not None else w_ih.new_empty(0, 0))


register_double_backward("seqkernels::lstm_backward", _lstm_first_order, ("y", "gates", "cells"))
