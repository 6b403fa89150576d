"""The ops under torch.func transforms and forward-mode AD, for the three cells.

torch.func.grad, vjp and jacrev differentiate through each op's backward; vmap runs the
forward ops through their vmap rules (the samples folded into the batch) and the backward ops
one sample at a time (PyTorch's batching fallback); jvp and
forward-mode AD have no formula and must raise, never return a zero tangent (they did through
the ops' torch.library kernels before). Expected values come from the pure-PyTorch references
in seqkernels.reference under the same transform, in float64.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.nn.utils.rnn import PackedSequence
from torch.func import functional_call, grad, jacrev, jvp, vjp, vmap

import seqkernels
from seqkernels.ops.convlstm import convlstm
from seqkernels.ops.convrnn import convrnn
from seqkernels.reference import convlstm_reference, convrnn_reference, lstm_reference

TOL = dict(rtol=1e-10, atol=1e-12)  # float64 against float64


@pytest.fixture(autouse=True)
def _quiet_batching_fallback():
    # vmap warns that the ops run through the per-sample batching fallback.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*batching rule.*")
        yield


def _lstm_pair(device, bidirectional: bool = False, num_layers: int = 1):
    torch.manual_seed(0)
    module = seqkernels.LSTM(3, 5, num_layers=num_layers, bidirectional=bidirectional, dtype=torch.float64,
                             device=device)
    flags = dict(num_layers=num_layers, bidirectional=bidirectional)

    def reference(params: dict, x, hx=None):
        flat = [params[name] for name in module._flat_weights_names]
        return lstm_reference(x, hx, flat, **flags)

    return module, reference


def _x(device, *shape):
    return torch.randn(*shape, dtype=torch.float64, device=device)


@pytest.mark.parametrize("bidirectional,num_layers", [(False, 1), (True, 2)])
def test_lstm_grad_of_input_and_parameters(device, bidirectional, num_layers):
    module, reference = _lstm_pair(device, bidirectional, num_layers)
    params = {k: v.detach() for k, v in module.named_parameters()}
    x = _x(device, 6, 4, 3)
    layers = num_layers * (2 if bidirectional else 1)
    h0, c0 = _x(device, layers, 4, 5), _x(device, layers, 4, 5)

    def loss(p, xx, h, c, fn):
        y, (h_n, c_n) = fn(p, xx, (h, c))
        return (y.sin().sum() + h_n.square().sum() + c_n.cos().sum())

    ours = grad(loss, argnums=(0, 1, 2, 3))(params, x, h0, c0, lambda p, xx, hx: functional_call(module, p, (xx, hx)))
    ref = grad(loss, argnums=(0, 1, 2, 3))(params, x, h0, c0, reference)
    for name in params:
        torch.testing.assert_close(ours[0][name], ref[0][name], **TOL, msg=lambda m: f"{name}: {m}")
    for got, want in zip(ours[1:], ref[1:]):
        torch.testing.assert_close(got, want, **TOL)


def test_lstm_per_sample_gradients_vmap_of_grad(device):
    module, reference = _lstm_pair(device)
    params = {k: v.detach() for k, v in module.named_parameters()}
    x = _x(device, 5, 3, 3)  # [T, B, I]: vmap over the batch, one sequence per sample

    def loss(p, x_b, fn):
        return fn(p, x_b.unsqueeze(1)).square().sum()

    ours = vmap(grad(loss), in_dims=(None, 1, None))(params, x, lambda p, xx: functional_call(module, p, (xx,))[0])
    for b in range(x.shape[1]):
        want = grad(loss)(params, x[:, b], lambda p, xx: reference(p, xx)[0])
        for name in params:
            torch.testing.assert_close(ours[name][b], want[name], **TOL, msg=lambda m: f"{name}, sample {b}: {m}")


def test_lstm_jacrev_vjp_and_vmap(device):
    module, reference = _lstm_pair(device)
    params = {k: v.detach() for k, v in module.named_parameters()}
    x = _x(device, 4, 2, 3)
    ours = lambda xx: functional_call(module, params, (xx,))[0]  # noqa: E731
    ref = lambda xx: reference(params, xx)[0]  # noqa: E731
    torch.testing.assert_close(jacrev(ours)(x), jacrev(ref)(x), **TOL)
    cotangent = _x(device, 4, 2, 5)
    torch.testing.assert_close(vjp(ours, x)[1](cotangent)[0], vjp(ref, x)[1](cotangent)[0], **TOL)
    xs = _x(device, 3, 4, 2, 3)
    torch.testing.assert_close(vmap(ours)(xs), torch.stack([ref(xs[i]) for i in range(3)]), **TOL)


def test_lstm_vmap_folds_samples_into_the_batch(device):
    """The forward op's vmap rule (ops/lstm.py): samples that share the weights run as one call
    (no per-sample fallback, so no fallback warning), with x, the initial state or both
    vmapped, padded or packed (ragged) input, one layer or two bidirectional ones; per-sample
    weights take one call per sample. Each output against the reference, sample by sample."""
    module, reference = _lstm_pair(device)
    params = {k: v.detach() for k, v in module.named_parameters()}
    ours = lambda xx, hx=None: functional_call(module, params, (xx, hx))  # noqa: E731
    V = 3
    xs, hs, cs = _x(device, V, 5, 2, 3), _x(device, V, 1, 2, 5), _x(device, V, 1, 2, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got_x = vmap(lambda xx: ours(xx)[0])(xs)
        got_all = vmap(lambda xx, h, c: ours(xx, (h, c)))(xs, hs, cs)
        got_h = vmap(lambda h: ours(xs[0], (h, cs[0]))[1][1])(hs)
    assert not [w for w in caught if "seqkernels::lstm_forward" in str(w.message)]
    for v in range(V):
        torch.testing.assert_close(got_x[v], reference(params, xs[v])[0], **TOL)
        y, (h_n, c_n) = reference(params, xs[v], (hs[v], cs[v]))
        torch.testing.assert_close(got_all[0][v], y, **TOL)
        torch.testing.assert_close(got_all[1][0][v], h_n, **TOL)
        torch.testing.assert_close(got_all[1][1][v], c_n, **TOL)
        torch.testing.assert_close(got_h[v], reference(params, xs[0], (hs[v], cs[0]))[1][1], **TOL)

    # Packed, ragged: the samples share batch_sizes.
    packed = torch.nn.utils.rnn.pack_sequence([_x(device, 5, 3), _x(device, 3, 3), _x(device, 2, 3)])
    datas = _x(device, V, *packed.data.shape)
    wrap = lambda d: PackedSequence(d, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices)  # noqa: E731
    got_packed = vmap(lambda d: ours(wrap(d))[0].data)(datas)
    for v in range(V):
        flat = [params[name] for name in module._flat_weights_names]
        want = lstm_reference(datas[v], None, flat, batch_sizes=packed.batch_sizes)[0]
        torch.testing.assert_close(got_packed[v], want, **TOL)

    # Per-sample weights: one call per sample.
    w_hh = _x(device, V, 20, 5) * 0.3
    got_w = vmap(lambda w, xx: functional_call(module, {**params, "weight_hh_l0": w}, (xx,))[0])(w_hh, xs)
    for v in range(V):
        torch.testing.assert_close(got_w[v], reference({**params, "weight_hh_l0": w_hh[v]}, xs[v])[0], **TOL)

    deep, deep_reference = _lstm_pair(device, bidirectional=True, num_layers=2)
    deep_params = {k: v.detach() for k, v in deep.named_parameters()}
    got_deep = vmap(lambda xx: functional_call(deep, deep_params, (xx,))[0])(xs)
    for v in range(V):
        torch.testing.assert_close(got_deep[v], deep_reference(deep_params, xs[v])[0], **TOL)


def test_lstm_forward_mode_ad_raises(device):
    module, _ = _lstm_pair(device)
    x = _x(device, 4, 2, 3)
    with pytest.raises(NotImplementedError, match="seqkernels.lstm: forward-mode AD"):
        jvp(lambda xx: module(xx)[0], (x,), (torch.ones_like(x),))
    # Parameters that do not require grad: autograd would record nothing, and the call must
    # still see the dual input.
    module.requires_grad_(False)
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="seqkernels.lstm: forward-mode AD"):
        module(fwAD.make_dual(x, torch.ones_like(x)))


def test_lstm_grad_of_grad(device):
    """torch.func.grad of torch.func.grad (the double backward's formula, run by torch.func.vjp
    inside a transform), with respect to the input and, mixed, to the parameters."""
    module, reference = _lstm_pair(device)
    params = {k: v.detach() for k, v in module.named_parameters()}
    x = _x(device, 4, 2, 3)

    def input_grad(fn):
        return grad(lambda xx, p: fn(p, xx)[0].tanh().sum())

    def ours(p, xx):
        return functional_call(module, p, (xx,))

    for fn in (ours, reference):
        assert input_grad(fn)(x, params).abs().sum() > 0
    got = grad(lambda xx: input_grad(ours)(xx, params).square().sum())(x)
    torch.testing.assert_close(got, grad(lambda xx: input_grad(reference)(xx, params).square().sum())(x), **TOL)
    got_p = grad(lambda p: input_grad(ours)(x, p).square().sum())(params)
    expected_p = grad(lambda p: input_grad(reference)(x, p).square().sum())(params)
    for name in params:
        torch.testing.assert_close(got_p[name], expected_p[name], **TOL)
    # Per sample (vmap over grad of grad): the double backward's Function under its generated rule.
    xs = _x(device, 3, 4, 2, 3)
    got_v = vmap(grad(lambda xx: input_grad(ours)(xx, params).square().sum()))(xs)
    expected_v = vmap(grad(lambda xx: input_grad(reference)(xx, params).square().sum()))(xs)
    torch.testing.assert_close(got_v, expected_v, **TOL)


def test_convrnn_grad_vmap_and_jvp(device):
    torch.manual_seed(1)
    x, weight, h0, bias = _x(device, 2, 5, 2, 7), _x(device, 2, 2, 3) * 0.5, _x(device, 2, 2, 7), _x(device, 2)

    def loss(fn, xx, w, h, b):
        y, h_T = fn(xx, w, h, b)
        return y.sin().sum() + h_T.square().sum()

    ours = grad(lambda *a: loss(convrnn, *a), argnums=(0, 1, 2, 3))(x, weight, h0, bias)
    ref = grad(lambda *a: loss(convrnn_reference, *a), argnums=(0, 1, 2, 3))(x, weight, h0, bias)
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got, want, **TOL)
    per_sample = vmap(grad(lambda w, xx: convrnn(xx.unsqueeze(0), w)[0].square().sum()), in_dims=(None, 0))(weight, x)
    for b in range(2):
        want = grad(lambda w: convrnn_reference(x[b:b + 1], w)[0].square().sum())(weight)
        torch.testing.assert_close(per_sample[b], want, **TOL)
    # The forward op's vmap rule: x and h0 vmapped (one call, no fallback warning), or per-sample
    # weights (one call per sample).
    xs, hs, ws = _x(device, 3, *x.shape), _x(device, 3, *h0.shape), _x(device, 3, *weight.shape) * 0.5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = vmap(lambda xx, h: convrnn(xx, weight, h, bias))(xs, hs)
    assert not [w for w in caught if "seqkernels::convrnn_forward" in str(w.message)]
    got_w = vmap(lambda w, xx: convrnn(xx, w, h0, bias)[0])(ws, xs)
    for v in range(3):
        want = convrnn_reference(xs[v], weight, hs[v], bias)
        torch.testing.assert_close(got[0][v], want[0], **TOL)
        torch.testing.assert_close(got[1][v], want[1], **TOL)
        torch.testing.assert_close(got_w[v], convrnn_reference(xs[v], ws[v], h0, bias)[0], **TOL)
    with pytest.raises(NotImplementedError, match="seqkernels.convrnn: forward-mode AD"):
        jvp(lambda xx: convrnn(xx, weight)[0], (x,), (torch.ones_like(x),))


def test_convlstm_grad_vmap_and_jvp(device):
    torch.manual_seed(2)
    T, B, Ci, C, H, W = 3, 2, 2, 3, 4, 5
    x, h0, c0 = _x(device, T, B, Ci, H, W), _x(device, B, C, H, W), _x(device, B, C, H, W)
    w_ih, w_hh = _x(device, 4 * C, Ci, 3, 3) * 0.3, _x(device, 4 * C, C, 3, 3) * 0.3
    b_ih, b_hh = _x(device, 4 * C), _x(device, 4 * C)

    def loss(fn, xx, wi, wh):
        y, (h_T, c_T) = fn(xx, h0, c0, wi, wh, b_ih, b_hh)
        return y.sin().sum() + h_T.square().sum() + c_T.cos().sum()

    ours = grad(lambda *a: loss(convlstm, *a), argnums=(0, 1, 2))(x, w_ih, w_hh)
    ref = grad(lambda *a: loss(convlstm_reference, *a), argnums=(0, 1, 2))(x, w_ih, w_hh)
    for got, want in zip(ours, ref):
        torch.testing.assert_close(got, want, **TOL)
    # The forward op's vmap rule: x and c0 vmapped (one call, no fallback warning), or per-sample
    # weights (one call per sample).
    xs, cs, ws = _x(device, 2, T, B, Ci, H, W), _x(device, 2, B, C, H, W), _x(device, 2, 4 * C, C, 3, 3) * 0.3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = vmap(lambda xx, c: convlstm(xx, h0, c, w_ih, w_hh, b_ih, b_hh))(xs, cs)
    assert not [w for w in caught if "seqkernels::convlstm_forward" in str(w.message)]
    got_w = vmap(lambda w, xx: convlstm(xx, h0, c0, w_ih, w, b_ih, b_hh)[0])(ws, xs)
    for v in range(2):
        y, (h_T, c_T) = convlstm_reference(xs[v], h0, cs[v], w_ih, w_hh, b_ih, b_hh)
        torch.testing.assert_close(got[0][v], y, **TOL)
        torch.testing.assert_close(got[1][0][v], h_T, **TOL)
        torch.testing.assert_close(got[1][1][v], c_T, **TOL)
        torch.testing.assert_close(got_w[v], convlstm_reference(xs[v], h0, c0, w_ih, ws[v], b_ih, b_hh)[0], **TOL)
    with pytest.raises(NotImplementedError, match="seqkernels.convlstm: forward-mode AD"):
        jvp(lambda xx: convlstm(xx, h0, c0, w_ih, w_hh, b_ih, b_hh)[0], (x,), (torch.ones_like(x),))
