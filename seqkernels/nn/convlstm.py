"""nn.Module wrapper of the convolutional LSTM: seqkernels.ConvLSTM.

Shape legend: T steps, B batch, Ci input channels, C hidden channels, G = 4C gate channels
(i, f, g, o, nn.LSTM's order), H, W spatial height and width, KH, KW kernel height and
width (odd), L layers.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..ops.convlstm import convlstm

__all__ = ["ConvLSTM"]


def _pair(value, name: str) -> tuple[int, int]:
    """An int or a pair of ints as a pair of positive ints (ValueError otherwise)."""
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = tuple(value)
    else:
        raise ValueError(f"ConvLSTM: {name} must be an int or a pair of ints, got {value!r}")
    for v in pair:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"ConvLSTM: {name} must hold positive ints, got {value!r}")
    return pair  # type: ignore[return-value]


class ConvLSTM(nn.Module):
    """A multi-layer convolutional LSTM (Shi et al., 2015), each layer's whole sequence in
    one fused seqkernels op (``seqkernels.convlstm``):

        z_t = conv(x_t, weight_ih) + bias_ih + conv(h_{t-1}, weight_hh) + bias_hh
        i = sigmoid(z_i + w_ci * c_{t-1}),  f = sigmoid(z_f + w_cf * c_{t-1}),  g = tanh(z_g)
        c_t = f * c_{t-1} + i * g
        o = sigmoid(z_o + w_co * c_t),  h_t = o * tanh(c_t)

    where conv is ``torch.nn.functional.conv2d`` (cross-correlation, stride 1, zero
    'same' padding (KH // 2, KW // 2), so every state keeps the input's H x W), z_t
    [B, G, H, W] splits into the gates i, f, g, o (nn.LSTM's order) along the channels,
    and the peephole terms (``w_c*`` [C, H, W], broadcast over the batch) are present
    only with ``peephole=True``. Layer k > 0 reads layer k - 1's hidden states.

    Parameters of layer k, registered in this order: ``weight_ih_l{k}`` [G, Cin_k, KH, KW]
    (Cin_0 = Ci, Cin_k = C for k > 0), ``weight_hh_l{k}`` [G, C, KH, KW], ``bias_ih_l{k}``
    and ``bias_hh_l{k}`` [G] (if ``bias``), ``weight_ci_l{k}``, ``weight_cf_l{k}``,
    ``weight_co_l{k}`` [C, H, W] (if ``peephole``). No buffers. Every parameter is
    initialised ~ ``U(-1/sqrt(C*KH*KW), 1/sqrt(C*KH*KW))``, as nn.LSTM uses
    ``1/sqrt(hidden_size)``.

    ``forward(input, hx=None) -> (output, (h_n, c_n))``, see ``forward`` below. Dtypes:
    float32, float64, bfloat16 and float16 (as the op supports them); input, states and
    parameters share one dtype and one device. There is no dropout between layers.

    :param input_channels: Ci, channels of the input.
    :param hidden_channels: C, channels of the hidden and cell states.
    :param kernel_size: (KH, KW), an int or a pair of ints, both odd.
    :param num_layers: L, stacked layers.
    :param bias: learn ``bias_ih_l{k}`` and ``bias_hh_l{k}`` [G].
    :param batch_first: input and output are [B, T, ...] (else [T, B, ...]); h_0/c_0 and
        h_n/c_n are [L, B, C, H, W] either way.
    :param peephole: learn peephole weights ``weight_ci_l{k}``, ``weight_cf_l{k}``,
        ``weight_co_l{k}`` [C, H, W]; needs ``spatial_size``.
    :param spatial_size: (H, W), an int or a pair of ints; required with ``peephole``,
        whose weights have this size, and then every input must have it. Without
        ``peephole`` it is only recorded.
    :param device: of the parameters.
    :param dtype: of the parameters.
    :raises ValueError: for non-positive sizes, an even kernel size, a kernel_size or
        spatial_size that is not an int or a pair of ints, or ``peephole`` without
        ``spatial_size``.
    """

    def __init__(
        self,
        input_channels: int,
        hidden_channels: int,
        kernel_size: int | tuple[int, int],
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        peephole: bool = False,
        spatial_size: int | tuple[int, int] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        for name, value in (
            ("input_channels", input_channels),
            ("hidden_channels", hidden_channels),
            ("num_layers", num_layers),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ConvLSTM: {name} must be a positive int, got {value!r}")
        kernel = _pair(kernel_size, "kernel_size")
        if kernel[0] % 2 == 0 or kernel[1] % 2 == 0:
            # 'same' zero padding of K // 2 on both sides keeps H x W only for odd K.
            raise ValueError(f"ConvLSTM: kernel_size must be odd, got {kernel_size!r}")
        spatial = None if spatial_size is None else _pair(spatial_size, "spatial_size")
        if peephole and spatial is None:
            raise ValueError("ConvLSTM: peephole=True needs spatial_size (H, W): the peephole weights are [C, H, W]")
        factory = {"device": device, "dtype": dtype}
        self.input_channels = input_channels
        self.hidden_channels = hidden_channels
        self.kernel_size = kernel
        self.num_layers = num_layers
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.peephole = bool(peephole)
        self.spatial_size = spatial
        G, C, (KH, KW) = 4 * hidden_channels, hidden_channels, kernel
        for k in range(num_layers):
            cin = input_channels if k == 0 else hidden_channels
            # Registration order is the spec's (and nn.LSTM's): state_dicts list it.
            self.register_parameter(f"weight_ih_l{k}", nn.Parameter(torch.empty(G, cin, KH, KW, **factory)))
            self.register_parameter(f"weight_hh_l{k}", nn.Parameter(torch.empty(G, C, KH, KW, **factory)))
            if self.bias:
                self.register_parameter(f"bias_ih_l{k}", nn.Parameter(torch.empty(G, **factory)))
                self.register_parameter(f"bias_hh_l{k}", nn.Parameter(torch.empty(G, **factory)))
            if self.peephole:
                for gate in ("ci", "cf", "co"):
                    self.register_parameter(
                        f"weight_{gate}_l{k}", nn.Parameter(torch.empty(C, *spatial, **factory))  # type: ignore[misc]
                    )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise every parameter ~ ``U(-1/sqrt(C*KH*KW), 1/sqrt(C*KH*KW))``, the fan-in
        of the recurrent convolution (nn.LSTM's ``1/sqrt(hidden_size)`` for a convolution)."""
        KH, KW = self.kernel_size
        bound = 1.0 / math.sqrt(self.hidden_channels * KH * KW)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def _layer_weights(self, k: int):
        """Layer k's (w_ih, w_hh, b_ih, b_hh, peephole weights or None), read by name so that
        functional_call and reparametrisations are honoured."""
        w_ih = getattr(self, f"weight_ih_l{k}")
        w_hh = getattr(self, f"weight_hh_l{k}")
        b_ih = getattr(self, f"bias_ih_l{k}") if self.bias else None
        b_hh = getattr(self, f"bias_hh_l{k}") if self.bias else None
        peep = None
        if self.peephole:
            peep = tuple(getattr(self, f"weight_{gate}_l{k}") for gate in ("ci", "cf", "co"))
        return w_ih, w_hh, b_ih, b_hh, peep

    def _check_input(self, input: Tensor) -> None:
        if not isinstance(input, Tensor):
            raise TypeError(f"ConvLSTM: input must be a Tensor, got {type(input).__name__}")
        layout = "[B, T, Ci, H, W]" if self.batch_first else "[T, B, Ci, H, W]"
        if input.dim() != 5:
            raise ValueError(f"ConvLSTM: input must be 5-D {layout}, got shape {tuple(input.shape)}")
        if input.size(2) != self.input_channels:
            raise ValueError(
                f"ConvLSTM: input must have Ci = {self.input_channels} channels (dim 2 of {layout}), "
                f"got shape {tuple(input.shape)}"
            )
        if self.peephole and tuple(input.shape[3:]) != self.spatial_size:
            raise ValueError(
                f"ConvLSTM: with peephole=True the input's spatial size (H, W) must be spatial_size = "
                f"{self.spatial_size}, got {tuple(input.shape[3:])}"
            )
        w = self.weight_ih_l0
        if input.dtype != w.dtype or input.device != w.device:
            raise ValueError(
                f"ConvLSTM: input ({input.dtype}, {input.device}) must have the parameters' dtype and device "
                f"({w.dtype}, {w.device}); convert the input (input.to(...)) or the module (module.to(...))"
            )

    def _check_hx(self, hx, input: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        if not isinstance(hx, (tuple, list)):
            raise TypeError(f"ConvLSTM: hx must be a tuple (h_0, c_0) of Tensors, got {type(hx).__name__}")
        if len(hx) != 2:
            raise ValueError(f"ConvLSTM: hx must be a tuple (h_0, c_0) of two Tensors, got {len(hx)} items")
        for name, state in zip(("h_0", "c_0"), hx):
            if not isinstance(state, Tensor):
                raise TypeError(f"ConvLSTM: hx's {name} must be a Tensor, got {type(state).__name__}")
            if tuple(state.shape) != shape:
                raise ValueError(
                    f"ConvLSTM: {name} must have shape [L, B, C, H, W] = {shape}, got {tuple(state.shape)} "
                    "(no broadcasting)"
                )
            if state.dtype != input.dtype or state.device != input.device:
                raise ValueError(
                    f"ConvLSTM: {name} ({state.dtype}, {state.device}) must have the input's dtype and device "
                    f"({input.dtype}, {input.device})"
                )
        return hx[0], hx[1]

    def forward(
        self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Run all layers over the whole sequence.

        :param input: [T, B, Ci, H, W] ([B, T, Ci, H, W] if ``batch_first``).
        :param hx: ``(h_0, c_0)``, each [L, B, C, H, W], or None (zeros).
        :returns: ``(output, (h_n, c_n))``: output [T, B, C, H, W] ([B, T, C, H, W] if
            ``batch_first``), the last layer's h_1 .. h_T; h_n and c_n [L, B, C, H, W], every
            layer's state after step T. With T = 0 (or B, H or W = 0) nothing runs: output
            is empty and (h_n, c_n) are copies of (h_0, c_0).
        :raises ValueError: for a wrong rank, channel count or spatial size (with
            ``peephole``), h_0/c_0 of another shape, or a dtype or device other than the
            parameters'.
        :raises TypeError: if ``hx`` is not a pair of Tensors.
        """
        self._check_input(input)
        x = input.transpose(0, 1) if self.batch_first else input  # [T, B, Ci, H, W]
        _, B, _, H, W = x.shape
        L, C = self.num_layers, self.hidden_channels
        # hx None: the op starts every layer from zeros.
        h0, c0 = (None, None) if hx is None else self._check_hx(hx, x, (L, B, C, H, W))

        # One op call per layer runs the whole sequence (with T, B, H or W = 0 the op runs
        # nothing and passes the state through).
        h_n: list[Tensor] = []
        c_n: list[Tensor] = []
        output = x
        for k in range(L):
            w_ih, w_hh, b_ih, b_hh, peep = self._layer_weights(k)
            h0_k = None if h0 is None else h0[k]
            c0_k = None if c0 is None else c0[k]
            output, (h, c) = convlstm(output, h0_k, c0_k, w_ih, w_hh, b_ih, b_hh, peep)
            h_n.append(h)
            c_n.append(c)

        if self.batch_first:
            output = output.transpose(0, 1)
        if L == 1:  # the op's h_T and c_T are fresh tensors: a view saves a copy each (~30 us on a GPU)
            return output, (h_n[0].unsqueeze(0), c_n[0].unsqueeze(0))
        return output, (torch.stack(h_n, 0), torch.stack(c_n, 0))

    @torch.no_grad()
    def load_concat_conv_weights(self, layer: int, weight: Tensor, bias: Tensor | None = None) -> None:
        """Load layer ``layer``'s weights from the single-convolution layout of the popular
        ConvLSTM implementations, which convolve ``cat([x, h], dim=1)`` with one kernel and
        split the result as ``i, f, o, g = torch.split(z, C, dim=1)``.

        Sets ``weight_ih_l{layer}`` = weight[:, :Cin] and ``weight_hh_l{layer}`` =
        weight[:, Cin:], ``bias_ih_l{layer}`` = bias (zeros if None) and
        ``bias_hh_l{layer}`` = zeros, each with its gate blocks reordered from (i, f, o, g)
        to (i, f, g, o). Values are copied into the existing parameters (cast to their dtype
        and device), so optimizers holding them keep working; peephole weights are left
        as they are.

        :param layer: the layer index k, 0 <= k < L.
        :param weight: [G, Cin_k + C, KH, KW], gate blocks ordered i, f, o, g.
        :param bias: [G] in the same gate order, or None.
        :raises ValueError: for a bad layer index or shape, or a bias given to a module
            built with ``bias=False``.
        """
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.num_layers:
            raise ValueError(f"ConvLSTM: layer must be an int in [0, {self.num_layers}), got {layer!r}")
        C = self.hidden_channels
        cin = self.input_channels if layer == 0 else C
        expected = (4 * C, cin + C, *self.kernel_size)
        if not isinstance(weight, Tensor) or tuple(weight.shape) != expected:
            got = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
            raise ValueError(
                f"ConvLSTM: weight for layer {layer} must have shape [G, Cin + C, KH, KW] = {expected}, got {got}"
            )
        if bias is not None:
            if not self.bias:
                raise ValueError("ConvLSTM: a bias was given but the module was built with bias=False")
            if not isinstance(bias, Tensor) or tuple(bias.shape) != (4 * C,):
                got = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
                raise ValueError(f"ConvLSTM: bias for layer {layer} must have shape [G] = {(4 * C,)}, got {got}")

        def reorder(t: Tensor) -> Tensor:
            i, f, o, g = t.split(C, dim=0)  # the concat layout's gate order
            return torch.cat([i, f, g, o], dim=0)

        w = reorder(weight)
        getattr(self, f"weight_ih_l{layer}").copy_(w[:, :cin])
        getattr(self, f"weight_hh_l{layer}").copy_(w[:, cin:])
        if self.bias:
            b_ih = getattr(self, f"bias_ih_l{layer}")
            if bias is None:
                b_ih.zero_()
            else:
                b_ih.copy_(reorder(bias))
            # The concat layout has one bias: all of it goes to bias_ih.
            getattr(self, f"bias_hh_l{layer}").zero_()

    def extra_repr(self) -> str:
        s = f"{self.input_channels}, {self.hidden_channels}, kernel_size={self.kernel_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.peephole:
            s += ", peephole=True"
        if self.spatial_size is not None:
            s += f", spatial_size={self.spatial_size}"
        return s
