"""Pure-PyTorch reference of the ConvLSTM: a plain loop over time with one ``F.conv2d`` per
input and per step, the ground truth of the tests. It calls no seqkernels op,
differentiates with ordinary autograd and runs in any dtype.

Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate
channels (order i, f, g, o: nn.LSTM's), H, W spatial height/width (H is not the hidden
size here), KH, KW kernel height/width (odd), L layers.

One layer, conv = ``F.conv2d`` with zero 'same' padding (KH // 2, KW // 2), stride 1:

    z_t = conv(x_t, w_ih) + b_ih + conv(h_{t-1}, w_hh) + b_hh        [B, G, H, W]
    zi, zf, zg, zo = z_t.chunk(4, dim=1)
    i = σ(zi + w_ci ⊙ c_{t-1}),  f = σ(zf + w_cf ⊙ c_{t-1}),  g = tanh(zg)
    c_t = f ⊙ c_{t-1} + i ⊙ g
    o = σ(zo + w_co ⊙ c_t)
    h_t = o ⊙ tanh(c_t)

The peephole terms (w_ci, w_cf, w_co [C, H, W], broadcast over B) exist only when
peephole weights are given.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["convlstm_reference", "convlstm_module_reference"]


def convlstm_reference(
    x: Tensor,
    h0: Tensor | None,
    c0: Tensor | None,
    weight_ih: Tensor,
    weight_hh: Tensor,
    bias_ih: Tensor | None = None,
    bias_hh: Tensor | None = None,
    peephole_weights: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One ConvLSTM layer: seqkernels.convlstm's contract, written as a loop over time.

    x [T, B, Ci, H, W]; h0, c0 [B, C, H, W] or None (zeros); weight_ih [G, Ci, KH, KW];
    weight_hh [G, C, KH, KW]; bias_ih, bias_hh [G] or None; peephole_weights
    (w_ci, w_cf, w_co), each [C, H, W], or None.
    Returns (output [T, B, C, H, W] = h_1 .. h_T, (h_T [B, C, H, W], c_T [B, C, H, W])).
    """
    _, B, _, H, W = x.shape
    C = weight_hh.shape[1]
    KH, KW = weight_hh.shape[-2:]
    padding = (KH // 2, KW // 2)
    h = x.new_zeros(B, C, H, W) if h0 is None else h0
    c = x.new_zeros(B, C, H, W) if c0 is None else c0
    outputs = []
    for x_t in x.unbind(0):  # unbind, not x[t]: its backward is one stack, not T full-size zeros
        z = F.conv2d(x_t, weight_ih, bias_ih, padding=padding) + F.conv2d(h, weight_hh, bias_hh, padding=padding)
        zi, zf, zg, zo = z.chunk(4, dim=1)
        if peephole_weights is not None:
            w_ci, w_cf, w_co = peephole_weights
            zi = zi + w_ci * c
            zf = zf + w_cf * c
        c = torch.sigmoid(zf) * c + torch.sigmoid(zi) * torch.tanh(zg)
        if peephole_weights is not None:
            zo = zo + w_co * c  # the output gate peeks at the new cell state
        h = torch.sigmoid(zo) * torch.tanh(c)
        outputs.append(h)
    if not outputs:  # T = 0: no step, the state passes through
        return x.new_empty(0, B, C, H, W), (h, c)
    return torch.stack(outputs, dim=0), (h, c)


def convlstm_module_reference(
    module: torch.nn.Module, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """A seqkernels.ConvLSTM's forward, computed with convlstm_reference layer by layer from
    the module's parameters (looked up by name: weight_ih_l{k}, weight_hh_l{k},
    bias_ih_l{k}, bias_hh_l{k}, weight_ci_l{k}, weight_cf_l{k}, weight_co_l{k}).

    input [T, B, Ci, H, W] ([B, T, Ci, H, W] if module.batch_first); hx = (h0, c0), each
    [L, B, C, H, W], or None (zeros). Returns (output [T, B, C, H, W] (or [B, T, ...]) of
    the last layer, (h_n [L, B, C, H, W], c_n [L, B, C, H, W])), like module.forward.
    """
    params = dict(module.named_parameters())
    x = input.transpose(0, 1) if module.batch_first else input
    h_n, c_n = [], []
    for k in range(module.num_layers):
        peephole = None
        if f"weight_ci_l{k}" in params:
            peephole = (params[f"weight_ci_l{k}"], params[f"weight_cf_l{k}"], params[f"weight_co_l{k}"])
        x, (h, c) = convlstm_reference(
            x,
            None if hx is None else hx[0][k],
            None if hx is None else hx[1][k],
            params[f"weight_ih_l{k}"],
            params[f"weight_hh_l{k}"],
            params.get(f"bias_ih_l{k}"),
            params.get(f"bias_hh_l{k}"),
            peephole,
        )
        h_n.append(h)
        c_n.append(c)
    output = x.transpose(0, 1) if module.batch_first else x
    return output, (torch.stack(h_n, dim=0), torch.stack(c_n, dim=0))
