"""nn.Module wrapper of the circulant ("wave") ConvRNN: seqkernels.ConvRNN.

Shape legend: B batch, T steps, C channels, N ring size, K kernel width.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..ops.convrnn import NONLINEARITIES, PADDING_MODES, convrnn

__all__ = ["ConvRNN"]


class ConvRNN(nn.Module):
    """A convolutional RNN on a ring of N units with C channels, the whole sequence in one
    fused seqkernels op::

        h_t = act(x_t + conv(h_{t-1}) + bias)

    where conv is ``torch.nn.functional.conv1d`` (cross-correlation, C -> C channels, width
    K = ``kernel_size``) of the state padded with K // 2 values on the left and
    K - 1 - K // 2 on the right, so the ring keeps N units for every K: around the ring
    (``padding_mode="circular"``, needs K <= N) or with zeros (``"zeros"``). ``act`` is
    ``"tanh"`` or ``"relu"``. The input enters the state directly (no input weight): x has
    the state's shape.

    Args:
        channels: C.
        kernel_size: K, >= 1.
        padding_mode: ``"circular"`` (default) or ``"zeros"``.
        nonlinearity: ``"tanh"`` (default) or ``"relu"``.
        bias: learn a per-channel bias ``bias`` [C] (default True).
        batch_first: x and y are [B, T, C, N] (default True) or [T, B, C, N]; h0 and h_T
            are [B, C, N] either way.
        init: ``"default"``: conv1d's initialisation, weight and bias
            ~ U(-1/sqrt(C*K), 1/sqrt(C*K)) (``kaiming_uniform_(a=sqrt(5))``, as
            ``nn.Conv1d.reset_parameters``). ``"shift"``: the wave RNN's initialisation,
            each channel a pure shift of its own ring by one unit per step
            (``weight[c, c, K//2 - 1] = 1``, everything else and the bias 0: with
            ``h_t = act(x_t + h_{t-1}[n - 1])`` activity travels around the ring); needs
            K >= 2.
        device, dtype: of the parameters.

    Parameters: ``weight`` [C, C, K] (out channel, in channel, k), ``bias`` [C] (or None).

    forward(x, h0=None) -> (y, h_T): x [B, T, C, N] ([T, B, C, N] if not batch_first),
    h0 [B, C, N] or None (zeros); y has x's layout and holds h_1 .. h_T, h_T [B, C, N].
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int,
        padding_mode: str = "circular",
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = True,
        device=None,
        dtype=None,
        init: str = "default",
    ) -> None:
        super().__init__()
        for name, value in (("channels", channels), ("kernel_size", kernel_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ConvRNN: {name} must be a positive int, got {value!r}")
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"ConvRNN: padding_mode must be one of {sorted(PADDING_MODES)}, got {padding_mode!r}")
        if nonlinearity not in NONLINEARITIES:
            raise ValueError(f"ConvRNN: nonlinearity must be one of {sorted(NONLINEARITIES)}, got {nonlinearity!r}")
        if init not in ("default", "shift"):
            raise ValueError(f"ConvRNN: init must be 'default' or 'shift', got {init!r}")
        if init == "shift" and kernel_size < 2:
            raise ValueError("ConvRNN: init='shift' needs kernel_size >= 2")
        factory = {"device": device, "dtype": dtype}
        self.channels = channels
        self.kernel_size = kernel_size
        self.padding_mode = padding_mode
        self.nonlinearity = nonlinearity
        self.batch_first = batch_first
        self.init = init
        self.weight = nn.Parameter(torch.empty(channels, channels, kernel_size, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(channels, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Initialise ``weight`` and ``bias`` as described by ``init`` (class docstring)."""
        if self.init == "shift":
            with torch.no_grad():
                self.weight.zero_()
                idx = torch.arange(self.channels, device=self.weight.device)
                # out[n] = sum_k w[k] h[n + k - K//2]: k = K//2 - 1 reads h[n - 1].
                self.weight[idx, idx, self.kernel_size // 2 - 1] = 1.0
                if self.bias is not None:
                    self.bias.zero_()
            return
        # nn.Conv1d.reset_parameters: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = C * K.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.channels * self.kernel_size)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if x.dim() != 4:
            layout = "[B, T, C, N]" if self.batch_first else "[T, B, C, N]"
            raise ValueError(f"ConvRNN: x must be 4-D {layout}, got shape {tuple(x.shape)}")
        if not self.batch_first:
            x = x.transpose(0, 1)
        y, h_T = convrnn(x, self.weight, h0, self.bias, self.padding_mode, self.nonlinearity)
        if not self.batch_first:
            y = y.transpose(0, 1)
        return y, h_T

    def extra_repr(self) -> str:
        s = f"{self.channels}, kernel_size={self.kernel_size}, padding_mode={self.padding_mode!r}"
        s += f", nonlinearity={self.nonlinearity!r}"
        if self.bias is None:
            s += ", bias=False"
        if not self.batch_first:
            s += ", batch_first=False"
        if self.init != "default":
            s += f", init={self.init!r}"
        return s
