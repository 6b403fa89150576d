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
    register_autograd, register_double_backward, transformed, unwrap_dead_wrappers, vmap_fold, vmap_per_sample,
    vmap_unfold,
)

_forward = torch.ops.seqkernels.lstm_forward.default
_backward = torch.ops.seqkernels.lstm_backward.default
_infer = torch.ops.seqkernels.lstm_infer.default
_padded = torch.ops.seqkernels.lstm_padded.default
_layer = torch.ops.seqkernels.lstm_layer.default
_cell = torch.ops.seqkernels.lstm_cell.default
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

    Where autograd records an eager call outside torch.func transforms, this is the lstm_layer
    operator, whose autograd node is C++ (csrc/lstm_recorded.cpp): the same lstm_forward and
    lstm_backward calls as lstm_forward's autograd.Function (which torch.compile and the transforms
    take), without Python in the node's forward or backward (host time before a GPU's forward and
    backward loops).
    """
    training = records_grad(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)
    if training and not torch.compiler.is_compiling() and not transformed():
        return _layer(*unwrap_dead_wrappers((x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr)), reverse)
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
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """seqkernels.LSTM's common call in one operator, for calls autograd does not record (it
    raises where autograd would): one layer and direction of a stack without projection, input
    [T, B, I] ([B, T, I] if batch_first), h0 / c0 [1, B, H] or both None; reverse runs from the
    last step to the first (a bidirectional layer's second direction). Returns nn.LSTM's output
    [T, B, H] ([B, T, H]), h_n and c_n [1, B, H]. The same lstm_forward as lstm_layer, with its
    reshapes, views, zero state and batch sizes made in C++ (host time, which precedes a GPU
    call's launch); called below autograd, where the op has nothing to do."""
    with torch._C._AutoDispatchBelowAutograd():
        return _infer(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse)


def lstm_padded(
    input: Tensor,
    h0: Tensor | None,
    c0: Tensor | None,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None,
    b_hh: Tensor | None,
    batch_first: bool,
    reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """lstm_infer's call where autograd records it: seqkernels.LSTM's common call (one layer and
    direction of a stack without projection, input [T, B, I] ([B, T, I] if batch_first), h0 / c0
    [1, B, H] or both None; reverse from the last step to the first) in an eager call outside
    torch.func transforms and torch.compile (which take lstm_layer). Returns nn.LSTM's output
    [T, B, H] ([B, T, H]), h_n and c_n [1, B, H].

    The lstm_padded operator, whose autograd node is C++ (csrc/lstm_recorded.cpp): the same
    lstm_forward and lstm_backward calls as lstm_layer's path, with the module's reshapes, views,
    zero state and batch sizes made inside the node below autograd, where lstm_layer's path records
    five more nodes around its own, and without Python in the node's forward or backward: host
    time that precedes the loop's launch on a GPU, and the backward loop's. A batch-first or
    otherwise non-contiguous input is first copied time-major, recorded (as lstm_layer's path's
    reshape copies it), so that the node saves that copy and not the caller's tensor. Under
    create_graph the node's backward calls lstm_backward through its autograd.Function
    (lstm_backward_recorded, below), which records the double-backward formula."""
    return _padded(*unwrap_dead_wrappers((input, h0, c0, w_ih, w_hh, b_ih, b_hh)), batch_first, reverse)


def lstm_cell(
    input: Tensor,
    h0: Tensor | None,
    c0: Tensor | None,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None,
    b_hh: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """One LSTMCell step in an eager call outside torch.func transforms and torch.compile (which take
    lstm_layer): input [B, I], h0 / c0 [B, H] or both None. Returns nn.LSTMCell's h and c [B, H].
    The lstm_cell operator: where autograd records, its C++ autograd node (csrc/lstm_recorded.cpp)
    with the same lstm_forward / lstm_backward calls as lstm_layer's step, the zero state and batch
    sizes made below autograd inside it; else called below autograd, where its autograd kernel would
    have nothing to do (one lstm_forward call: 9-11 us less a step than lstm_infer with its views, on
    a 2-core x86 host)."""
    if records_grad(input, h0, c0, w_ih, w_hh, b_ih, b_hh):
        return _cell(*unwrap_dead_wrappers((input, h0, c0, w_ih, w_hh, b_ih, b_hh)))
    with torch._C._AutoDispatchBelowAutograd():
        return _cell(input, h0, c0, w_ih, w_hh, b_ih, b_hh)


@torch.library.register_fake("seqkernels::lstm_cell")
def _lstm_cell_fake(input, h0, c0, w_ih, w_hh, b_ih, b_hh):
    torch._check(input.dim() == 2, lambda: "seqkernels.lstm_cell: input must be 2-D [B, I]")
    h = w_hh.shape[1]
    return input.new_empty(input.shape[0], h), input.new_empty(input.shape[0], h)


@torch.library.impl("seqkernels::lstm_backward_recorded", "CompositeImplicitAutograd")
def _lstm_backward_recorded(
    grad_y, grad_h_n, grad_c_n, x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, reverse, has_bias, b_ih,
    b_hh,
):
    """lstm_backward as the double backward records it (create_graph=True): through its
    autograd.Function (register_double_backward), given the biases its formula reads. The C++ nodes
    of lstm_layer, lstm_padded and lstm_cell (csrc/lstm_recorded.cpp, layer_backward) call this where
    grad mode is on in their backward."""
    return call_backward_op(
        _backward, grad_y, grad_h_n, grad_c_n, x, batch_sizes, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, reverse,
        has_bias, extra=(b_ih, b_hh),
    )


def _padded_call_fake(label: str):
    """The fake function of lstm_infer and lstm_padded (the same arguments and outputs); ``label``
    names the op in its message, as the kernels do."""

    def fake(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse=False):
        torch._check(input.dim() == 3, lambda: f"{label}: input must be 3-D [T, B, I]")
        steps, batch = (input.shape[1], input.shape[0]) if batch_first else (input.shape[0], input.shape[1])
        h = w_hh.shape[1]
        output = input.new_empty(steps, batch, h)
        state = (input.new_empty(1, batch, h), input.new_empty(1, batch, h))
        return (output.transpose(0, 1) if batch_first else output), *state

    return fake


@torch.library.register_fake("seqkernels::lstm_layer")
def _lstm_layer_fake(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    y, h_n, c_n, _, _ = _lstm_forward_fake(x, batch_sizes, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse, False)
    return y, h_n, c_n


torch.library.register_fake("seqkernels::lstm_infer")(_padded_call_fake("seqkernels.lstm_infer"))
torch.library.register_fake("seqkernels::lstm_padded")(_padded_call_fake("seqkernels.lstm_padded"))


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
