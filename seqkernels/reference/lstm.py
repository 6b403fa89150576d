"""Pure-PyTorch LSTM references: a plain loop over time, the ground truth of the tests.

Nothing here is fast and nothing here calls seqkernels' native ops, so these functions
differentiate with ordinary autograd and run in any dtype (run them in float64 for a
reference, in bfloat16/float16 to measure what plain low-precision arithmetic loses).

Shape legend: T steps, B batch (= batch_sizes[0]), I input features, H hidden,
P projection (proj_size), Hout = P if projecting else H, G = 4H gate rows (i, f, g, o),
N = sum(batch_sizes) packed rows, L layers, D directions (1 or 2).

Packed layout (PackedSequence.data): rows are time-major; step t owns the
batch_sizes[t] rows starting at sum(batch_sizes[:t]), and those rows belong to the
sequences 0 .. batch_sizes[t] - 1 (sequences sorted by decreasing length). A padded
[T, B, I] input is the packed input x.reshape(T * B, I) with batch_sizes = [B] * T.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["lstm_cell_reference", "lstm_layer_reference", "lstm_reference"]


def lstm_cell_reference(
    x: Tensor,
    h: Tensor,
    c: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor | None = None,
    b_hh: Tensor | None = None,
    w_hr: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One LSTM step for a batch of rows (nn.LSTMCell's math, plus the projection).

    x [b, I], h [b, Hout], c [b, H], w_ih [G, I], w_hh [G, Hout], b_ih/b_hh [G] or None,
    w_hr [P, H] or None. Returns (h' [b, Hout], c' [b, H]):

        i, f, g, o = split(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh, H)
        c' = σ(f) c + σ(i) tanh(g)
        h' = (σ(o) tanh(c')) W_hrᵀ        (without W_hr: h' = σ(o) tanh(c'))
    """
    pre = x @ w_ih.t() + h @ w_hh.t()
    if b_ih is not None:
        pre = pre + b_ih
    if b_hh is not None:
        pre = pre + b_hh
    i, f, g, o = pre.chunk(4, dim=1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h_new = torch.sigmoid(o) * torch.tanh(c_new)
    if w_hr is not None:
        h_new = h_new @ w_hr.t()
    return h_new, c_new


def lstm_layer_reference(
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
    """One LSTM layer in one direction over a packed sequence: seqkernels.lstm_layer's
    contract, written as a loop over time.

    x [N, I] packed rows; batch_sizes [T] int64 (CPU), non-increasing; h0 [B, Hout];
    c0 [B, H]; weights as in nn.LSTM. reverse=True runs every sequence backwards in
    time, each starting at its own last element from its h0/c0 row (cuDNN's and
    nn.LSTM's second direction).

    Returns y [N, Hout] (packed like x), h_n [B, Hout], c_n [B, H]: the state of every
    sequence after its last processed step (its last element going forward, its first
    element in reverse).
    """
    sizes = [int(b) for b in batch_sizes.tolist()]
    offsets = [0]
    for b in sizes:
        offsets.append(offsets[-1] + b)
    if offsets[-1] != x.shape[0]:
        raise ValueError(f"batch_sizes sum to {offsets[-1]} but x has {x.shape[0]} rows")

    # h and c hold the state of all B sequences. A step only advances the sequences
    # still active at that step (the first batch_sizes[t]); the others keep their state:
    # going forward, that is the state after their last element (so h_n is right);
    # in reverse, that is h0/c0 until their last element comes up.
    h, c = h0, c0
    ys: list[Tensor | None] = [None] * len(sizes)
    steps = range(len(sizes) - 1, -1, -1) if reverse else range(len(sizes))
    for t in steps:
        b = sizes[t]
        x_t = x[offsets[t] : offsets[t + 1]]
        h_t, c_t = lstm_cell_reference(x_t, h[:b], c[:b], w_ih, w_hh, b_ih, b_hh, w_hr)
        ys[t] = h_t
        # torch.cat, not in-place writes: keeps autograd simple and readable.
        h = torch.cat([h_t, h[b:]], dim=0)
        c = torch.cat([c_t, c[b:]], dim=0)
    y = torch.cat(ys, dim=0) if ys else x.new_empty(0, h0.shape[1])
    return y, h, c


def lstm_reference(
    input: Tensor,
    hx: tuple[Tensor, Tensor] | None,
    params: Sequence[Tensor],
    *,
    num_layers: int = 1,
    bidirectional: bool = False,
    batch_first: bool = False,
    has_biases: bool = True,
    proj_size: int = 0,
    batch_sizes: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """A multi-layer (bidirectional) LSTM without dropout, stacked from
    lstm_layer_reference: nn.LSTM's forward in eval mode.

    input: padded [T, B, I] ([B, T, I] if batch_first), or packed rows [N, I] when
    batch_sizes [T] is given (a PackedSequence's data; sort/unsort it yourself).
    hx: (h0 [L*D, B, Hout], c0 [L*D, B, H]) or None for zeros.
    params: the flat weights in nn.LSTM's order (its ``_flat_weights``): per layer and
    direction w_ih [G, I or D*Hout], w_hh [G, Hout], then b_ih, b_hh [G] if has_biases,
    then w_hr [P, H] if proj_size > 0.

    Returns (output, (h_n [L*D, B, Hout], c_n [L*D, B, H])); output is [T, B, D*Hout]
    ([B, T, D*Hout] if batch_first) or packed [N, D*Hout].
    """
    num_directions = 2 if bidirectional else 1
    per_layer = 2 + (2 if has_biases else 0) + (1 if proj_size > 0 else 0)
    if len(params) != per_layer * num_layers * num_directions:
        raise ValueError(f"expected {per_layer * num_layers * num_directions} parameters, got {len(params)}")
    hidden_size = params[1].shape[1] if proj_size == 0 else params[per_layer - 1].shape[1]
    real_hidden = proj_size if proj_size > 0 else hidden_size

    packed = batch_sizes is not None
    if packed:
        x = input
        batch = int(batch_sizes[0])
    else:
        seq = input.transpose(0, 1) if batch_first else input  # [T, B, I]
        steps, batch = seq.shape[0], seq.shape[1]
        x = seq.reshape(steps * batch, seq.shape[2])
        batch_sizes = torch.full((steps,), batch, dtype=torch.int64)

    if hx is None:
        h0 = input.new_zeros(num_layers * num_directions, batch, real_hidden)
        c0 = input.new_zeros(num_layers * num_directions, batch, hidden_size)
    else:
        h0, c0 = hx

    h_n, c_n = [], []
    layer_input = x
    for layer in range(num_layers):
        outputs = []
        for direction in range(num_directions):
            k = layer * num_directions + direction
            w = list(params[k * per_layer : (k + 1) * per_layer])
            w_ih, w_hh = w[0], w[1]
            b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
            w_hr = w[-1] if proj_size > 0 else None
            y, h, c = lstm_layer_reference(
                layer_input, batch_sizes, h0[k], c0[k], w_ih, w_hh, b_ih, b_hh, w_hr, reverse=direction == 1
            )
            outputs.append(y)
            h_n.append(h)
            c_n.append(c)
        layer_input = torch.cat(outputs, dim=1)

    output = layer_input
    if not packed:
        output = output.reshape(steps, batch, -1)
        if batch_first:
            output = output.transpose(0, 1)
    return output, (torch.stack(h_n, 0), torch.stack(c_n, 0))
