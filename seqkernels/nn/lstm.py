"""nn.Module wrappers: LSTM and LSTMCell, drop-ins for torch.nn.LSTM / torch.nn.LSTMCell
that run on the seqkernels.lstm_layer op, and replace_lstm to swap them into a model.

Shape legend: T steps, B batch, I input features, H hidden, P projection (proj_size),
Hout = P or H, G = 4H gate rows (i, f, g, o), N = sum(batch_sizes) packed rows,
L layers, D directions.

LSTM derives from torch.nn.RNNBase (mode "LSTM"), not from torch.nn.LSTM: it gets
nn.LSTM's parameter names, shapes, order, initialisation and constructor validation, so
state_dicts move between the two unchanged, while torch._dynamo, which refuses to trace
torch.nn.LSTM instances, traces this one (torch.compile(fullgraph=True) works).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ..ops._autograd import records_grad, transformed
from ..ops.lstm import lstm_cell, lstm_infer, lstm_layer, lstm_padded

__all__ = ["LSTM", "LSTMCell", "replace_lstm"]


def _plain_state(hx, shape: tuple, dtype: torch.dtype) -> tuple[Tensor, Tensor] | None:
    """hx as the short paths take it: a tuple of two plain tensors of this shape and dtype; None
    for anything else (the general paths validate it and raise nn's errors)."""
    if type(hx) is not tuple or len(hx) != 2:
        return None
    h, c = hx
    if (type(h) is not Tensor or type(c) is not Tensor or h.shape != shape or c.shape != shape or h.dtype != dtype
            or c.dtype != dtype):
        return None
    return h, c


def _cell_step(input: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
               b_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    """One LSTMCell step as lstm_layer of one step: input [B, I], h0 / c0 [B, H] -> h, c [B, H]."""
    _, h, c = lstm_layer(input, torch.full((1,), input.size(0), dtype=torch.int64), h0, c0, w_ih, w_hh, b_ih, b_hh)
    return h, c


def _apply_permutation(tensor: Tensor, permutation: Tensor, dim: int = 1) -> Tensor:
    return tensor.index_select(dim, permutation)


def _autocast_dtype(t: Tensor) -> torch.dtype | None:
    """The dtype to run in under autocast: the autocast dtype of t's device when autocast
    is on there (nn.LSTM on CUDA runs cuDNN in it, packed or not), else None."""
    device_type = t.device.type
    if t.is_floating_point() and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _cast(t: Tensor | None, dtype: torch.dtype | None) -> Tensor | None:
    return t if t is None or dtype is None else t.to(dtype)


def _check_state_dtype(input: Tensor, hx: tuple[Tensor, Tensor] | list[Tensor]) -> None:
    # nn.LSTM rejects a state whose dtype differs from the input's with a RuntimeError
    # raised deep inside ATen; the op would raise TypeError. Keep nn.LSTM's type with a
    # readable message.
    for k, state in enumerate(hx):
        if state.dtype != input.dtype:
            raise RuntimeError(
                f"LSTM: hx[{k}] dtype ({state.dtype}) does not match input dtype ({input.dtype})"
            )


class LSTM(nn.RNNBase):
    r"""A multi-layer LSTM with nn.LSTM's interface, parameters and results, computed by
    seqkernels' fused kernels (the time loop runs in C++/CUDA).

    Arguments, inputs, outputs, parameter names and initialisation are exactly
    torch.nn.LSTM's: ``LSTM(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, proj_size=0, device=None,
    dtype=None)``; ``forward(input, (h_0, c_0)=None) -> (output, (h_n, c_n))`` with input
    [T, B, I] (or [B, T, I] if batch_first), unbatched [T, I], or a PackedSequence (the
    output is then a PackedSequence too). h_0/h_n are [L*D, B, Hout], c_0/c_n [L*D, B, H].

    Dropout (training mode only) applies to the output of every layer but the last, as in
    nn.LSTM; its random masks differ from nn.LSTM's (different draws), the distribution is
    the same.

    Under autocast the layer runs in the autocast dtype of the input's device, packed or
    not (as nn.LSTM does on CUDA; nn.LSTM's CPU autocast behaviour is uneven: padded input
    runs in bfloat16, packed input in float32).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__("LSTM", *args, **kwargs)

    # --- nn.LSTM's argument checks (same semantics and messages) -------------------------
    def get_expected_cell_size(self, input: Tensor, batch_sizes: Tensor | None) -> tuple[int, int, int]:
        if batch_sizes is not None:
            mini_batch = int(batch_sizes[0])
        else:
            mini_batch = input.size(0) if self.batch_first else input.size(1)
        num_directions = 2 if self.bidirectional else 1
        return (self.num_layers * num_directions, mini_batch, self.hidden_size)

    def check_forward_args(  # type: ignore[override]
        self, input: Tensor, hidden: tuple[Tensor, Tensor], batch_sizes: Tensor | None
    ) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(
            hidden[0], self.get_expected_hidden_size(input, batch_sizes), "Expected hidden[0] size {}, got {}"
        )
        self.check_hidden_size(
            hidden[1], self.get_expected_cell_size(input, batch_sizes), "Expected hidden[1] size {}, got {}"
        )

    def permute_hidden(  # type: ignore[override]
        self, hx: tuple[Tensor, Tensor], permutation: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        if permutation is None:
            return hx
        return _apply_permutation(hx[0], permutation), _apply_permutation(hx[1], permutation)

    # --- forward --------------------------------------------------------------------------
    def forward(self, input, hx=None):
        short = self._forward_short(input, hx)
        if short is not None:
            return short
        orig_input = input
        num_directions = 2 if self.bidirectional else 1
        real_hidden_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        own_state = False
        if isinstance(orig_input, PackedSequence):
            input, batch_sizes, sorted_indices, unsorted_indices = orig_input
            is_batched = True
            max_batch_size = int(batch_sizes[0])
            if hx is None:
                hx = self._zero_state(input, max_batch_size, real_hidden_size)
                self._check_packed_args(input, hx, batch_sizes)
            else:
                # nn.LSTM does not validate a packed call up front (bad calls fail inside
                # ATen with a RuntimeError); validate it, keeping the RuntimeError type.
                self._check_packed_args(input, hx, batch_sizes)
                # Each batch of the hidden state should match the input sequence that the
                # user believes they are passing in.
                hx = self.permute_hidden(hx, sorted_indices)
            x = input
        else:
            if input.dim() not in (2, 3):
                raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {input.dim()}D instead")
            is_batched = input.dim() == 3
            batch_dim = 0 if self.batch_first else 1
            if not is_batched:
                input = input.unsqueeze(batch_dim)
            max_batch_size = input.size(0) if self.batch_first else input.size(1)
            sorted_indices = None
            unsorted_indices = None
            own_state = hx is None
            if own_state:
                # The zero state has the expected sizes and dtype by construction: only the
                # input needs nn.LSTM's checks (a few microseconds of host time saved per call).
                self.check_input(input, None)
                hx = self._zero_state(input, max_batch_size, real_hidden_size)
            else:
                if is_batched:
                    if hx[0].dim() != 3 or hx[1].dim() != 3:
                        raise RuntimeError(
                            "For batched 3-D input, hx and cx should "
                            f"also be 3-D but got ({hx[0].dim()}-D, {hx[1].dim()}-D) tensors"
                        )
                else:
                    if hx[0].dim() != 2 or hx[1].dim() != 2:
                        raise RuntimeError(
                            "For unbatched 2-D input, hx and cx should "
                            f"also be 2-D but got ({hx[0].dim()}-D, {hx[1].dim()}-D) tensors"
                        )
                    hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
                self.check_forward_args(input, hx, None)
                hx = self.permute_hidden(hx, sorted_indices)
            # Padded [T, B, I] is the packed layout with batch_sizes = [B] * T.
            seq = input.transpose(0, 1) if self.batch_first else input  # [T, B, I]
            steps = seq.size(0)
            if steps == 0:
                raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
            x = seq.reshape(steps * max_batch_size, self.input_size)  # [T*B, I]
            batch_sizes = torch.full((steps,), max_batch_size, dtype=torch.int64)

        if not isinstance(hx, (tuple, list)):
            raise TypeError(f"LSTM: hx must be a tuple (h_0, c_0) of Tensors, got {type(hx).__name__}")
        if len(hx) != 2:
            raise RuntimeError("lstm expects two hidden states")
        # Under autocast, input, state and weights run in the autocast dtype (the op takes
        # one dtype); otherwise they must agree.
        cast = _autocast_dtype(x)
        if cast is None:
            if not own_state:
                _check_state_dtype(x, hx)
            h0, c0 = hx
        else:
            h0, c0 = _cast(hx[0], cast), _cast(hx[1], cast)
            x = _cast(x, cast)

        if max_batch_size == 0:
            # nn.LSTM accepts an empty batch; the op needs at least one row.
            y = x.new_zeros(x.size(0), num_directions * real_hidden_size)
            h_n, c_n = h0.clone(), c0.clone()
        else:
            y, h_n, c_n = self._run_layers(x, batch_sizes, h0, c0, cast)

        if isinstance(orig_input, PackedSequence):
            output_packed = PackedSequence(y, batch_sizes, sorted_indices, unsorted_indices)
            return output_packed, self.permute_hidden((h_n, c_n), unsorted_indices)
        output = y.view(steps, max_batch_size, y.size(1))  # [T, B, D*Hout]
        if self.batch_first:
            output = output.transpose(0, 1)
        hidden = (h_n, c_n)
        if not is_batched:
            output = output.squeeze(batch_dim)
            hidden = (h_n.squeeze(1), c_n.squeeze(1))
        return output, self.permute_hidden(hidden, unsorted_indices)

    def _forward_short(self, input, hx):
        """The common call in a few Python operations: no projection, a valid batched 3-D tensor, no
        state or a valid (h_0, c_0), no autocast, in an eager call outside torch.func transforms. Each
        layer and direction is one lstm_infer call where autograd records nothing, one lstm_padded
        node where it records. None for anything else, which the general path below handles
        (lstm_layer, which torch.compile traces and torch.func transforms; it validates, raising
        nn.LSTM's errors). On a GPU the module's Python precedes the loop's launch and adds to a small
        call's time one for one: one layer, ~20 us of host time less than the general path on a 2-core
        x86 host; stacks, 36-59 us less a training call on an H200 (fp16, the general path on
        lstm_layer's C++ node too)."""
        if (type(input) is not Tensor or self.proj_size or input.dim() != 3
                or input.size(2) != self.input_size or torch._C._is_any_autocast_enabled()
                or torch.compiler.is_compiling() or transformed()):
            return None
        if input.dtype != self._flat_weights[0].dtype:  # the weight dtype check_input compares with
            return None
        steps, batch = (input.size(1), input.size(0)) if self.batch_first else (input.size(0), input.size(1))
        if steps == 0 or batch == 0:
            return None
        layers, directions = self.num_layers, 2 if self.bidirectional else 1
        h0 = c0 = None
        if hx is not None:
            state = _plain_state(hx, (layers * directions, batch, self.hidden_size), input.dtype)
            if state is None:
                return None
            h0, c0 = state
        if layers == 1 and directions == 1:
            return self._short_layer(0, input, h0, c0, self.batch_first)
        # A stack: layer l's input is layer l-1's output, time-major ([T, B, D*H], contiguous)
        # between layers, so that dropout draws its mask over the general path's [T*B, D*H] rows (the
        # same random stream, bitwise). One direction: a batch-first module's first layer reads, and
        # its last layer writes, batch-first views (no copies: transposes of time-major tensors). Two
        # directions read one time-major copy of the input (the general path's copy) and write
        # [T, B, H] outputs that one cat joins.
        h_n: list[Tensor] = []
        c_n: list[Tensor] = []
        seq = input
        if directions == 2:
            seq = (input.transpose(0, 1) if self.batch_first else input).contiguous()
        for layer in range(layers):
            last = layer == layers - 1
            batch_first = directions == 1 and self.batch_first and (layer == 0 or last)
            layer_input = seq.transpose(0, 1) if batch_first and layer > 0 else seq
            outputs = []
            for direction in range(directions):
                k = layer * directions + direction
                state_h, state_c = (None, None) if h0 is None else (h0[k:k + 1], c0[k:k + 1])
                output, (h, c) = self._short_layer(k, layer_input, state_h, state_c, batch_first, direction == 1)
                outputs.append(output)
                h_n.append(h)
                c_n.append(c)
            if directions == 2:
                seq = torch.cat(outputs, 2)  # [T, B, 2H]
                output = seq.transpose(0, 1) if self.batch_first else seq
            else:
                output = outputs[0]
                if not last:
                    seq = output.transpose(0, 1) if batch_first else output  # [T, B, H]
            if not last and self.dropout > 0 and self.training:
                seq = F.dropout(seq, p=self.dropout, training=True)
        return output, (torch.cat(h_n), torch.cat(c_n))

    def _short_layer(self, k: int, input: Tensor, h0: Tensor | None, c0: Tensor | None, batch_first: bool,
                     reverse: bool = False) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Layer and direction k (layer * D + direction) of the short path: input [T, B, I]
        ([B, T, I] if batch_first), h0 / c0 [1, B, H] or None -> output [T, B, H] ([B, T, H]),
        (h_n, c_n) [1, B, H]; reverse runs from the last step to the first."""
        w_ih, w_hh, b_ih, b_hh, _ = self._layer_weights(k)
        if records_grad(input, h0, c0, w_ih, w_hh, b_ih, b_hh):
            # One autograd node does the rest (lstm_padded): fewer recorded operations than the
            # general path, whose host time precedes the loop's launch on a GPU.
            output, h_n, c_n = lstm_padded(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse)
        else:
            # One operator does the rest: 13-21 us of host time less than the general path on a
            # 2-core x86 host (scripts/lstm_infer_op_ab.py's method, tiny CPU calls).
            output, h_n, c_n = lstm_infer(input, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first, reverse)
        return output, (h_n, c_n)

    def _zero_state(self, input: Tensor, batch: int, real_hidden_size: int) -> tuple[Tensor, Tensor]:
        num_directions = 2 if self.bidirectional else 1
        kw = dict(dtype=input.dtype, device=input.device)
        layers = self.num_layers * num_directions
        if real_hidden_size == self.hidden_size:
            # One allocation and one fill for both (a kernel launch less on the GPU, where the
            # host's launch time is a visible share of a small call).
            zeros = torch.zeros(2, layers, batch, self.hidden_size, **kw)
            return zeros[0], zeros[1]
        h_zeros = torch.zeros(layers, batch, real_hidden_size, **kw)
        c_zeros = torch.zeros(layers, batch, self.hidden_size, **kw)
        return h_zeros, c_zeros

    def _check_packed_args(self, input: Tensor, hx, batch_sizes: Tensor) -> None:
        weight_dtype = getattr(self, self._flat_weights_names[0]).dtype
        if input.dtype != weight_dtype and _autocast_dtype(input) is None:
            # check_input's message, with the RuntimeError nn.LSTM raises for packed input.
            raise RuntimeError(
                f"RNN input dtype ({input.dtype}) does not match weight dtype ({weight_dtype}). "
                f"Convert input: input.to({weight_dtype}), or convert model: model.to({input.dtype})"
            )
        self.check_forward_args(input, hx, batch_sizes)

    def _layer_weights(
        self, k: int, cast: torch.dtype | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """Weights of layer/direction k = layer * D + direction (in `cast` if given), read by
        name so that functional_call / reparametrisation are honoured (nn.LSTM's
        _flat_weights order)."""
        names = self._all_weights[k]
        # _parameters first: nn.Module.__getattr__ is slow; a parametrised or otherwise replaced
        # weight is not there and comes from getattr.
        params = self._parameters
        w = [params.get(name) for name in names]
        w = [getattr(self, name) if t is None else t for t, name in zip(w, names)]
        if cast is not None:
            w = [_cast(t, cast) for t in w]
        b_ih, b_hh = (w[2], w[3]) if self.bias else (None, None)
        w_hr = w[-1] if self.proj_size > 0 else None
        return w[0], w[1], b_ih, b_hh, w_hr

    def _run_layers(
        self, x: Tensor, batch_sizes: Tensor, h0: Tensor, c0: Tensor, cast: torch.dtype | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [N, I] packed rows, h0 [L*D, B, Hout], c0 [L*D, B, H] -> y [N, D*Hout],
        h_n [L*D, B, Hout], c_n [L*D, B, H]; weights cast to `cast` if given (autocast)."""
        num_directions = 2 if self.bidirectional else 1
        h_n: list[Tensor] = []
        c_n: list[Tensor] = []
        layer_input = x
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(num_directions):
                k = layer * num_directions + direction
                w_ih, w_hh, b_ih, b_hh, w_hr = self._layer_weights(k, cast)
                y, h, c = lstm_layer(
                    layer_input, batch_sizes, h0[k], c0[k], w_ih, w_hh, b_ih, b_hh, w_hr, reverse=direction == 1
                )
                outputs.append(y)
                h_n.append(h)
                c_n.append(c)
            layer_output = outputs[0] if num_directions == 1 else torch.cat(outputs, dim=1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_output = F.dropout(layer_output, p=self.dropout, training=True)
            layer_input = layer_output
        if len(h_n) == 1:  # one layer, one direction: views, no copy (two launches fewer on the GPU)
            return layer_input, h_n[0].unsqueeze(0), c_n[0].unsqueeze(0)
        return layer_input, torch.stack(h_n, 0), torch.stack(c_n, 0)


class LSTMCell(nn.RNNCellBase):
    r"""A single LSTM step with nn.LSTMCell's interface and parameters (weight_ih [G, I],
    weight_hh [G, H], bias_ih/bias_hh [G]), computed by one seqkernels.lstm_layer call
    with T = 1.

    ``forward(input, (h, c)=None) -> (h', c')`` with input [B, I] or unbatched [I],
    h/c [B, H] or [H]. Under autocast it runs in the autocast dtype of the input's device
    (as nn.LSTMCell does on CUDA; on the CPU nn.LSTMCell ignores autocast).
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        fast = self._forward_short(input, hx)
        if fast is not None:
            return fast
        if input.dim() not in (1, 2):
            raise ValueError(f"LSTMCell: Expected input to be 1D or 2D, got {input.dim()}D instead")
        if hx is not None:
            for idx, value in enumerate(hx):
                if value.dim() not in (1, 2):
                    raise ValueError(f"LSTMCell: Expected hx[{idx}] to be 1D or 2D, got {value.dim()}D instead")
        is_batched = input.dim() == 2
        if not is_batched:
            input = input.unsqueeze(0)

        if hx is None:
            zeros = torch.zeros(input.size(0), self.hidden_size, dtype=input.dtype, device=input.device)
            hx = (zeros, zeros)
        else:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0)) if not is_batched else hx
        cast = _autocast_dtype(input)
        self._check_forward_args(input, hx, check_dtypes=cast is None)
        input, h0, c0 = _cast(input, cast), _cast(hx[0], cast), _cast(hx[1], cast)

        batch = input.size(0)
        if batch == 0 or self.hidden_size == 0:
            # nn.LSTMCell accepts empty batches; the op needs at least one row.
            h, c = h0 * 0, c0 * 0  # zero, but connected to hx's graph like nn's
        else:
            h, c = _cell_step(input, h0, c0, _cast(self.weight_ih, cast), _cast(self.weight_hh, cast),
                              _cast(self.bias_ih, cast), _cast(self.bias_hh, cast))
        if not is_batched:
            h, c = h.squeeze(0), c.squeeze(0)
        return h, c

    def _forward_short(self, input, hx):
        """The common call (a batched 2-D input of the weights' dtype, no state or a valid (h, c)
        tuple, no autocast) without the checks of the path below: in an eager call one lstm_cell
        operator (a C++ autograd node where autograd records), else (torch.compile, torch.func
        transforms) that path's lstm_layer call. None for anything else, which the path below
        handles (and validates, raising nn.LSTMCell's errors). A cell runs one step a call, so its
        host time is most of a small call: 12-18 us less a call than the path below on a 2-core x86
        host (B = 4, H = 32, no_grad)."""
        if (type(input) is not Tensor or input.dim() != 2 or input.size(0) == 0 or input.size(1) != self.input_size
                or self.hidden_size == 0 or torch._C._is_any_autocast_enabled()):
            return None
        w_ih, w_hh, b_ih, b_hh = self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh
        if input.dtype != w_ih.dtype:
            return None
        h0 = c0 = None
        if hx is not None:
            state = _plain_state(hx, (input.size(0), self.hidden_size), input.dtype)
            if state is None:
                return None
            h0, c0 = state
        if torch.compiler.is_compiling() or transformed():
            # torch.compile or a torch.func transform traces: the path below's lstm_layer call,
            # without its checks (those above cover them).
            if h0 is None:
                h0 = c0 = torch.zeros(input.size(0), self.hidden_size, dtype=input.dtype, device=input.device)
            return _cell_step(input, h0, c0, w_ih, w_hh, b_ih, b_hh)
        # One lstm_cell operator: where autograd records, its C++ node (no Python in its forward or
        # backward), with the same op calls as lstm_layer's step; else below autograd.
        return lstm_cell(input, h0, c0, w_ih, w_hh, b_ih, b_hh)

    def _check_forward_args(self, input: Tensor, hx, check_dtypes: bool = True) -> None:
        # The checks (order, types and messages) of ATen's lstm_cell, which nn.LSTMCell
        # reaches; the op's own checks would raise with other messages (and TypeError for
        # dtypes, where nn.LSTMCell raises RuntimeError).
        if not isinstance(hx, (tuple, list)):
            raise TypeError(
                f"lstm_cell(): argument 'hx' (position 2) must be tuple of Tensors, not {type(hx).__name__}"
            )
        if len(hx) != 2:
            raise RuntimeError("lstm_cell expects two hidden states")
        if input.size(1) != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.size(1)} expected {self.input_size}")
        for k, state in enumerate(hx):
            if input.size(0) != state.size(0):
                raise RuntimeError(
                    f"Input batch size {input.size(0)} doesn't match hidden{k} batch size {state.size(0)}"
                )
            if state.size(1) != self.hidden_size:
                raise RuntimeError(
                    f"hidden{k} has inconsistent hidden_size: got {state.size(1)}, expected {self.hidden_size}"
                )
        for name, t in (("input", input), ("hx[0]", hx[0]), ("hx[1]", hx[1])):
            if check_dtypes and t.dtype != self.weight_ih.dtype:
                raise RuntimeError(
                    f"LSTMCell: {name} dtype ({t.dtype}) does not match weight dtype ({self.weight_ih.dtype})"
                )


def _converted(module: nn.Module) -> nn.Module:
    """The seqkernels twin of an nn.LSTM / nn.LSTMCell: same config, device, dtype,
    weights (copied through the state dict), requires_grad flags and training mode."""
    first = next(module.parameters())
    factory = dict(device=first.device, dtype=first.dtype)
    if type(module) is nn.LSTM:
        with warnings.catch_warnings():
            # The single-layer-with-dropout warning was already given for the original.
            warnings.simplefilter("ignore", UserWarning)
            new: nn.Module = LSTM(
                module.input_size,
                module.hidden_size,
                num_layers=module.num_layers,
                bias=module.bias,
                batch_first=module.batch_first,
                dropout=module.dropout,
                bidirectional=module.bidirectional,
                proj_size=module.proj_size,
                **factory,
            )
    else:
        new = LSTMCell(module.input_size, module.hidden_size, bias=module.bias, **factory)
    new.load_state_dict(module.state_dict())
    old_params = dict(module.named_parameters())
    for name, p in new.named_parameters():
        p.requires_grad_(old_params[name].requires_grad)
    new.train(module.training)
    return new


def _replaceable(module: nn.Module) -> bool:
    # Exact types only: a subclass of nn.LSTM may override forward, which we would drop.
    return type(module) in (nn.LSTM, nn.LSTMCell)


def replace_lstm(model: nn.Module) -> nn.Module:
    """Replace every torch.nn.LSTM and torch.nn.LSTMCell in ``model`` (recursively, in
    place) with seqkernels.LSTM / seqkernels.LSTMCell of identical configuration, device,
    dtype, weights and training mode; returns the model. If ``model`` itself is an
    nn.LSTM or nn.LSTMCell, its replacement is returned. A module shared at several places
    is replaced by one shared module. Hooks registered on a replaced module are not
    carried over; subclasses of nn.LSTM / nn.LSTMCell are left alone.
    """
    memo: dict[int, nn.Module] = {}

    def convert(module: nn.Module) -> nn.Module:
        if id(module) not in memo:
            memo[id(module)] = _converted(module)
        return memo[id(module)]

    if _replaceable(model):
        return convert(model)
    visited: set[int] = set()

    def visit(parent: nn.Module) -> None:
        if id(parent) in visited:
            return
        visited.add(id(parent))
        # _modules, not named_children(): the latter yields a shared module only once.
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if _replaceable(child):
                setattr(parent, name, convert(child))
            else:
                visit(child)

    visit(model)
    return model
