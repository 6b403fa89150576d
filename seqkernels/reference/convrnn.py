"""Pure-PyTorch reference of the circulant ("wave") ConvRNN: a plain loop over time, the
ground truth of the tests. It calls no seqkernels op, differentiates with ordinary
autograd and runs in any dtype.

Shape legend: B batch, T steps, C channels, N ring size, K kernel width.

    h_t = act(x_t + conv(h_{t-1}) + bias)          t = 1 .. T

where conv is ``F.conv1d`` (a cross-correlation, C -> C channels, no bias) of h padded with
K // 2 values on the left and K - 1 - K // 2 on the right, so that the ring keeps its N
units for every K, even or odd; the padding wraps around the ring ("circular") or is zeros
("zeros"), and act is tanh or relu.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["convrnn_reference", "convrnn_template_reference"]

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


def convrnn_reference(
    x: Tensor,
    weight: Tensor,
    h0: Tensor | None = None,
    bias: Tensor | None = None,
    padding_mode: str = "circular",
    nonlinearity: str = "tanh",
) -> tuple[Tensor, Tensor]:
    """x [B, T, C, N], weight [C, C, K] (out, in, k), h0 [B, C, N] or None (zeros),
    bias [C] or None. Returns (y [B, T, C, N] = h_1 .. h_T, h_T [B, C, N])."""
    B, _, C, N = x.shape
    K = weight.shape[-1]
    left, right = K // 2, K - 1 - K // 2
    act = _ACTIVATIONS[nonlinearity]
    h = x.new_zeros(B, C, N) if h0 is None else h0
    ys = []
    mode = "circular" if padding_mode == "circular" else "constant"
    for x_t in x.unbind(1):  # unbind, not x[:, t]: its backward is one stack, not T full-size zeros
        hp = F.pad(h, (left, right), mode=mode)
        h = act(x_t + F.conv1d(hp, weight, bias))
        ys.append(h)
    return torch.stack(ys, dim=1), h


def convrnn_template_reference(x: Tensor, kernel: Tensor, hidden: Tensor) -> Tensor:
    """The extension template's ``convrnn_forward`` semantics, written out directly:
    x [B, T, N], kernel [1, 1, K], hidden [B, 1, N] or [B, N]. Returns y [B, T + 1, N] with
    y[:, 0] = h0 and y[:, t + 1] = tanh(x[:, t] + conv(y[:, t])), conv the circularly padded
    single-channel cross-correlation."""
    h = hidden.reshape(hidden.shape[0], 1, hidden.shape[-1])
    K = kernel.shape[-1]
    ys = [h[:, 0]]
    for x_t in x.unbind(1):
        hp = F.pad(h, (K // 2, K - 1 - K // 2), mode="circular")
        h = torch.tanh(x_t.unsqueeze(1) + F.conv1d(hp, kernel))
        ys.append(h[:, 0])
    return torch.stack(ys, dim=1)
